"""``clicks-per-minute`` (PostgreSQL target, its URL from the Airflow Connection ``ematix_pg``):

* ``ematix_clicks_per_minute_stream``: the pipeline running continuously inside one task; clearing or
  marking the task stops the stream at a batch boundary and releases the lease, and a retry after a
  killed task process takes the lease over (the store fences the old writer).
* ``ematix_clicks_per_minute_checks``: the health checks, daily.
* ``ematix_clicks_per_minute_migrate``: the state migration, monthly (skipped while the stream holds
  the lease, naming it).
* ``ematix_clicks_per_minute_backfill``: one ``[backfill]`` partition (a UTC day) per run, with
  catchup: each run waits until the stream has passed its day, then rewrites the day's windows.
  ``airflow backfill create --dag-id ematix_clicks_per_minute_backfill --from-date ... --to-date ...``
  reruns a range of days.
"""

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, CronDataIntervalTimetable

from ematix_dagster.airflow import (
    EmatixBackfillOperator,
    EmatixCheckOperator,
    EmatixMigrateOperator,
    EmatixRunOperator,
    EmatixWatermarkSensor,
)

# the repository holds the pipeline files (EMATIX_HOME overrides it, for a DAGs folder copied elsewhere)
ROOT = Path(os.environ.get("EMATIX_HOME") or Path(__file__).resolve().parents[2])
WORKING_DIR = str(ROOT)
PG_CONN_ID = "ematix_pg"  # the Airflow Connection holding the PostgreSQL URL of ${EMATIX_PG_URL}

PIPELINE = str(ROOT / "pipelines" / "clicks_per_minute.toml")
COMMON: dict[str, Any] = {"pipeline": PIPELINE, "working_dir": WORKING_DIR, "conn_id": PG_CONN_ID}

with DAG(dag_id="ematix_clicks_per_minute_stream", schedule=None, start_date=datetime(2026, 1, 1),
         catchup=False, max_active_runs=1, is_paused_upon_creation=True, tags=["ematix"]):
    EmatixRunOperator(task_id="stream", mode="continuous", retries=5, retry_delay=timedelta(seconds=30),
                      retry_exponential_backoff=True, **COMMON)

with DAG(dag_id="ematix_clicks_per_minute_checks", schedule="@daily", start_date=datetime(2026, 1, 1),
         catchup=False, is_paused_upon_creation=True, tags=["ematix"]):
    EmatixCheckOperator(task_id="check", max_late_row_ratio=0.01, max_watermark_lag_seconds=600, **COMMON)

with DAG(dag_id="ematix_clicks_per_minute_migrate", schedule="@monthly", start_date=datetime(2026, 1, 1),
         catchup=False, is_paused_upon_creation=True, tags=["ematix"]):
    EmatixMigrateOperator(task_id="migrate", **COMMON)

# a data-interval timetable: a plain "@daily" gives runs whose interval is one point in time (Airflow 3)
with DAG(dag_id="ematix_clicks_per_minute_backfill", schedule=CronDataIntervalTimetable("@daily", timezone="UTC"), start_date=datetime(2026, 1, 1),
         catchup=True, max_active_runs=1, is_paused_upon_creation=True, tags=["ematix"]):
    # the stream must have passed the day's last window plus its lateness (10 s) before it is rewritten
    EmatixWatermarkSensor(task_id="wait_for_stream", until="{{ data_interval_end + macros.timedelta(minutes=1) }}",
                          poke_interval=60, timeout=24 * 3600, **COMMON) >> EmatixBackfillOperator(
        task_id="backfill", retries=1, **COMMON)
