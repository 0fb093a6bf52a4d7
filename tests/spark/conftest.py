"""Fixtures of the Spark tests."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from ematix_dagster.spark.plans.executor_plan import EXECUTOR_STATE_CONF


@pytest.fixture
def session(spark: SparkSession) -> SparkSession:
    """A session of its own (same SparkContext) holding the confs of window state on the executors
    (RocksDB, changelog checkpointing, the min watermark policy): the shared one is untouched."""
    own = spark.newSession()
    for key, value in EXECUTOR_STATE_CONF.items():
        own.conf.set(key, value)
    return own
