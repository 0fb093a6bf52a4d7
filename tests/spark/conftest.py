"""Fixtures of the Spark tests."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from ematix_dagster.spark.plans.executor_plan import executor_session


@pytest.fixture
def session(spark: SparkSession) -> SparkSession:
    """A session of its own (same SparkContext) holding the confs of window state on the executors
    (RocksDB, changelog checkpointing, the min watermark policy): the shared one is untouched."""
    return executor_session(spark)
