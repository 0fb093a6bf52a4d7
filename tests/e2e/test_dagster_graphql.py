"""The example code location under a real ``dagster dev``, driven through Dagster's GraphQL API.

The test starts ``dagster dev`` on 127.0.0.1 (a free port, a temporary DAGSTER_HOME, its own
process group) on a copy of ``pipelines/`` (the workspace's working directory comes first on the
code server's path), finds every example asset, sensor, job and schedule by name and the lineage
from the inputs to the pipelines, launches the ``processing_time`` clicks pipeline over bounded
input plus a closing event, waits for per-batch materializations (with their versions and
metadata) and for the asset's checks (evaluated by its own step: never "Running", lag and late rows
reported while it runs), looks at the UI in headless Chromium (the lineage graph with its edges, the
asset's columns, plots and checks, the run's page; screenshots under the test's directory), edits the pipeline's TOML and reloads the location (the running asset turns STALE),
terminates the run (it must reach CANCELED within 60 s and read as a cancel: no retry request, no
step failure), launches it again (the new spec: FRESH once it ran), terminates it once its pipeline
runs (the first run may have written every window already) and checks that the Postgres target
equals a pandas ground truth: nothing lost, nothing counted twice. Last, Dagster's backfill launcher
backfills two days of the partitioned backfill asset the stream has passed, the second the day of
the sample clicks: one run, both partitions materialized with what the backfill did, the day's
windows rewritten (more than 0) with the values they had. Last, a pipeline whose
store and checkpoint disagree is launched: its blocking checkpoint check fails and stops the start
with its explanation.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ematix_dagster.dagster.checks import DEFAULT_CHECK_INTERVAL_SECONDS
from ematix_dagster.spec import StateStoreConfig, load_pipeline
from tests.dagster_graphql import (
    assert_reads_as_a_cancel,
    asset_nodes,
    check_executions,
    check_statuses,
    materialization_tags,
    materializations,
    run_events,
    run_status,
    terminate,
)
from tests.dagster_support import (
    CLICKS_JOB,
    CLICKS_OP,
    LOCATION,
    ROOT,
    Dagit,
    clicks_ground_truth,
    clicks_target,
    commit_state,
    dagster_dev_env,
    drop_clicks_target,
    wait_for,
    write_click_inputs,
)
from tests.e2e.browser import Browser

CLICKS = "public/user_clicks_1min"
CLICKS_INPUT = "files/ematix/data/clicks"
BACKFILL = "public/user_clicks_1min-backfill"
SESSIONS = "ematix/user-sessions"


def browse(dagit: Dagit, screenshots: Path, run_id: str) -> None:
    """The UI in headless Chromium while the clicks pipeline runs: the lineage graph, the asset's page
    (columns, plots, checks) and the run's page; a screenshot of each under ``screenshots``."""
    browser = Browser(f"http://127.0.0.1:{dagit.port}", screenshots)
    try:
        graph = browser.open("/asset-groups", expect="user_clicks_1min", shot="asset-graph").split("\n")
        assert {"clicks", "clicks-hopping-5min", "user-sessions", "revenue-per-channel", "orders-web"} <= set(graph)
        # the edges: the clicks input feeds six assets, the orders inputs one each, payments one
        assert browser.count("svg path[marker-end]", at_least=6) >= 6
        asset = browser.open("/assets/public/user_clicks_1min", expect="Columns", shot="asset").split("\n")
        assert {"window_start", "window_end", "user_id", "clicks", "amount_sum", "unique_pages"} <= set(asset)
        browser.click("Plots")
        assert browser.count("canvas", at_least=3) >= 3  # the per-batch metadata series as plots
        browser.shot("asset-plots")
        checks = browser.open("/assets/public/user_clicks_1min?view=checks", expect="Failed",
                              shot="asset-checks").split("\n")
        statuses = {name: checks[checks.index(name) + 1] for name in
                    ("checkpoint_consistency", "idempotent_target", "late_row_ratio", "watermark_lag")}
        assert statuses == {"checkpoint_consistency": "Succeeded", "idempotent_target": "Succeeded",
                            "late_row_ratio": "Succeeded", "watermark_lag": "Failed"}, statuses
        assert "Running" not in checks
        run = browser.open(f"/runs/{run_id}", expect="Executing (1)", shot="run").split("\n")
        assert "Started" in run and CLICKS_OP in run and "4 checks" in run
    finally:
        browser.close()


