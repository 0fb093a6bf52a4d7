"""The integration in a real Airflow 3 (tests/airflow_support.py): scheduler, triggerer, dag-processor and
API server on loopback with a metadata database of their own, the test DAGs in one bundle and the example
DAGs of ``pipelines/airflow`` in another. The tests share the server and run in order: the pipeline the
first one runs is the one the sensor then watches."""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pandas as pd
import psycopg
import pytest

from state_store.contract import BatchCommit, PendingRow, PipelineRecord, make_holder
from tests.airflow_support import AirflowServer
from tests.dagster_support import CLOSING_TS, clicks_ground_truth, write_click_file, write_click_inputs
from tests.pg import ensure_postgres

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = f"pw-{secrets.token_hex(8)}"  # trust auth ignores it; nothing may show it
UNTIL = CLOSING_TS + timedelta(hours=1)
LATER = datetime(2025, 3, 3, 0, 5, tzinfo=timezone.utc)  # the sensor test's event: past UNTIL and past 2025-03-02
EXAMPLE_DAGS = {"ematix_demo_clicks", "ematix_clicks_hopping_5min", "ematix_clicks_hopping_on_update",
                "ematix_clicks_hopping_hourly_report", "ematix_clicks_per_minute_stream",
                "ematix_clicks_per_minute_checks", "ematix_clicks_per_minute_migrate",
                "ematix_clicks_per_minute_backfill"}
TEST_DAGS = {"ematix_test_run", "ematix_test_on_output", "ematix_test_sensor", "ematix_test_emit_sensor", "ematix_test_bad",
             "ematix_test_stream", "ematix_test_backfill", "ematix_test_misaligned"}

PIPELINE = """
pipeline_name = "af-clicks"

[[sources]]
name = "clicks"
kind = "files"
format = "parquet"
path = "{root}/in"
schema = "user_id BIGINT, amount DOUBLE, page STRING, ts TIMESTAMP"
event_time_column = "ts"
max_files_per_trigger = 2

[transform]
sql = "SELECT user_id, amount, page, _event_ts, _source FROM source WHERE amount >= 0"

[transform.window]
kind = "tumbling"
duration_ms = 60_000
lateness_ms = {lateness}
group_by = ["user_id"]
max_groups_per_window = 1_000

[[transform.window.aggregations]]
agg = "count"
as = "clicks"

[[transform.window.aggregations]]
agg = "sum"
column = "amount"
as = "amount_sum"

[[transform.window.aggregations]]
agg = "count_distinct"
column = "page"
as = "unique_pages"

[target]
kind = "postgres"
url = "${{EMATIX_PG_URL}}"
table = "{table}"
create_table = true

[state_store]
kind = "sqlite"
path = "{root}/state.db"

[run]
trigger = "available_now"
checkpoint_location = "{root}/checkpoint"

[backfill]
partition = "daily"
start = "2025-03-01"
"""

#: the sensor's [emit] pipeline: its windows wait an hour past their end
EMIT = """
[emit]
sql = "SELECT * FROM windows WHERE window_end + INTERVAL 1 HOUR <= WATERMARK_TS()"
max_buffered_rows = 1_000
"""

#: Spark's log4j output: to the console as by default, and to a file per task process
SPARK_LOG4J = """rootLogger.level = info
rootLogger.appenderRef.console.ref = console
rootLogger.appenderRef.file.ref = file
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}/spark-${{date:HHmmss-SSS}}.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d %p %c: %m%n%ex
"""

