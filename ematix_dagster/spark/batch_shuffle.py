"""How a micro-batch's Spark job shuffles its partial aggregation: one job, as few tasks as fit.

Adaptive execution runs each query stage as a job of its own (the partial aggregation's shuffle,
the result: two jobs where one would do), and each job costs about as much CPU as aggregating
30,000 rows (measured: 0.08 CPU s per query). What it would buy here is coalescing many small
shuffle partitions, so it stays on where the session has many (``spark.sql.shuffle.partitions``
above :data:`FEW_PARTITIONS_PER_CORE` per core). Where it is off, the coalescing it would have
done is done from the previous batch instead: a batch whose partials came to no more than
adaptive execution's advisory partition size (``spark.sql.adaptive.advisoryPartitionSizeInBytes``,
64 MB unless set) shuffles into one partition, so the final aggregation is one task, not one per
configured partition (measured on 20 batches of 100,000 rows, 2 partitions: 0.2 CPU s of task time
fewer in 1.5). A batch after a larger one, and a run's first batch, keep the configured count.

The settings are the query's own: foreachBatch hands over the stream's cloned session, not the
user's, so they are set on it every batch (a restarted query clones a new one).
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import SparkSession

#: the most shuffle partitions per core for which a batch's query runs without adaptive execution
FEW_PARTITIONS_PER_CORE = 2
ADVISORY_SIZE = "spark.sql.adaptive.advisoryPartitionSizeInBytes"


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
                jvm = session.sparkContext._jvm
                assert jvm is not None  # a classic session on the driver
                self.advisory_bytes = int(jvm.org.apache.spark.network.util.JavaUtils.byteStringAsBytes(
                    conf.get(ADVISORY_SIZE) or "64MB"))
        if not self.few:
            return
        conf.set("spark.sql.adaptive.enabled", "false")
        small = self.last_bytes is not None and self.last_bytes <= self.advisory_bytes
        conf.set("spark.sql.shuffle.partitions", str(1 if small else self.configured))

    def ran(self, partials: pa.Table) -> None:
        """The batch's partials came back: they size the next batch's shuffle."""
        self.last_bytes = partials.nbytes