def launch_partition_backfill(dagit: Dagit, asset_key: list[str], partitions: list[str]) -> str:
    """Dagster's backfill launcher over ``partitions`` of one asset; the backfill's id."""
    data = dagit.query("""mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
        __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
                       {"p": {"assetSelection": [{"path": asset_key}], "partitionNames": partitions}})
    launched = data["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return launched["backfillId"]


def backfill_state(dagit: Dagit, backfill_id: str) -> tuple[str, list[str]]:
    """A partition backfill's status and the ids of the runs it launched."""
    data = dagit.query("""query($id: String!) { partitionBackfillOrError(backfillId: $id) {
        ... on PartitionBackfill { status runs { runId } } } }""", {"id": backfill_id})
    backfill = data["partitionBackfillOrError"]
    return backfill["status"], [r["runId"] for r in backfill["runs"]]


def partition_materializations(dagit: Dagit, asset_key: list[str]) -> dict[str, dict[str, Any]]:
    """Partition -> the numeric and text metadata of its latest materialization."""
    data = dagit.query("""query($key: AssetKeyInput!) { assetOrError(assetKey: $key) { ... on Asset {
        assetMaterializations { partition runId metadataEntries { label ... on IntMetadataEntry { intValue }
            ... on TextMetadataEntry { text } } } } } }""", {"key": {"path": asset_key}})
    out: dict[str, dict[str, Any]] = {}
    for m in reversed(data["assetOrError"]["assetMaterializations"]):  # newest first: the newest wins
        out[m["partition"]] = {"run_id": m["runId"], **{e["label"]: e.get("intValue", e.get("text"))
                                                         for e in m["metadataEntries"]}}
    return out



@pytest.mark.slow
def test_dagster_dev_launch_terminate_relaunch(tmp_path, pg_dsn):
    drop_clicks_target(pg_dsn)
    events = write_click_inputs(tmp_path / ".ematix" / "data" / "clicks")
    expected = clicks_ground_truth(events)
    shutil.copytree(ROOT / "pipelines", tmp_path / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    dagit = Dagit(tmp_path, dagster_dev_env(tmp_path, pg_dsn))
    try:
        dagit.wait_ready()
        repo = dagit.repository()
        assert repo["location"]["name"] == LOCATION
        jobs = {j["name"] for j in repo["jobs"]}
        sensors = {s["name"] for s in repo["sensors"]}
        schedules = {s["name"] for s in repo["schedules"]}
        assets = {"/".join(a["assetKey"]["path"]) for a in repo["assetNodes"]}
        assert {"public/user_clicks_1min", "ematix/clicks-hopping-5min", "ematix/revenue-per-channel"} <= assets, assets
        assert {"clicks_per_minute_job", "clicks_hopping_5min_job", "revenue_per_channel_job",
                "ematix_state_migration_job", "ematix_validate_job", "ematix_checks_job"} <= jobs, jobs
        assert {"clicks_per_minute_keep_alive", "revenue_per_channel_keep_alive", "ematix_run_failure_sensor"} <= sensors, sensors
        assert {"clicks_hopping_5min_schedule", "ematix_state_migration_job_schedule",
                             "ematix_checks_job_schedule"} <= schedules, schedules

        # lineage: the clicks input is one upstream asset of the pipelines that read it (and of a backfill)
        nodes = asset_nodes(dagit)
        assert nodes[CLICKS]["deps"] == {CLICKS_INPUT}
        assert {key for key, node in nodes.items() if CLICKS_INPUT in node["deps"]} == {
            CLICKS, "ematix/clicks-hopping-5min", "ematix/user-sessions", "ematix/embargoed-clicks",
            "ematix/clicks-hourly-delayed", BACKFILL}
        assert nodes["ematix/revenue-per-channel"]["deps"] == {"files/ematix/data/orders-web",
                                                              "files/ematix/data/orders-mobile"}
        # addresses without credentials: host, port and database of the target (pg_dsn names a user)
        dsn = urlsplit(pg_dsn)
        assert nodes[CLICKS]["metadata"]["dagster/uri"] == f"postgresql://{dsn.hostname}:{dsn.port}{dsn.path}"
        assert nodes[CLICKS]["metadata"]["dagster/table_name"] == "public.user_clicks_1min"
        assert nodes["ematix/user-sessions"]["metadata"]["dagster/uri"] == \
            (tmp_path / ".ematix" / "output" / "user-sessions").as_uri()
        assert nodes[CLICKS_INPUT]["metadata"]["dagster/uri"] == (tmp_path / ".ematix" / "data" / "clicks").as_uri()
        assert not any("@" in (text or "") for node in nodes.values() for text in node["metadata"].values())

        run_config = {"ops": {CLICKS_OP: {"config": {"throttle_seconds": 0}}}}
        submitted = time.monotonic()
        first = dagit.client.submit_job_execution(CLICKS_JOB, repository_location_name=LOCATION, run_config=run_config)
        wait_for(lambda: len(materializations(dagit, first)) >= 2, 240, "per-batch materializations")
        labels = {e["label"] for e in materializations(dagit, first)[0]["metadataEntries"]}
        assert {"batch_id", "rows_in", "windows_emitted", "watermark_lag_seconds"} <= labels, labels
        # every per-batch materialization carries the code version, its own data version and the output's columns
        batches = materialization_tags(dagit, first)
        code_version = nodes[CLICKS]["code_version"]
        assert {m["tags"]["dagster/code_version"] for m in batches} == {code_version}
        assert len({m["tags"]["dagster/data_version"] for m in batches}) == len(batches)
        assert all({"dagster/row_count", "dagster/column_schema"} <= m["labels"] for m in batches)
        assert batches[0]["columns"][:2] == ["window_start", "window_end"]
        assert {"user_id", "clicks", "amount_sum", "unique_pages"} <= set(batches[0]["columns"])
        assert asset_nodes(dagit)[CLICKS]["stale"] == "FRESH"

        # the asset's checks while it runs: evaluated by its own step (none left "Running"), lag and late rows
        # reported after its materializations (runless); the sample input's 2025 event times make the lag fail
        expected_checks = {"checkpoint_consistency": ("SUCCEEDED", first), "idempotent_target": ("SUCCEEDED", first),
                           "late_row_ratio": ("SUCCEEDED", ""), "watermark_lag": ("FAILED", "")}
        wait_for(lambda: check_statuses(dagit, CLICKS.split("/")) == expected_checks or None, 90,
                 f"the checks of the latest materialization: {check_statuses(dagit, CLICKS.split('/'))}")
        assert run_status(dagit, first) == "STARTED"
        history = {name: check_executions(dagit, CLICKS.split("/"), name) for name in expected_checks}
        assert not [e for runs in history.values() for e in runs if e["status"] == "IN_PROGRESS"], history
        # at most one evaluation per check per materialization, and one per check interval the step's timer
        # went through (EMATIX_CHECK_INTERVAL_S is unset here: on a slow machine a batch can take longer)
        on_time = int((time.monotonic() - submitted) // DEFAULT_CHECK_INTERVAL_SECONDS)
        assert len([e for e in history["late_row_ratio"] if e["runId"] == ""]) <= \
            len(materializations(dagit, first)) + on_time
        assert "of this run" in history["late_row_ratio"][0]["evaluation"]["description"]
        browse(dagit, tmp_path / "screenshots", first)

        # the spec changes while the run goes on: the asset is STALE (its latest batches ran the old spec)
        toml = tmp_path / "pipelines" / "clicks_per_minute.toml"
        toml.write_text(toml.read_text().replace("trigger_interval_ms = 1_000", "trigger_interval_ms = 2_000"))
        dagit.client.reload_repository_location(LOCATION)
        changed = wait_for(lambda: (node := asset_nodes(dagit)[CLICKS])["code_version"] != code_version and node,
                           60, "the reloaded location's new code version")
        assert (changed["stale"], changed["causes"]) == ("STALE", ["has a new code version"])
        assert terminate(dagit, first) < 60
        assert_reads_as_a_cancel(dagit, first)
        assert asset_nodes(dagit)[CLICKS]["stale"] == "STALE"  # the run's closing result ran the old spec too

        second = dagit.client.submit_job_execution(CLICKS_JOB, repository_location_name=LOCATION, run_config=run_config)
        wait_for(lambda: clicks_target(pg_dsn) == expected or None, 240, "the target to hold every closed window")
        # The first run may have written every window already: terminate the second one only once its
        # pipeline runs (a run canceled before its step starts never reaches the pipeline's stop line).
        wait_for(lambda: any("] guarantee: " in (e.get("message") or "") for e in run_events(dagit, second)),
                 240, "the second run's pipeline to start")
        terminate(dagit, second)
        assert_reads_as_a_cancel(dagit, second)
        assert clicks_target(pg_dsn) == expected
        assert asset_nodes(dagit)[CLICKS]["stale"] == "FRESH"  # the new spec ran

        # a partition backfill from Dagster's launcher: two days the stream has passed, in one run
        # (BackfillPolicy.single_run), each partition materialized with what the backfill did
        assert nodes[BACKFILL]["deps"] == {CLICKS_INPUT}
        backfill_id = launch_partition_backfill(dagit, BACKFILL.split("/"), ["2025-02-28", "2025-03-01"])
        status, runs = wait_for(lambda: (state := backfill_state(dagit, backfill_id))[0] not in (
            "REQUESTED", "CANCELING", "FAILING") and state, 300, "the partition backfill to end")
        assert status == "COMPLETED_SUCCESS" and len(runs) == 1, (status, runs)
        done = partition_materializations(dagit, BACKFILL.split("/"))
        assert sorted(done) == ["2025-02-28", "2025-03-01"] and {m["run_id"] for m in done.values()} == set(runs)
        assert all(m["range"] == "[2025-02-28T00:00:00Z, 2025-03-02T00:00:00Z)" and m["windows_rewritten"] > 0
                   and m["rows_written"] == len(expected) for m in done.values()), done
        assert clicks_target(pg_dsn) == expected, "the sample day's windows rewritten with the values they had"

        # a failing blocking check stops a start with its explanation: the store holds batch 3 of user-sessions,
        # whose checkpoint does not exist
        sessions = load_pipeline(tmp_path / "pipelines" / "user_sessions.toml")
        commit_state(replace(sessions, state_store=StateStoreConfig(kind="sqlite",
                                                                    path=str(tmp_path / ".ematix" / "state.db"))))
        blocked = dagit.client.submit_job_execution("user_sessions_job", repository_location_name=LOCATION)
        wait_for(lambda: run_status(dagit, blocked) in ("FAILURE", "SUCCESS") or None, 180, "the blocked run to end")
        assert run_status(dagit, blocked) == "FAILURE"
        errors = [e["error"]["message"] for e in run_events(dagit, blocked) if e.get("error")]
        assert len(errors) == 1 and "the checkpoint_consistency check failed, so the pipeline does not start" in \
            errors[0] and "checkpoint_missing" in errors[0], errors
        assert check_statuses(dagit, SESSIONS.split("/"))["checkpoint_consistency"] == ("FAILED", blocked)
        assert not materializations(dagit, blocked)
    finally:
        dagit.stop()
    assert dagit.members() == [], "run workers or JVMs outlived dagster dev"