DAGS = """
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, CronDataIntervalTimetable, task

from ematix_dagster.airflow import (
    EmatixBackfillOperator,
    EmatixRunOperator,
    EmatixWatermarkSensor,
    pipeline_asset,
)

START = datetime(2025, 1, 1)

with DAG("ematix_test_run", schedule=None, start_date=START, catchup=False, max_active_runs=1):
    EmatixRunOperator(task_id="run", pipeline={pipeline!r}, conn_id="ematix_pg", retries=1,
                      retry_delay=timedelta(seconds=2))

with DAG("ematix_test_on_output", schedule=[pipeline_asset({pipeline!r})], start_date=START, catchup=False):
    @task
    def report() -> str:
        return "target updated"

    report()

with DAG("ematix_test_sensor", schedule=None, start_date=START, catchup=False):
    EmatixWatermarkSensor(task_id="wait", pipeline={pipeline!r}, conn_id="ematix_pg", until={until!r},
                          poke_interval=2, timeout=300)

with DAG("ematix_test_emit_sensor", schedule=None, start_date=START, catchup=False):
    EmatixWatermarkSensor(task_id="wait", pipeline={emit!r}, conn_id="ematix_pg", until={until!r},
                          poke_interval=2, timeout=300)

with DAG("ematix_test_bad", schedule=None, start_date=START, catchup=False):
    EmatixRunOperator(task_id="run", pipeline={bad!r}, conn_id="ematix_pg", retries=2,
                      retry_delay=timedelta(seconds=1))

with DAG("ematix_test_stream", schedule=None, start_date=START, catchup=False, max_active_runs=1):
    EmatixRunOperator(task_id="stream", pipeline={stream!r}, mode="continuous", conn_id="ematix_pg", retries=3,
                      retry_delay=timedelta(seconds=1))

with DAG("ematix_test_backfill", schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
         start_date=datetime(2025, 3, 1, tzinfo=timezone.utc), end_date=datetime(2025, 3, 2, tzinfo=timezone.utc),
         catchup=True, max_active_runs=1, is_paused_upon_creation=True):
    EmatixBackfillOperator(task_id="backfill", pipeline={pipeline!r}, conn_id="ematix_pg")

with DAG("ematix_test_misaligned", schedule=None, start_date=START, catchup=False):
    EmatixBackfillOperator(task_id="backfill", pipeline={pipeline!r}, conn_id="ematix_pg", retries=2,
                           start="2025-03-01T06:00:00+00:00", end="2025-03-02T06:00:00+00:00")
"""


@pytest.fixture(scope="module")
def airflow(request: pytest.FixtureRequest) -> Iterator[tuple[AirflowServer, Path, str]]:
    dsn = ensure_postgres()
    failed_before = request.session.testsfailed
    # a directory of its own, not pytest's: a pytest session started meanwhile prunes older ones, and
    # these tests run for minutes (it stays, with Airflow's logs, when a test failed)
    root = Path(tempfile.mkdtemp(prefix="ematix-airflow-test-"))
    tag = secrets.token_hex(3)
    table = f"public.af_clicks_{tag}"
    for sub in ("in", "stream/in", "emit"):
        (root / sub).mkdir(parents=True)
    (root / "af_clicks.toml").write_text(PIPELINE.format(root=root, table=table, lateness=10_000))
    (root / "bad.toml").write_text(PIPELINE.format(root=root / "bad", table=table, lateness=-5))
    (root / "emit.toml").write_text(PIPELINE.format(root=root / "emit", table=f"public.af_emit_{tag}", lateness=10_000)
                                    .replace('"af-clicks"', '"af-emit"') + EMIT)
    (root / "stream.toml").write_text(PIPELINE.format(root=root / "stream", table=f"public.af_stream_{tag}",
                                                      lateness=10_000).replace('"af-clicks"', '"af-stream"'))
    dags = root / "dags"
    dags.mkdir()
    # the example DAGs read their pipeline files under EMATIX_HOME: copies of the repository's, except that
    # clicks-per-minute's file is this module's pipeline, so its check and migration DAGs read known state
    examples = root / "examples" / "pipelines"
    examples.mkdir(parents=True)
    for toml in (ROOT / "pipelines").glob("*.toml"):
        shutil.copy(toml, examples / toml.name)
    shutil.copy(root / "af_clicks.toml", examples / "clicks_per_minute.toml")
    # Spark's own logs (log4j, to a file) and event logs (its properties and environment) of every task, grepped
    # for the password at the end
    spark_conf = root / "spark-conf"
    for sub in ("spark-conf", "spark-logs", "spark-events"):
        (root / sub).mkdir()
    (spark_conf / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir {(root / 'spark-events').as_uri()}\n"
        "spark.eventLog.compress false\nspark.eventLog.rolling.enabled false\n")  # plain JSON, to grep
    (spark_conf / "log4j2.properties").write_text(SPARK_LOG4J.format(path=root / "spark-logs"))
    (dags / "ematix_test_dags.py").write_text(textwrap.dedent(DAGS).format(
        pipeline=str(root / "af_clicks.toml"), bad=str(root / "bad.toml"), until=UNTIL.isoformat(),
        emit=str(root / "emit.toml"),
        stream=str(root / "stream.toml")))
    user_host = dsn.removeprefix("postgresql://").split("@", 1)
    conn_uri = f"postgresql://{user_host[0]}:{PASSWORD}@{user_host[1]}"
    home = root / "home"
    home.mkdir()
    server = AirflowServer(home, dsn, {"tests": dags, "examples": ROOT / "pipelines" / "airflow"},
                           extra_env={"AIRFLOW_CONN_EMATIX_PG": conn_uri, "PYTHONPATH": str(ROOT),
                                      "EMATIX_SPARK_MASTER": "local[1]", "EMATIX_HOME": str(examples.parent),
                                      "SPARK_CONF_DIR": str(spark_conf)})
    keep = True  # the directory, with Airflow's logs, unless every test passed
    try:
        server.start()
        server.wait_for(lambda: TEST_DAGS | EXAMPLE_DAGS <= server.dag_ids(), 120, "every DAG to be parsed")
        yield server, root, table
        keep = request.session.testsfailed > failed_before
    finally:
        server.stop()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in ("clicks", "stream"):
                conn.execute(f"DROP TABLE IF EXISTS public.af_{name}_{tag}")
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _target(dsn: str, table: str) -> dict[tuple, tuple]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT window_start, user_id, clicks, amount_sum, unique_pages FROM {table}").fetchall()
    return {(ws, int(u)): (int(c), round(float(s), 6), int(p)) for ws, u, c, s, p in rows}


