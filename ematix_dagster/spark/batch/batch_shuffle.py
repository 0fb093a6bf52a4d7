"""How a micro-batch's Spark job shuffles its partial aggregation: one job, as few tasks as fit.

Adaptive execution runs each query stage as a job of its own (the partial aggregation's shuffle,
the result: two jobs where one would do), and each job costs about as much CPU as aggregating
tens of thousands of rows. What it would buy here is coalescing many small
shuffle partitions, so it stays on where the session has many (``spark.sql.shuffle.partitions``
above :data:`FEW_PARTITIONS_PER_CORE` per core). Where it is off, the coalescing it would have
done is done from the previous batch instead: a batch whose partials came to no more than
adaptive execution's advisory partition size (``spark.sql.adaptive.advisoryPartitionSizeInBytes``,
64 MB unless set) shuffles into one partition, so the final aggregation is one task, not one per
configured partition. A batch after a larger one, and a run's first batch, keep the configured count.

The settings are the query's own: foreachBatch hands over the stream's cloned session, not the
user's, so they are set on it every batch (a restarted query clones a new one).

A batch whose whole input is a few local files the engine reads itself (``spark.input.input_files``),
together no larger than Spark's cost of opening one file (``spark.sql.files.openCostInBytes``, 4 MB
unless set: the bytes Spark reckons it reads in the time an open takes), is read in one task
(``InputFiles.frame``, up to :func:`one_task_bytes`): the scan then reports a single partition,
which every aggregation and window function accepts as it is, so the batch's job has no shuffle at
all, and its partial and final aggregation collapse into one. Spark would read one such file in one
task anyway; what goes is the shuffle's write, its read and its second stage (figures:
benchmarks/README.md, "Measurements behind the code"). Larger inputs keep Spark's split, so a big
batch (a backfill) still reads on every core.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import SparkSession

#: the most shuffle partitions per core for which a batch's query runs without adaptive execution
FEW_PARTITIONS_PER_CORE = 2
ADVISORY_SIZE = "spark.sql.adaptive.advisoryPartitionSizeInBytes"
OPEN_COST = "spark.sql.files.openCostInBytes"


def conf_bytes(session: SparkSession, key: str, default: str) -> int:
    """A size setting of ``session`` in bytes, as Spark reads it ("64MB", "4194304")."""
    jvm = session.sparkContext._jvm
    assert jvm is not None  # a classic session on the driver
    return int(jvm.org.apache.spark.network.util.JavaUtils.byteStringAsBytes(session.conf.get(key) or default))


def one_task_bytes(session: SparkSession) -> int:
    """The most bytes of files a batch reads in one task: the session's cost of opening a file."""
    return conf_bytes(session, OPEN_COST, "4MB")


class BatchShuffle:
    """One run's shuffle settings: read from the session at the first batch, applied every batch."""

    def __init__(self) -> None:
        self.configured: int | None = None  # spark.sql.shuffle.partitions as the session had it
        self.few = False  # few enough to run without adaptive execution
        self.advisory_bytes = 0
        self.last_bytes: int | None = None  # the previous batch's partials, as Arrow held them

    def plan(self, session: SparkSession) -> None:
        """Set the batch's query up on ``session`` before it is planned."""
        conf = session.conf
        if self.configured is None:
            self.configured = int(conf.get("spark.sql.shuffle.partitions") or 200)
            self.few = self.configured <= FEW_PARTITIONS_PER_CORE * session.sparkContext.defaultParallelism
            if self.few:
                self.advisory_bytes = conf_bytes(session, ADVISORY_SIZE, "64MB")
        if not self.few:
            return
        conf.set("spark.sql.adaptive.enabled", "false")
        small = self.last_bytes is not None and self.last_bytes <= self.advisory_bytes
        conf.set("spark.sql.shuffle.partitions", str(1 if small else self.configured))

    def ran(self, partials: pa.Table) -> None:
        """The batch's partials came back: they size the next batch's shuffle."""
        self.last_bytes = partials.nbytes
