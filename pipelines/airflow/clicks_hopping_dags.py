"""A producer and two consumers of ``clicks-hopping-5min``'s Parquet output.

* ``ematix_clicks_hopping_5min`` runs the pipeline every 10 minutes (``available_now``); its outlet is
  the target's Asset.
* ``ematix_clicks_hopping_on_update`` is scheduled on that Asset: it runs after every successful run.
* ``ematix_clicks_hopping_hourly_report`` waits (deferred, no worker slot) until the target is complete
  up to the end of its data interval, then reports the rows of that hour.
"""

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, CronDataIntervalTimetable, task

from ematix_dagster.airflow import EmatixRunOperator, EmatixWatermarkSensor, pipeline_asset

# the repository holds the pipeline files (EMATIX_HOME overrides it, for a DAGs folder copied elsewhere)
ROOT = Path(os.environ.get("EMATIX_HOME") or Path(__file__).resolve().parents[2])
WORKING_DIR = str(ROOT)

PIPELINE = str(ROOT / "pipelines" / "clicks_hopping_5min.toml")
OUTPUT = pipeline_asset(PIPELINE, WORKING_DIR)


@task
def count_rows(start: str | None = None, end: str | None = None) -> int:
    """Rows of the Parquet output whose window starts in [start, end) (all rows without bounds)."""
    import pyarrow.dataset as ds

    from ematix_dagster.spec import load_pipeline

    spec = load_pipeline(PIPELINE)
    table = ds.dataset(f"{WORKING_DIR}/{spec.target.path}", format="parquet").to_table()
    if start is not None and end is not None:
        frame = table.to_pandas()
        column = frame[spec.window.window_start_column]
        table = frame[(column >= start) & (column < end)]
    return len(table)


with DAG(dag_id="ematix_clicks_hopping_5min", schedule=timedelta(minutes=10), start_date=datetime(2026, 1, 1),
         catchup=False, max_active_runs=1, is_paused_upon_creation=True, tags=["ematix"]):
    EmatixRunOperator(task_id="run", pipeline=PIPELINE, working_dir=WORKING_DIR, retries=2,
                      retry_delay=timedelta(seconds=30))

with DAG(dag_id="ematix_clicks_hopping_on_update", schedule=[OUTPUT], start_date=datetime(2026, 1, 1),
         catchup=False, is_paused_upon_creation=True, tags=["ematix"]):
    count_rows()

with DAG(dag_id="ematix_clicks_hopping_hourly_report", schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"), start_date=datetime(2026, 1, 1),
         catchup=False, max_active_runs=2, is_paused_upon_creation=True, tags=["ematix"]):
    EmatixWatermarkSensor(task_id="wait_for_output", pipeline=PIPELINE, working_dir=WORKING_DIR,
                          until="{{ data_interval_end }}", poke_interval=60, timeout=6 * 3600,
                          ) >> count_rows(
        "{{ data_interval_start }}", "{{ data_interval_end }}")