def _finished_runs(server: AirflowServer, dag_id: str) -> list[dict]:
    return [r for r in server.runs(dag_id) if r["state"] in ("success", "failed")]


def test_example_dags_import_without_errors(airflow: tuple[AirflowServer, Path, str]) -> None:
    server, _, _ = airflow
    out = server.cli("dags", "list-import-errors", "--output", "json")
    listed = [line for line in out.splitlines() if line.startswith(("[", "{"))]
    assert listed, out
    errors = json.loads(listed[-1])
    assert errors == [] or errors == [{"error": "No data found"}], out
    assert EXAMPLE_DAGS <= server.dag_ids()
    assert all(server.get(f"/dags/{d}")["is_paused"] for d in EXAMPLE_DAGS)  # examples wait to be turned on


def test_available_now_run_writes_the_ground_truth_and_triggers_the_asset_dag(
        airflow: tuple[AirflowServer, Path, str]) -> None:
    server, root, table = airflow
    events = write_click_inputs(root / "in")
    run_id = server.trigger("ematix_test_run")
    assert server.wait_run("ematix_test_run", run_id, 240) == "success", server.log("ematix_test_run", run_id, "run")
    assert _target(ensure_postgres(), table) == clicks_ground_truth(events)
    summary = server.xcom("ematix_test_run", run_id, "run")
    assert summary["batches"] >= 4 and summary["rows_in"] == len(events)
    assert summary["rows_emitted"] == len(clicks_ground_truth(events)) and summary["late_rows"] == 0
    assert summary["watermark"].startswith((CLOSING_TS - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%S"))
    log = server.log("ematix_test_run", run_id, "run")
    assert "batch" in log and "rows in" in log  # a progress line per batch
    server.wait_for(lambda: _finished_runs(server, "ematix_test_on_output"), 90, "the Asset-scheduled DAG to run")
    assert _finished_runs(server, "ematix_test_on_output")[0]["state"] == "success"
    rendered = server.task("ematix_test_run", run_id, "run").get("rendered_fields")
    assert PASSWORD not in log + json.dumps(summary) + json.dumps(rendered)


def test_example_check_and_migration_dags_report_the_stored_state(airflow: tuple[AirflowServer, Path, str]) -> None:
    """The example DAGs ``ematix_clicks_per_minute_checks`` (daily) and ``_migrate`` (monthly), turned on, run
    once each and succeed; their XCom values are the checks' and the migration's over the state the run above
    left (this module's pipeline stands in for clicks_per_minute.toml under ``EMATIX_HOME``)."""
    import glob
    import sqlite3

    import pyarrow.parquet as pq

    from state_store.codec import STATE_VERSION

    server, root, _ = airflow
    read = sum(pq.read_metadata(f).num_rows for f in glob.glob(str(root / "in" / "*.parquet")))
    dags = {"ematix_clicks_per_minute_checks": "check", "ematix_clicks_per_minute_migrate": "migrate"}
    for dag_id in dags:  # turned on, each schedules its latest run at once (catchup=False)
        server.client.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False}).raise_for_status()
    server.wait_for(lambda: all(_finished_runs(server, d) for d in dags), 120, "the check and migration runs")
    results = {}
    for dag_id, task_id in dags.items():
        run = _finished_runs(server, dag_id)[0]
        assert run["state"] == "success", server.log(dag_id, run["dag_run_id"], task_id)
        assert server.task(dag_id, run["dag_run_id"], task_id)["state"] == "success"
        results[task_id] = server.xcom(dag_id, run["dag_run_id"], task_id)
        server.client.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": True}).raise_for_status()
    checks = results["check"]
    assert set(checks) == {"checkpoint_consistency", "idempotent_target", "late_row_ratio", "watermark_lag"}
    assert checks["checkpoint_consistency"]["passed"] and checks["idempotent_target"]["passed"]
    assert checks["late_row_ratio"]["passed"]
    assert checks["late_row_ratio"]["description"].startswith(f"0 late rows of {read} read"), checks
    # the clicks are of 2025: the watermark is far behind the DAG's 600 s bound, a warning that fails no task
    assert not checks["watermark_lag"]["passed"] and checks["watermark_lag"]["severity"] == "warn"
    with sqlite3.connect(root / "state.db") as conn:  # rows of an older blob version (the run wrote segments)
        older = conn.execute("SELECT count(*) FROM ematix_streaming_state WHERE pipeline_name = 'af-clicks' "
                             "AND state_version <> ?", (STATE_VERSION,)).fetchone()[0]
    conn.close()
    assert results["migrate"] == [f"rewrote {older} state blobs to version {STATE_VERSION}"]


