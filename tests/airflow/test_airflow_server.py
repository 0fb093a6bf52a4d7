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
TEST_DAGS = {"ematix_test_run", "ematix_test_on_output", "ematix_test_sensor", "ematix_test_bad"}

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

DAGS = """
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from ematix_dagster.airflow import EmatixRunOperator, EmatixWatermarkSensor, pipeline_asset

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
"""


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowServer, Path, str]]:
    dsn = ensure_postgres()
    root = tmp_path_factory.mktemp("airflow")
    table = f"public.af_clicks_{secrets.token_hex(3)}"
    (root / "in").mkdir()
    (root / "af_clicks.toml").write_text(PIPELINE.format(root=root, table=table, lateness=10_000))
    (root / "bad.toml").write_text(PIPELINE.format(root=root / "bad", table=table, lateness=-5))
    dags = root / "dags"
    dags.mkdir()
    (dags / "ematix_test_dags.py").write_text(textwrap.dedent(DAGS).format(
        pipeline=str(root / "af_clicks.toml"), bad=str(root / "bad.toml"), until=UNTIL.isoformat()))
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
            conn.execute(f"DROP TABLE IF EXISTS {table}")


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
