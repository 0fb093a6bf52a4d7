"""The integration in a real Airflow 3 (tests/airflow_support.py): scheduler, triggerer, dag-processor and
API server on loopback with a metadata database of their own, the test DAGs in one bundle and the example
DAGs of ``pipelines/airflow`` in another. The tests share the server and run in order: the pipeline the
first one runs is the one the sensor then watches."""

from __future__ import annotations

import json
import secrets
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import pandas as pd
import psycopg
import pytest

from tests.airflow_support import AirflowServer
from tests.dagster_support import CLOSING_TS, clicks_ground_truth, write_click_file, write_click_inputs
from tests.pg import ensure_postgres

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = f"pw-{secrets.token_hex(8)}"  # trust auth ignores it; nothing may show it
UNTIL = CLOSING_TS + timedelta(hours=1)
EXAMPLE_DAGS = {"ematix_demo_clicks", "ematix_clicks_hopping_5min", "ematix_clicks_hopping_on_update",
                "ematix_clicks_hopping_hourly_report", "ematix_clicks_per_minute_stream",
                "ematix_clicks_per_minute_checks", "ematix_clicks_per_minute_migrate",
                "ematix_clicks_per_minute_backfill"}
TEST_DAGS = {"ematix_test_run", "ematix_test_on_output", "ematix_test_sensor", "ematix_test_bad",
             "ematix_test_stream", "ematix_test_days", "ematix_test_backfill", "ematix_test_misaligned"}

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
"""

DAYS_PIPELINE = """
pipeline_name = "af-days"

[[sources]]
name = "clicks"
kind = "files"
format = "parquet"
path = "{root}/in"
schema = "user_id BIGINT, amount DOUBLE, page STRING, ts TIMESTAMP"
event_time_column = "ts"

[transform.window]
kind = "tumbling"
duration_ms = 3_600_000
lateness_ms = 60_000
group_by = ["user_id"]
max_groups_per_window = 1_000

[[transform.window.aggregations]]
agg = "count"
as = "clicks"

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

with DAG("ematix_test_bad", schedule=None, start_date=START, catchup=False):
    EmatixRunOperator(task_id="run", pipeline={bad!r}, conn_id="ematix_pg", retries=2,
                      retry_delay=timedelta(seconds=1))

with DAG("ematix_test_stream", schedule=None, start_date=START, catchup=False, max_active_runs=1):
    EmatixRunOperator(task_id="stream", pipeline={stream!r}, mode="continuous", conn_id="ematix_pg", retries=1,
                      retry_delay=timedelta(seconds=1))

with DAG("ematix_test_days", schedule=None, start_date=START, catchup=False):
    EmatixRunOperator(task_id="run", pipeline={days!r}, conn_id="ematix_pg")

with DAG("ematix_test_backfill", schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
         start_date=datetime(2025, 3, 1, tzinfo=timezone.utc), end_date=datetime(2025, 3, 2, tzinfo=timezone.utc),
         catchup=True, max_active_runs=1, is_paused_upon_creation=True):
    EmatixBackfillOperator(task_id="backfill", pipeline={days!r}, conn_id="ematix_pg")

with DAG("ematix_test_misaligned", schedule=None, start_date=START, catchup=False):
    EmatixBackfillOperator(task_id="backfill", pipeline={days!r}, conn_id="ematix_pg", retries=2,
                           start="2025-03-01T06:00:00+00:00", end="2025-03-02T06:00:00+00:00")