def test_sensor_defers_while_behind_and_succeeds_once_a_run_moves_the_watermark(
        airflow: tuple[AirflowServer, Path, str]) -> None:
    """A run moves af-clicks' output watermark past ``until``: its sensor succeeds. Beside it, a sensor on an
    ``[emit]`` pipeline whose committed watermark is past ``until`` waits all along, deferred, because a
    window ending at ``until`` is held in its store (the output watermark stored with the commit stays
    there), and succeeds once a commit releases it."""
    server, root, _ = airflow
    dsn = ensure_postgres()
    until_us, past_us = (int(t.timestamp() * 1e6) for t in (UNTIL, UNTIL + timedelta(hours=2)))
    held = PendingRow(release_us=past_us + 1, arrival_batch=0, seq=0, event_ts=until_us, payload=b"window")
    _commit(root / "emit.toml", dsn, 0, past_us, inserted=[held])
    assert _position(root / "emit.toml", dsn).output_watermark == until_us
    sensor_run, emit_run = server.trigger("ematix_test_sensor"), server.trigger("ematix_test_emit_sensor")
    deferred = {"ematix_test_sensor": sensor_run, "ematix_test_emit_sensor": emit_run}
    server.wait_for(lambda: all(server.task(d, r, "wait")["state"] == "deferred" for d, r in deferred.items()), 90,
                    "both sensors to defer")
    assert all(server.run_state(d, r) == "running" for d, r in deferred.items())
    write_click_file(root / "in", 7, [{"user_id": 5, "amount": 1.0, "page": "/later", "ts": pd.Timestamp(LATER)}])
    run_id = server.trigger("ematix_test_run")
    assert server.wait_run("ematix_test_run", run_id, 240) == "success"
    assert server.wait_run("ematix_test_sensor", sensor_run, 60) == "success"
    seen = server.xcom("ematix_test_sensor", sensor_run, "wait")
    assert seen["watermark"] >= UNTIL.strftime("%Y-%m-%dT%H:%M:%S") and seen["held_back"] is False
    assert seen["output_watermark"] == seen["watermark"]
    log = server.log("ematix_test_sensor", sensor_run, "wait")
    assert PASSWORD not in log + json.dumps(seen)
    # the [emit] sensor has polled all along (every 2 s) with the window still held: it waits for it
    assert server.task("ematix_test_emit_sensor", emit_run, "wait")["state"] == "deferred"
    _commit(root / "emit.toml", dsn, 1, past_us, released=[held.key])
    assert server.wait_run("ematix_test_emit_sensor", emit_run, 60) == "success"
    released = server.xcom("ematix_test_emit_sensor", emit_run, "wait")
    assert (released["last_batch_id"], released["held_back"]) == (1, False)
    assert released["output_watermark"].startswith((UNTIL + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S"))


def _commit(path: Path, dsn: str, batch_id: int, watermark_us: int, inserted: list | None = None,
            released: list | None = None) -> None:
    """A batch of the [emit] pipeline as its run commits one: watermark and WATERMARK_TS() at ``watermark_us``,
    held rows in and out (the store computes the output watermark)."""
    from ematix_dagster.airflow.connection import load_with_values
    from ematix_dagster.operations import opened
    from state_store import codec

    spec = load_with_values(path, {"EMATIX_PG_URL": dsn})
    with opened(spec) as store:
        store.acquire_lease(spec.pipeline_name, make_holder("test"))
        record = PipelineRecord(spec.pipeline_name, codec.STATE_VERSION, last_batch_id=batch_id,
                                watermark=watermark_us, release_watermark=watermark_us)
        store.commit(BatchCommit(record, pending_inserts=inserted or [], pending_released=released or []))
        store.release_lease(spec.pipeline_name)


def test_terminal_error_fails_once_without_retry_naming_the_key(airflow: tuple[AirflowServer, Path, str]) -> None:
    server, _, _ = airflow
    run_id = server.trigger("ematix_test_bad")
    assert server.wait_run("ematix_test_bad", run_id, 120) == "failed"
    ti = server.task("ematix_test_bad", run_id, "run")
    assert (ti["state"], ti["try_number"]) == ("failed", 1)
    log = server.log("ematix_test_bad", run_id, "run")
    assert "transform.window.lateness_ms" in log and "not retried" in log


def _position(path: Path, dsn: str):
    from ematix_dagster.airflow.connection import load_with_values
    from ematix_dagster.airflow.watermark import output_position

    return output_position(load_with_values(path, {"EMATIX_PG_URL": dsn}))


def _holder(path: Path, dsn: str) -> str | None:
    from ematix_dagster.airflow.connection import load_with_values
    from ematix_dagster.operations import opened

    spec = load_with_values(path, {"EMATIX_PG_URL": dsn})
    with opened(spec) as store:
        return store.lease_holder(spec.pipeline_name)


def test_continuous_task_retries_take_the_lease_over_and_a_clear_stops_it_at_a_batch_boundary(
        airflow: tuple[AirflowServer, Path, str]) -> None:
    """Try 1 loses its supervisor (SIGKILL): its task process streams on, holding the lease, until try 2
    takes the lease over through the fence and its next commit is refused. Try 2's task process is
    SIGKILLed: try 3 resumes from the store. The target equals the ground truth; a clear of try 3 stops
    its stream at a batch boundary, and try 4 resumes at the batch try 3 committed last."""
    import os
    import re
    import signal
    import subprocess

    import psutil

    server, root, _ = airflow
    dsn = ensure_postgres()
    path = root / "stream.toml"
    table = re.search(r'table = "([^"]+)"', path.read_text()).group(1)

    def holder_pid(try_number: int) -> int:
        holder = server.wait_for(lambda: (h := _holder(path, dsn) or "") and f"/try{try_number}" in h and h, 120,
                                 f"try {try_number} to hold the lease")
        return int(re.search(r"pid=(\d+)", holder).group(1))

    events = write_click_inputs(root / "stream" / "in", range(3))
    run_id = server.trigger("ematix_test_stream")
    server.wait_for(lambda: (_position(path, dsn).last_batch_id or -1) >= 1, 180, "the stream's first batches")
    orphan = psutil.Process(holder_pid(1))
    assert PASSWORD not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    os.kill(orphan.ppid(), signal.SIGKILL)  # try 1's supervisor: its task process streams on
    killed = holder_pid(2)  # try 2 fenced try 1, whose next commit was refused (LeaseLost), and took the lease
    server.wait_for(lambda: not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE, 60,
                    "the fenced task process to end")
    os.kill(killed, signal.SIGKILL)  # try 2's task process, mid-stream
    holder_pid(3)
    events = pd.concat([events, write_click_inputs(root / "stream" / "in", range(3, 7))], ignore_index=True)
    truth = clicks_ground_truth(events)
    server.wait_for(lambda: _target(dsn, table) == truth, 240, "the target to equal the ground truth")
    # a clear of the running task: SIGTERM, on_kill, the stream stops at a batch boundary, the lease is released
    response = server.client.post("/api/v2/dags/ematix_test_stream/clearTaskInstances", json={
        "dry_run": False, "dag_run_id": run_id, "task_ids": ["stream"], "only_failed": False,
        "reset_dag_runs": False})
    response.raise_for_status()
    stopped = server.wait_for(lambda: re.search(r"stopped on request at a batch boundary after batch (\d+)",
                                                server.log("ematix_test_stream", run_id, "stream", 3)), 60,
                              "the cleared try to stop")
    holder_pid(4)
    log4 = server.wait_for(lambda: (text := server.log("ematix_test_stream", run_id, "stream", 4))
                           and "resuming from" in text and text, 60, "the next try to resume")
    # the next try resumes where the stopped one committed last: no batch after the stop
    assert int(re.search(r"resuming from .* at batch (\d+)", log4).group(1)) == int(stopped.group(1))
    response = server.client.patch(f"/api/v2/dags/ematix_test_stream/dagRuns/{run_id}", json={"state": "failed"})
    response.raise_for_status()
    server.wait_for(lambda: _holder(path, dsn) is None, 60, "the lease to be released")
    assert _target(dsn, table) == truth
    log2 = server.log("ematix_test_stream", run_id, "stream", 2)
    assert re.search(r"taking the lease .* over from .*/try1", log2)  # through the fence, not a free lease
    logs = "".join(server.log("ematix_test_stream", run_id, "stream", n) for n in (2, 3, 4))
    assert PASSWORD not in logs


def test_catchup_and_backfill_create_replace_two_daily_partitions_and_a_misaligned_interval_is_refused(
        airflow: tuple[AirflowServer, Path, str]) -> None:
    """After the sensor test the stream has passed 2025-03-01 and 2025-03-02: a catchup over those two
    daily partitions replaces exactly the windows starting in them, and so does a backfill of the two days
    created through the REST API (``airflow backfill create``)."""
    import glob

    import pyarrow.parquet as pq

    server, root, table = airflow
    dsn = ensure_postgres()
    events = pd.concat([pq.read_table(f).to_pandas() for f in sorted(glob.glob(str(root / "in" / "*.parquet")))])
    in_range = events[(events["ts"] < pd.Timestamp("2025-03-03T00:00:00Z")) & (events["amount"] >= 0)].copy()
    in_range["start"] = in_range["ts"].dt.floor("1min")
    truth = {(s.to_pydatetime(), int(u)): (len(g), round(float(g["amount"].sum()), 6), g["page"].nunique())
             for (s, u), g in in_range.groupby(["start", "user_id"])}
    inside, outside = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc), datetime(2025, 3, 3, tzinfo=timezone.utc)
    with psycopg.connect(dsn, autocommit=True) as conn:  # what the backfill must replace, and what it must leave
        conn.execute(f"UPDATE {table} SET clicks = 999")
        schema, name = table.split(".")
        columns = [r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE "
                                              "table_schema = %s AND table_name = %s", (schema, name)).fetchall()]
        values = {"window_start": "%(start)s", "window_end": "%(end)s", "user_id": "4321", "clicks": "999",
                  "amount_sum": "0", "unique_pages": "0"}
        chosen = ", ".join(values.get(c, f'"{c}"') for c in columns)
        for start in (inside, outside):  # a copy of a stored row (any other columns as they are)
            conn.execute(f"INSERT INTO {table} SELECT {chosen} FROM {table} LIMIT 1",
                         {"start": start, "end": start + timedelta(minutes=1)})
    misaligned = server.trigger("ematix_test_misaligned")
    assert server.wait_run("ematix_test_misaligned", misaligned, 90) == "failed"
    ti = server.task("ematix_test_misaligned", misaligned, "backfill")
    assert (ti["state"], ti["try_number"]) == ("failed", 1)
    assert "use 2025-03-01T00:00:00" in server.log("ematix_test_misaligned", misaligned, "backfill")
    response = server.client.patch("/api/v2/dags/ematix_test_backfill", json={"is_paused": False})
    response.raise_for_status()
    server.wait_for(lambda: len(_finished_runs(server, "ematix_test_backfill")) == 2, 420,
                    "the two catchup runs to finish")
    runs = _finished_runs(server, "ematix_test_backfill")
    assert [r["state"] for r in runs] == ["success", "success"], runs
    after = _target(dsn, table)
    assert {k: v for k, v in after.items() if k[0] < outside} == truth  # the stray row inside is gone
    assert {k: v for k, v in after.items() if k[0] >= outside} == {(outside, 4321): (999, 0.0, 0)}

    # `airflow backfill create` (POST /api/v2/backfills) of the same two days, after spoiling them again: the
    # two runs are cleared and run again as the backfill's, and the days' windows are replaced once more
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {table} SET clicks = 998 WHERE window_start < %s", (outside,))
    response = server.client.post("/api/v2/backfills", json={
        "dag_id": "ematix_test_backfill", "from_date": "2025-03-01T00:00:00Z", "to_date": "2025-03-02T00:00:00Z",
        "reprocess_behavior": "completed", "max_active_runs": 1})
    response.raise_for_status()
    backfill = response.json()["id"]
    server.wait_for(lambda: server.get(f"/backfills/{backfill}")["completed_at"], 420, "the backfill to complete")
    runs = server.runs("ematix_test_backfill")
    assert sorted((r["run_type"], r["state"]) for r in runs) == [("backfill", "success")] * 2, runs
    assert {r["logical_date"][:10] for r in runs} == {"2025-03-01", "2025-03-02"}
    after = _target(dsn, table)
    assert {k: v for k, v in after.items() if k[0] < outside} == truth
    assert {k: v for k, v in after.items() if k[0] >= outside} == {(outside, 4321): (999, 0.0, 0)}
    rewritten = [server.xcom("ematix_test_backfill", r["dag_run_id"], "backfill") for r in runs]
    assert sum(r["rows_written"] for r in rewritten) == len(truth)  # a row per (minute, user) of the two days


def test_the_password_is_in_no_file_any_component_or_spark_wrote(airflow: tuple[AirflowServer, Path, str]) -> None:
    """After every task above ran: the Connection's password is in none of the files under the module's
    directory: Airflow's task and trigger logs, the components' own logs (the triggerer's among them),
    Spark's log4j files and event logs (its properties and environment) of every task, the checkpoints and
    the stores (``ps`` is grepped while a task runs: the continuous test)."""
    server, root, _ = airflow
    triggerer = server.home / "triggerer.log"
    spark_logs = list((root / "spark-logs").glob("*.log"))
    events = [p for p in (root / "spark-events").rglob("*") if p.is_file()]
    assert triggerer.stat().st_size > 0 and spark_logs and events  # each wrote something
    assert any(b"SparkListenerEnvironmentUpdate" in e.read_bytes() for e in events)
    trigger_lines = b"".join(p.read_bytes() for p in (server.home / "logs").rglob("*")
                             if p.is_file() and "ematix_test_emit_sensor" in str(p))
    assert b"held back in the state store" in trigger_lines + triggerer.read_bytes()  # the trigger's wait, logged
    found = [str(p) for p in root.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
    assert found == []
