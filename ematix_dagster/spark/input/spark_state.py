"""Spark's window state in a checkpoint, read on demand (``ematix-dagster state PIPELINE.toml --detail``).

With ``[run] window_state = "executors"`` the open windows live in the RocksDB state of the query's
checkpoint, not in the [state_store], which keeps only their size as Spark's progress reported it.
What an operator asks of them (how many windows are open, for which starts, how many groups each)
is read here with Spark's ``statestore`` data source, which reads the state as of the last committed
batch; it never runs during a batch, so it costs nothing while the pipeline runs.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.spark.input import checkpoint
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.kinds.time_units import format_us


def spark_state(spark: SparkSession, spec: PipelineSpec) -> dict[str, Any]:
    """The open state of ``spec``'s checkpoint after its last committed batch: its rows (one per window
    and group; sessions: one per session), the state partitions holding them, the open windows and
    the groups of the first 100 by start."""
    location = spec.run.checkpoint_location
    if not checkpoint.committed_batches(location):
        return {"rows": 0, "partitions": 0, "open_windows": 0, "windows": {}}
    state = spark.read.format("statestore").load(location)
    total = state.agg(F.count(F.lit(1)).alias("rows"), F.countDistinct("partition_id").alias("partitions")).first()
    assert total is not None
    found: dict[str, Any] = {"rows": int(total["rows"]), "partitions": int(total["partitions"])}
    window = _window_column(state)
    if window is not None:
        starts = state.groupBy(F.unix_micros(F.col(f"{window}.start")).alias("start")).count()
        found["open_windows"] = starts.count()
        found["windows"] = {format_us(int(r["start"])): int(r["count"])
                            for r in starts.orderBy("start").limit(100).collect()}
    return found


def _window_column(state: DataFrame) -> str | None:
    """Where the state keeps a row's window (a struct of ``start`` and ``end``): in the key for fixed
    windows, Spark's grouping column; None if neither the key nor the value holds one."""
    for part in ("key", "value"):
        dtype = state.schema[part].dataType
        for field in dtype.fields if isinstance(dtype, T.StructType) else []:
            inner = field.dataType
            if isinstance(inner, T.StructType) and {"start", "end"} <= set(inner.fieldNames()):
                return f"{part}.`{field.name}`"
    return None
