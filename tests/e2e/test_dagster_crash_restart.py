"""A streaming run whose worker is killed is restarted by the keep-alive sensor, under ``dagster dev``.

``dagster dev`` (its daemon running, the shipped ``dagster.yaml`` in a temporary DAGSTER_HOME)
runs the example ``clicks-per-minute`` pipeline (``processing_time``, PostgreSQL target) with its
keep-alive sensor on. Once the run has consumed input, its run worker gets ``kill -9``. Then:

* the code server marks the run FAILURE;
* the step process, now an orphan, notices that its parent is gone, stops at a batch boundary,
  releases the lease and exits, with its Spark JVM;
* run monitoring frees the pool slot the dead run still claimed (``free_slots_after_run_end_seconds``);
* the sensor's next run starts within a bounded time and resumes from the state store;
* the PostgreSQL target ends equal to the pandas ground truth (nothing lost, nothing twice);
* the batches the orphan committed and never reported are reported by the next run: after the
  next run's terminate, the rows read and the data version Dagster shows equal the store's, and
  ``dagster/row_count`` equals the table's size.

The same server shows the health checks on time (a 20 s lag bound, evaluated every 5 s): late rows
in a batch that writes nothing fail ``late_row_ratio`` without waiting for a materialization; fresh
clicks bring the watermark near now (the lag check passes), then the input stops and
``watermark_lag`` fails with a lag within its bound plus one interval, as the asset's checks tab
shows in headless Chromium; after Terminate both failed checks still read failed.

To keep it short, only intervals are shortened: the keep-alive sensor's interval and backoff
(``EMATIX_KEEP_ALIVE_*_S``) and run monitoring's ``poll_interval_seconds`` (5 s instead of 30 s);
everything else is the shipped configuration.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timezone

import psutil
import pytest

from ematix_dagster.spec import StateStoreConfig
from ematix_dagster.stores import make_store
from tests.dagster_graphql import (
    assert_reads_as_a_cancel,
    asset_events,
    check_executions,
    check_statuses,
    claimed_slots,
    event_pid,
    materializations,
    pipeline_runs,
    run_events,
    run_status,
    set_sensor,
    terminate,
)
from tests.dagster_support import (
    CLICKS_PIPELINE,
    CLICKS_POOL,
    CLICKS_SENSOR,
    CLICKS_TABLE,
    LIVE_USER,
    Dagit,
    clicks_ground_truth,
    clicks_target,
    dagster_dev_env,
    drop_clicks_target,
    late_clicks,
    live_clicks,
    wait_for,
    write_click_file,
    write_click_inputs,
)
from tests.e2e.browser import Browser

pytestmark = pytest.mark.slow

WORKER_PID = r"Executing steps using multiprocess executor: parent process \(pid: (\d+)\)"
RESTART_BOUND_S = 150  # kill -9 -> the sensor's next run STARTED
MAX_LAG_S, CHECK_INTERVAL_S = 20, 5  # the lag check's bound and how often a running step evaluates it
CLICKS_KEY = ["public", "user_clicks_1min"]


CHECK_OUTPUTS = ("_checkpoint_consistency", "_idempotent_target", "_late_row_ratio", "_watermark_lag")


def lease_holder(tmp_path) -> str | None:
    store = make_store(StateStoreConfig(kind="sqlite", path=str(tmp_path / ".ematix" / "state.db")))
    store.open()
    try:
        return store.lease_holder(CLICKS_PIPELINE)
    finally:
        store.close()


def stored_record(tmp_path):
    store = make_store(StateStoreConfig(kind="sqlite", path=str(tmp_path / ".ematix" / "state.db")))
    store.open()
    try:
        return store.load(CLICKS_PIPELINE, groups=False).record
    finally:
        store.close()


def table_size(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {CLICKS_TABLE}").fetchone()[0])


def without_live_rows(target: dict) -> dict:
    """The target less the rows the fresh clicks closed (``LIVE_USER``'s and the closing event's)."""
    return {key: value for key, value in target.items() if key[1] not in (LIVE_USER, 99)}


def lag_failure_after_a_pass(dagit: Dagit) -> dict | None:
    """The first failed ``watermark_lag`` evaluation after the latest passed one (None: not yet)."""
    history = check_executions(dagit, CLICKS_KEY, "watermark_lag")  # newest first
    passed = next((i for i, e in enumerate(history) if e["status"] == "SUCCEEDED"), None)
    if passed is None or passed == 0 or history[passed - 1]["status"] != "FAILED":
        return None
    return history[passed - 1]


def checks_tab(dagit: Dagit, screenshots) -> dict[str, str]:
    """The asset's checks tab in headless Chromium: check name -> the status shown beside it."""
    browser = Browser(f"http://127.0.0.1:{dagit.port}", screenshots)
    try:
        lines = browser.open("/assets/public/user_clicks_1min?view=checks", expect="watermark_lag",
                             shot="checks-after-stall").split("\n")
        return {name: lines[lines.index(name) + 1] for name in ("late_row_ratio", "watermark_lag")}
    finally:
        browser.close()


