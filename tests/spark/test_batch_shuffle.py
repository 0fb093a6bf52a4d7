"""A batch's shuffle (``ematix_dagster/spark/batch_shuffle.py``): one job, one partition after a small batch.

Each case runs a real aggregation on a session of its own and reads how many tasks its final
stage ran (``rdd.getNumPartitions`` of the planned query) and how many Spark jobs it took; the
expected counts follow from the settings alone.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ematix_dagster.spark.batch_shuffle import BatchShuffle


def aggregated(session: SparkSession):
    return session.range(1000).groupBy((F.col("id") % 7).alias("k")).agg(F.count(F.lit(1)).alias("n"))


def jobs(session: SparkSession) -> int:
    tracker = session.sparkContext.statusTracker()
    return len(tracker.getJobIdsForGroup(None))


@pytest.fixture
def own(spark: SparkSession) -> SparkSession:
    """A session of its own with three shuffle partitions (few, on the tests' two cores)."""
    session = spark.newSession()
    session.conf.set("spark.sql.shuffle.partitions", "3")
    return session


def test_a_run_keeps_the_configured_partitions_until_a_batch_was_small(own: SparkSession) -> None:
    shuffle = BatchShuffle()
    shuffle.plan(own)  # the run's first batch: nothing known yet
    assert own.conf.get("spark.sql.adaptive.enabled") == "false"
    assert aggregated(own).rdd.getNumPartitions() == 3
    before = jobs(own)
    assert sorted(r["n"] for r in aggregated(own).collect()) == [142] + [143] * 6
    assert jobs(own) - before == 1  # one job: without adaptive execution's second
    small = pa.table({"k": list(range(7)), "n": [143] * 7})
    shuffle.ran(small)
    shuffle.plan(own)
    assert aggregated(own).rdd.getNumPartitions() == 1
    assert sorted(r["n"] for r in aggregated(own).collect()) == [142] + [143] * 6


def test_a_batch_after_partials_above_the_advisory_size_keeps_the_configured_partitions(own: SparkSession) -> None:
    own.conf.set("spark.sql.adaptive.advisoryPartitionSizeInBytes", "1k")
    shuffle = BatchShuffle()
    shuffle.plan(own)
    assert shuffle.advisory_bytes == 1024
    shuffle.ran(pa.table({"k": list(range(200))}))  # 1,600 bytes
    shuffle.plan(own)
    assert aggregated(own).rdd.getNumPartitions() == 3
    shuffle.ran(pa.table({"k": list(range(100))}))  # 800 bytes
    shuffle.plan(own)
    assert aggregated(own).rdd.getNumPartitions() == 1


def test_many_partitions_leave_adaptive_execution_to_coalesce(own: SparkSession) -> None:
    own.conf.set("spark.sql.shuffle.partitions", "50")
    shuffle = BatchShuffle()
    shuffle.plan(own)
    shuffle.ran(pa.table({"k": [1]}))
    shuffle.plan(own)
    assert own.conf.get("spark.sql.adaptive.enabled") == "true"
    assert own.conf.get("spark.sql.shuffle.partitions") == "50"
