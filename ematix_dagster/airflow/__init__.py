"""Run and watch pipelines from Apache Airflow 3 (written against ``airflow.sdk``; docs/airflow.md).

* :class:`EmatixRunOperator`: runs a pipeline in the task (``available_now`` to the end of its input,
  or ``continuous``); outlet: its target's Asset.
* :class:`EmatixWatermarkSensor`: defers until the target is complete up to a time (the triggerer
  polls the state store, no Spark).
* :class:`EmatixCheckOperator`, :class:`EmatixMigrateOperator`: the health checks and the state
  migration.
* :class:`EmatixBackfillOperator`: rewrites a data interval of whole ``[backfill]`` partitions.
* :func:`pipeline_asset`: the Asset a downstream DAG schedules on.

Credentials come from an Airflow Connection (``conn_id``) into the pipeline's ``${EMATIX_PG_URL}``.
This package imports nothing of :mod:`ematix_dagster.dagster`.
"""

from ematix_dagster.airflow.assets import pipeline_asset, source_assets
from ematix_dagster.airflow.operators import (
    EmatixBackfillOperator,
    EmatixCheckOperator,
    EmatixMigrateOperator,
    EmatixRunOperator,
)
from ematix_dagster.airflow.sensors import EmatixWatermarkSensor
from ematix_dagster.airflow.triggers import WatermarkTrigger

__all__ = ["EmatixBackfillOperator", "EmatixCheckOperator", "EmatixMigrateOperator", "EmatixRunOperator",
           "EmatixWatermarkSensor", "WatermarkTrigger", "pipeline_asset", "source_assets"]