def started_run(dagit: Dagit, exclude: set[str]) -> str | None:
    for run in pipeline_runs(dagit, CLICKS_PIPELINE):
        if run["run_id"] not in exclude and run["status"] == "STARTED":
            return run["run_id"]
    return None


def run_tags(dagit: Dagit, run_id: str) -> dict[str, str]:
    return next(r["tags"] for r in pipeline_runs(dagit, CLICKS_PIPELINE) if r["run_id"] == run_id)


def step_process(worker: psutil.Process) -> psutil.Process | None:
    """The worker's child that runs the step: the one with a Spark JVM under it."""
    for child in worker.children():
        try:
            if any("java" in (p.name() or "") for p in child.children(recursive=True)):
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def test_a_killed_run_worker_is_replaced_and_its_orphan_stops(tmp_path, pg_dsn):
    started = time.monotonic()
    drop_clicks_target(pg_dsn)
    data = tmp_path / ".ematix" / "data" / "clicks"
    events = write_click_inputs(data, range(6))  # the closing event comes after the crash
    env = dagster_dev_env(tmp_path, pg_dsn, instance_overrides={"run_monitoring": {"poll_interval_seconds": 5}},
                          extra_env={"EMATIX_KEEP_ALIVE_INTERVAL_S": "5", "EMATIX_KEEP_ALIVE_BACKOFF_S": "5",
                                     "EMATIX_MAX_WATERMARK_LAG_S": str(MAX_LAG_S),
                                     "EMATIX_CHECK_INTERVAL_S": str(CHECK_INTERVAL_S)})
    dagit = Dagit(tmp_path, env)
    timings: dict[str, float] = {}
    try:
        dagit.wait_ready()
        set_sensor(dagit, CLICKS_SENSOR, True)
        first = wait_for(lambda: started_run(dagit, set()), 120, "the keep-alive sensor's first run")
        wait_for(lambda: any(e["__typename"] in ("ObservationEvent", "MaterializationEvent")
                             for e in run_events(dagit, first)), 240, "the first run to consume input")
        # the run worker: a process the code server spawned (no run id in its command line); its pid is in
        # the run's log
        worker_pid = event_pid(dagit, first, WORKER_PID)
        assert worker_pid is not None
        worker = psutil.Process(worker_pid)
        step = wait_for(lambda: step_process(worker), 60, "the step process and its JVM")
        orphan_tree = [step, *step.children(recursive=True)]
        assert claimed_slots(dagit, CLICKS_POOL) == [first]

        os.kill(worker_pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: run_status(dagit, first) == "FAILURE", 60, "the crashed run to be marked FAILURE", step=0.5)
        timings["marked FAILURE"] = time.monotonic() - killed

        # the orphaned step stops itself (and its JVM) and gives the lease back
        _, alive = psutil.wait_procs(orphan_tree, timeout=90)
        assert alive == [], f"orphaned step processes still running: {alive}"
        timings["orphan gone"] = time.monotonic() - killed
        holder = lease_holder(tmp_path)  # free, or already the next run's
        assert holder is None or f"dagster:{first}" not in holder, holder
        messages = [e.get("message") or "" for e in run_events(dagit, first)]
        assert any(f"its run worker (pid {worker_pid}) is gone" in m for m in messages), messages[-10:]
        # the orphan said why it stopped and wrote nothing else into the FAILED run: no asset output (the
        # check results it yielded when it started are outputs of their own), no step end, no closing
        # materialization (which would have become the asset's latest)
        logged = dagit.query("""query($runId: ID!) { runOrError(runId: $runId) { ... on Run {
            eventConnection(afterCursor: null) { events { __typename
                ... on ExecutionStepOutputEvent { outputName } } } } } }""", {"runId": first})
        logged = logged["runOrError"]["eventConnection"]["events"]
        outputs = [e["outputName"] for e in logged if e["__typename"] == "ExecutionStepOutputEvent"]
        assert outputs and all(name.endswith(CHECK_OUTPUTS) for name in outputs), outputs
        types = {e["__typename"] for e in logged}
        assert not types & {"HandledOutputEvent", "ExecutionStepSuccessEvent", "ExecutionStepFailureEvent"}, types
        assert not any(entry["label"] == "run_batches" for m in materializations(dagit, first)
                       for entry in m["metadataEntries"])

        write_click_file(data, 6)  # closes every window (its own is never expected in the target)
        second = wait_for(lambda: started_run(dagit, {first}), RESTART_BOUND_S, "the sensor's next run to start")
        timings["next run STARTED"] = time.monotonic() - killed
        assert first not in claimed_slots(dagit, CLICKS_POOL)  # run monitoring freed the dead run's slot
        runs = {r["run_id"]: r for r in pipeline_runs(dagit, CLICKS_PIPELINE)}
        assert runs[second]["tags"].get("ematix/launched_by") == "keep_alive_sensor"

        expected = clicks_ground_truth(events)
        wait_for(lambda: clicks_target(pg_dsn) == expected or None, 240, "the target to hold every closed window")
        messages = [e.get("message") or "" for e in run_events(dagit, second)]
        assert any("resuming from SQLite state store" in m for m in messages), messages[:20]

        # health on time: late rows in a batch that writes nothing fail late_row_ratio within an interval
        write_click_file(data, 7, late_clicks())
        wait_for(lambda: check_statuses(dagit, CLICKS_KEY)["late_row_ratio"][0] == "FAILED" or None,
                 60, "late_row_ratio to fail without a materialization")
        # fresh clicks: the lag check passes; then the input stops, and the lag check fails within bound + interval
        write_click_file(data, 8, live_clicks(datetime.now(timezone.utc)))
        stalled = wait_for(lambda: lag_failure_after_a_pass(dagit), 90, "watermark_lag to pass, then fail")
        lag = stalled["evaluation"]["values"]["watermark_lag_seconds"]
        assert MAX_LAG_S < lag <= MAX_LAG_S + CHECK_INTERVAL_S + 3, stalled  # 3 s: a batch's and an evaluation's own time
        assert checks_tab(dagit, tmp_path / "screenshots") == {"late_row_ratio": "Failed", "watermark_lag": "Failed"}
        assert without_live_rows(clicks_target(pg_dsn)) == expected

        set_sensor(dagit, CLICKS_SENSOR, False)
        terminate(dagit, second)
        assert_reads_as_a_cancel(dagit, second)
        assert without_live_rows(clicks_target(pg_dsn)) == expected
        assert lease_holder(tmp_path) is None
        # the failed checks stand for the run's final materialization
        wait_for(lambda: {name: status for name, (status, _) in check_statuses(dagit, CLICKS_KEY).items()
                          if name in ("late_row_ratio", "watermark_lag")} == {"late_row_ratio": "FAILED",
                                                                              "watermark_lag": "FAILED"} or None,
                 30, f"the failed checks after Terminate: {check_statuses(dagit, CLICKS_KEY)}")
        # every committed batch reported once: rows read, data version and table size as the store and target say
        reported = asset_events(dagit, CLICKS_KEY)
        record = stored_record(tmp_path)
        stored_rows = sum(n for name, n in record.counters.items() if name.startswith("rows_consumed:"))
        assert sum(e["metadata"].get("rows_in") or 0 for e in reported) == stored_rows
        latest = next(e for e in reported if e["kind"] == "materialization")
        assert latest["tags"]["dagster/data_version"].startswith(f"batch {record.last_batch_id},"), latest["tags"]
        assert latest["metadata"]["dagster/row_count"] == table_size(pg_dsn)
        caught_up = [e["metadata"]["batches"] for e in reported if "by an earlier run" in e["description"]]
        print(f"reported: {len(reported)} events, {stored_rows} rows; batches the next run reported for the "
              f"orphan: {caught_up}")
        assert claimed_slots(dagit, CLICKS_POOL) == []
        # no step classified the crash: the failure sensor has tagged it (transient, what Dagster saw) by now
        wait_for(lambda: run_tags(dagit, first).get("ematix/failure"), 90, "the failure sensor to tag the crashed run")
        timings["failure tagged (checked)"] = time.monotonic() - killed
        tags = run_tags(dagit, first)
        assert tags["ematix/failure"] == "transient" and tags["ematix/error"], tags
    finally:
        dagit.stop()
        print(f"crash restart timings (s after kill -9): {timings}; whole test {time.monotonic() - started:.0f} s")
    assert dagit.members() == [], "run workers or JVMs outlived dagster dev"
