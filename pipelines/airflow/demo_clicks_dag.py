"""The demo pipeline every 5 minutes: each run reads the clicks that arrived since the last one
(``available_now``) and stops; one run at a time (the pipeline's lease would skip a second one)."""

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from ematix_dagster.airflow import EmatixRunOperator

# the repository holds the pipeline files (EMATIX_HOME overrides it, for a DAGs folder copied elsewhere)
ROOT = Path(os.environ.get("EMATIX_HOME") or Path(__file__).resolve().parents[2])
WORKING_DIR = str(ROOT)

with DAG(
    dag_id="ematix_demo_clicks",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=True,
    tags=["ematix"],
    doc_md=__doc__,
):
    EmatixRunOperator(task_id="run", pipeline=str(ROOT / "pipelines" / "demo_clicks.toml"), mode="available_now",
                      working_dir=WORKING_DIR, retries=2, retry_delay=timedelta(seconds=30))
