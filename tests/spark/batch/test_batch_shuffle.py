"""A batch's shuffle (``ematix_dagster/spark/batch/batch_shuffle.py``): one job, one partition after a small batch,
no shuffle for a batch of few bytes of files the engine reads itself.

Each case runs a real aggregation on a session of its own and reads how many tasks its final
stage ran (``rdd.getNumPartitions`` of the planned query), how many Spark jobs it took and how
many exchanges Spark planned; the expected counts follow from the settings alone, and the rows
from pandas over the files.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
import tomli_w
from prometheus_client import CollectorRegistry
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.batch.batch_shuffle import BatchShuffle
from ematix_dagster.spark.input.input_files import BatchFiles, InputFiles, inspect_parquet
from ematix_dagster.spark.sources.readers import parse_schema, union_sources
from ematix_dagster.spec import load_pipeline_str
from tests.spark.input.unreadable_inputs import WINDOW, Input, rows, source


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


# -- a batch of few bytes of files the engine reads itself: one task, no shuffle -----------------------


def _batch_frame(session: SparkSession, tmp: Path, sizes: list[int], csv_too: bool = False):
    """The frame ``InputFiles`` plans for one batch of parquet files of ``sizes`` rows each (and a
    csv source Spark streams beside them), with the rows it must hold."""
    files = Input(tmp / "in")
    for i, n in enumerate(sizes):
        files.micros(rows(100 * i, n))
    sources = [source(tmp / "in")]
    if csv_too:
        (tmp / "c").mkdir()
        sources.append({"name": "c", "kind": "files", "format": "csv", "path": str(tmp / "c"),
                        "schema": "id BIGINT, k STRING, v BIGINT, at STRING", "event_time_column": "at"})
    spec = load_pipeline_str(tomli_w.dumps({
        "pipeline_name": "one-task", "sources": sources, "transform": {"window": WINDOW},
        "target": {"kind": "parquet", "path": str(tmp / "out")}, "state_store": {"kind": "in_memory"},
        "run": {"checkpoint_location": str(tmp / "cp")}}))
    listed = [inspect_parquet(p.as_uri(), parse_schema(spec.sources[0], "sources[0]"))
              for p in sorted((tmp / "in").glob("*.parquet"))]
    reader = InputFiles(spec, StreamingMetrics(CollectorRegistry()).unreadable_files, lambda _line: None)
    streamed = session.createDataFrame([], union_sources(session, spec).schema)  # the batch's rows of csv: none
    frame = reader.frame(streamed, BatchFiles(0, {0: listed}))
    return frame, sum(map(len, files.readable))


def exchanges(df: DataFrame) -> int:
    return df._jdf.queryExecution().executedPlan().toString().count("Exchange")


def test_a_batch_of_few_bytes_is_read_in_one_task_and_aggregated_without_a_shuffle(own, tmp_path: Path) -> None:
    frame, n = _batch_frame(own, tmp_path, [40, 30, 20])
    assert frame.rdd.getNumPartitions() == 1
    counted = frame.groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("v"))
    assert exchanges(counted) == 0
    expected = pd.concat([rows(0, 40), rows(100, 30), rows(200, 20)]).groupby("k").agg(n=("id", "size"), v=("v", "sum"))
    assert {r["k"]: (r["n"], r["v"]) for r in counted.collect()} == \
        {k: (int(r.n), int(r.v)) for k, r in expected.iterrows()}
    assert frame.count() == n == 90


def test_files_above_the_cost_of_opening_one_keep_sparks_split(own, tmp_path: Path) -> None:
    own.conf.set("spark.sql.files.openCostInBytes", "1k")  # below the three files' bytes together
    frame, _ = _batch_frame(own, tmp_path, [40, 30, 20])
    assert frame.rdd.getNumPartitions() == 3, "Spark's own split: a task per file"
    assert exchanges(frame.groupBy("k").count()) == 1


def test_a_batch_with_rows_spark_streams_keeps_sparks_plan(own, tmp_path: Path) -> None:
    frame, _ = _batch_frame(own, tmp_path, [40], csv_too=True)
    assert exchanges(frame.groupBy("k").count()) == 1