"""


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowServer, Path, str]]:
    dsn = ensure_postgres()
    root = tmp_path_factory.mktemp("airflow")
    tag = secrets.token_hex(3)
    table = f"public.af_clicks_{tag}"
    for sub in ("in", "stream/in", "days/in"):
        (root / sub).mkdir(parents=True)
    (root / "af_clicks.toml").write_text(PIPELINE.format(root=root, table=table, lateness=10_000))
    (root / "bad.toml").write_text(PIPELINE.format(root=root / "bad", table=table, lateness=-5))
    (root / "stream.toml").write_text(PIPELINE.format(root=root / "stream", table=f"public.af_stream_{tag}",
                                                      lateness=10_000).replace('"af-clicks"', '"af-stream"'))
    (root / "days.toml").write_text(DAYS_PIPELINE.format(root=root / "days", table=f"public.af_days_{tag}"))
    dags = root / "dags"
    dags.mkdir()
    (dags / "ematix_test_dags.py").write_text(textwrap.dedent(DAGS).format(
        pipeline=str(root / "af_clicks.toml"), bad=str(root / "bad.toml"), until=UNTIL.isoformat(),
        stream=str(root / "stream.toml"), days=str(root / "days.toml")))
    user_host = dsn.removeprefix("postgresql://").split("@", 1)
    conn_uri = f"postgresql://{user_host[0]}:{PASSWORD}@{user_host[1]}"
    home = root / "home"
    home.mkdir()
    server = AirflowServer(home, dsn, {"tests": dags, "examples": ROOT / "pipelines" / "airflow"},
                           extra_env={"AIRFLOW_CONN_EMATIX_PG": conn_uri, "PYTHONPATH": str(ROOT),
                                      "EMATIX_SPARK_MASTER": "local[1]"})
    try:
        server.start()
        server.wait_for(lambda: TEST_DAGS | EXAMPLE_DAGS <= server.dag_ids(), 120, "every DAG to be parsed")
        yield server, root, table
    finally:
        server.stop()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in ("clicks", "stream", "days"):
                conn.execute(f"DROP TABLE IF EXISTS public.af_{name}_{tag}")


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


def test_sensor_defers_while_behind_and_succeeds_once_a_run_moves_the_watermark(
        airflow: tuple[AirflowServer, Path, str]) -> None:
    server, root, _ = airflow
    sensor_run = server.trigger("ematix_test_sensor")
    server.wait_for(lambda: server.task("ematix_test_sensor", sensor_run, "wait")["state"] == "deferred", 90,
                    "the sensor to defer")
    assert server.run_state("ematix_test_sensor", sensor_run) == "running"
    write_click_file(root / "in", 7, [{"user_id": 5, "amount": 1.0, "page": "/later",
                                       "ts": pd.Timestamp(UNTIL + timedelta(minutes=5))}])
    run_id = server.trigger("ematix_test_run")
    assert server.wait_run("ematix_test_run", run_id, 240) == "success"
    assert server.wait_run("ematix_test_sensor", sensor_run, 60) == "success"
    seen = server.xcom("ematix_test_sensor", sensor_run, "wait")
    assert seen["watermark"] >= UNTIL.strftime("%Y-%m-%dT%H:%M:%S")
    log = server.log("ematix_test_sensor", sensor_run, "wait")
    assert PASSWORD not in log + json.dumps(seen)


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


def test_continuous_task_killed_is_retried_from_the_store_and_a_clear_stops_it_at_a_batch_boundary(
        airflow: tuple[AirflowServer, Path, str]) -> None:
    import os
    import re
    import signal
    import subprocess

    server, root, _ = airflow
    dsn = ensure_postgres()
    path = root / "stream.toml"
    table = re.search(r'table = "([^"]+)"', path.read_text()).group(1)
    events = write_click_inputs(root / "stream" / "in", range(3))
    run_id = server.trigger("ematix_test_stream")
    server.wait_for(lambda: (_position(path, dsn).last_batch_id or -1) >= 1, 120, "the stream's first batches")
    holder = _holder(path, dsn)
    assert holder is not None and "/try1" in holder
    assert PASSWORD not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    os.kill(int(re.search(r"pid=(\d+)", holder).group(1)), signal.SIGKILL)  # the task process, mid-stream
    server.wait_for(lambda: (ti := server.task("ematix_test_stream", run_id, "stream"))["try_number"] == 2
                    and ti["state"] == "running", 90, "the retry to start")
    server.wait_for(lambda: "/try2" in (_holder(path, dsn) or ""), 90, "the retry to hold the lease")
    events = pd.concat([events, write_click_inputs(root / "stream" / "in", range(3, 7))], ignore_index=True)
    truth = clicks_ground_truth(events)
    server.wait_for(lambda: _target(dsn, table) == truth, 120, "the target to equal the ground truth")
    # a clear of the running task: SIGTERM, on_kill, the stream stops at a batch boundary, the lease is released
    response = server.client.post("/api/v2/dags/ematix_test_stream/clearTaskInstances", json={
        "dry_run": False, "dag_run_id": run_id, "task_ids": ["stream"], "only_failed": False,
        "reset_dag_runs": False})
    response.raise_for_status()
    stopped = server.wait_for(lambda: re.search(r"stopped on request at a batch boundary after batch (\d+)",
                                                server.log("ematix_test_stream", run_id, "stream", 2)), 60,
                              "the cleared try to stop")
    stop_batch = int(stopped.group(1))
    server.wait_for(lambda: "/try3" in (_holder(path, dsn) or ""), 90, "the next try to hold the lease")
    log3 = server.wait_for(lambda: (text := server.log("ematix_test_stream", run_id, "stream", 3))
                           and "resuming from" in text and text, 60, "the next try to resume")
    # the next try resumes where the stopped one committed last: no batch after the stop
    assert int(re.search(r"resuming from .* at batch (\d+)", log3).group(1)) == stop_batch
    response = server.client.patch(f"/api/v2/dags/ematix_test_stream/dagRuns/{run_id}", json={"state": "failed"})
    response.raise_for_status()
    server.wait_for(lambda: _holder(path, dsn) is None, 60, "the lease to be released")
    assert _target(dsn, table) == truth
    logs = "".join(server.log("ematix_test_stream", run_id, "stream", n) for n in (1, 2, 3))
    assert PASSWORD not in logs


def _day_events() -> pd.DataFrame:
    rows = [{"user_id": u, "amount": 1.0, "page": "/d", "ts": pd.Timestamp(f"2025-03-0{d}T{h:02d}:{m:02d}:00Z")}
            for d in (1, 2, 3) for h in range(0, 24, 5) for u in range(3) for m in range(0, 60, 20 + 5 * u)]
    return pd.DataFrame(rows)


def _days_target(dsn: str, table: str) -> dict[tuple, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT window_start, user_id, clicks FROM {table}").fetchall()
    return {(ws.isoformat(), int(u)): int(c) for ws, u, c in rows}


def test_catchup_backfills_two_daily_partitions_and_a_misaligned_interval_is_refused(
        airflow: tuple[AirflowServer, Path, str]) -> None:
    import re

    server, root, _ = airflow
    dsn = ensure_postgres()
    table = re.search(r'table = "([^"]+)"', (root / "days.toml").read_text()).group(1)
    events = _day_events()
    write_click_file(root / "days" / "in", 0, events.to_dict("records"))
    write_click_file(root / "days" / "in", 1, [{"user_id": 99, "amount": 1.0, "page": "/close",
                                                 "ts": pd.Timestamp("2025-03-04T02:00:00Z")}])
    run_id = server.trigger("ematix_test_days")
    assert server.wait_run("ematix_test_days", run_id, 240) == "success"
    events["start"] = events["ts"].dt.floor("1h")
    truth = {(s.isoformat(), int(u)): len(g) for (s, u), g in events.groupby(["start", "user_id"])}
    assert _days_target(dsn, table) == truth
    with psycopg.connect(dsn, autocommit=True) as conn:  # what a backfill must replace, and what it must leave
        conn.execute(f"UPDATE {table} SET clicks = 999")
    misaligned = server.trigger("ematix_test_misaligned")
    assert server.wait_run("ematix_test_misaligned", misaligned, 90) == "failed"
    ti = server.task("ematix_test_misaligned", misaligned, "backfill")
    assert (ti["state"], ti["try_number"]) == ("failed", 1)
    assert "use 2025-03-01T00:00:00" in server.log("ematix_test_misaligned", misaligned, "backfill")
    response = server.client.patch("/api/v2/dags/ematix_test_backfill", json={"is_paused": False})
    response.raise_for_status()
    server.wait_for(lambda: len(_finished_runs(server, "ematix_test_backfill")) == 2, 240,
                    "the two catchup runs to finish")
    runs = _finished_runs(server, "ematix_test_backfill")
    assert [r["state"] for r in runs] == ["success", "success"], runs
    after = _days_target(dsn, table)
    replaced = {k: v for k, v in truth.items() if k[0] < "2025-03-03"}
    assert {k: v for k, v in after.items() if k[0] < "2025-03-03"} == replaced
    assert {k: v for k, v in after.items() if k[0] >= "2025-03-03"} == {k: 999 for k in truth if k[0] >= "2025-03-03"}
