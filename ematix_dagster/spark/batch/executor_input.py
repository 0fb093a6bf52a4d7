"""A micro-batch's input as the driver mode classifies it, for ``[run] window_state = "executors"``.

In executors mode one streaming query aggregates the windows (``spark.plans.executor_plan``); its
``foreachBatch`` receives only the windows batch N writes. What the driver mode derives from the
batch's rows besides its windows (dead letters, per-source counters, the SQL's filtered rows, the
late rows) is recomputed here from the batch's input read again from the checkpoint
(``spark.input.replayed_batch``) with the driver's own Spark work (``spark.batch.batch_job``), so
that windows, dead letters and counters can commit in one transaction fenced by (query, batch).
Only the counters reach the driver: the batch's partials are totalled per class in Spark
(:func:`class_totals`), so the driver's memory does not grow with the number of groups a batch updates.

Late rows follow Spark's rule, not the driver's: Spark judges batch N's rows by the watermark in
effect during batch N-1 (``batchWatermarkMs`` of offsets N-1; batch 0 by its own, 0):

* tumbling and hopping: a (row, window) assignment is dropped iff the window ends at or before it,
  which is the driver's assignment with that watermark as ``closed_before``
  (``spark.plans.windows.fixed_plan``), so its ``late`` class and counters are Spark's;
* sessions: Spark drops a row iff its own session (``[t, min(t + gap, bucket end)]``) ends at or
  before that watermark, before merging the batch's sessions (:func:`late_sessions`). The driver's
  session rule (a row before the watermark) is another, so the rows are classified without a late
  bound and judged here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ematix_dagster.columns import (
    CLASS,
    EVENT_TS,
    LATE_ASSIGNMENTS,
    REOPENED,
    ROWS,
    SOURCE_MAX_PREFIX,
    SOURCE_ROW,
    SOURCE_ROWS_PREFIX,
    SQL_ERROR,
)
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spark.batch.batch_counts import batch_counts, filtered_rows, sources_of
from ematix_dagster.spark.batch.batch_job import build_batch
from ematix_dagster.spark.batch.batch_step import reason_counts
from ematix_dagster.spark.input import checkpoint
from ematix_dagster.spark.input.replayed_batch import replayed_batch
from ematix_dagster.spark.plans.window_plan import BatchPlan
from ematix_dagster.spark.plans.windows.session_plan import cap_bucket
from ematix_dagster.spec import Window
from ematix_dagster.streaming.kinds import MICROS_PER_MS
from ematix_dagster.streaming.kinds.sessions.session_rules import SessionWindows
from ematix_dagster.streaming.micro_batch import BatchInput, input_counters

#: the window kinds whose late rule is the driver's assignment with Spark's watermark as its bound
_FIXED = ("tumbling", "hopping")


@dataclass(frozen=True)
class BatchWatermarks:
    """The watermarks (ms) of one batch, from the offsets log."""

    late_ms: int  # in effect during the batch before (batch 0: its own): rows are judged late by it
    current_ms: int  # in effect during the batch: a window ending at or before it is written in it


def batch_watermarks(location: str, batch_id: int) -> BatchWatermarks:
    """Batch ``batch_id``'s watermarks, read from ``offsets/N-1`` and ``offsets/N``."""
    current = checkpoint.read_offsets(location, batch_id).watermark_ms
    before = batch_id > 0 and checkpoint.offsets_exist(location, batch_id - 1)
    return BatchWatermarks(checkpoint.read_offsets(location, batch_id - 1).watermark_ms if before else current,
                           current)


@dataclass
class ExecutorBatch:
    """Batch N's input, classified: what its commit needs besides the windows Spark wrote."""

    input: BatchInput  # the driver's per-source stats and class counts (no partials: Spark aggregates)
    watermarks: BatchWatermarks
    #: rows Spark aggregates into at least one window, with the SQL's output columns
    valid: DataFrame
    #: rows Spark drops as late (every window of theirs closed), with the same columns
    late: DataFrame
    #: the driver's dead-letter rows (``_reason`` set), None without ``[dead_letter]`` or without any
    dead_letters: pa.Table | None

    @property
    def counters(self) -> dict[str, int]:
        """What the batch adds to the stored counters, by the driver's names."""
        return input_counters(self.input)


class ExecutorInput:
    """Reads batch N's input again and classifies it; made once per run from its analysed plan
    (``window_plan.analyse``), whose columns every batch applies."""

    def __init__(self, plan: BatchPlan) -> None:
        window = plan.spec.window
        if window.kind not in (*_FIXED, "session"):
            raise PipelineConfigError("transform.window.kind", f"{window.kind} windows are not aggregated by "
                                      'Spark (window_state = "executors")', 'use window_state = "driver"')
        self.plan = plan
        self.columns = [c for c in plan.output_types if c not in (SQL_ERROR, SOURCE_ROW)]

    def read(self, spark: SparkSession, batch_id: int) -> ExecutorBatch:
        """Batch ``batch_id``: ``spark`` is the session of the query's ``foreachBatch`` frame."""
        spec = self.plan.spec
        location = spec.run.checkpoint_location
        batch_time = checkpoint.read_offsets(location, batch_id).batch_timestamp_ms * MICROS_PER_MS
        marks = batch_watermarks(location, batch_id)
        fixed = spec.window.kind in _FIXED
        closed_before = marks.late_ms * MICROS_PER_MS if fixed else None
        frames = build_batch(spark, self.plan, replayed_batch(spark, spec, batch_id), batch_id, batch_time,
                             closed_before, None)
        src, counts = batch_counts(spec, class_totals(frames.partials).toArrow(), frames.source_stats)
        stats = sources_of(spec, src)
        classified = frames.classified()
        counted = classified.filter(F.col(CLASS).isNull()).select(*self.columns)
        if fixed:
            valid, late = counted, classified.filter(F.col(CLASS) == "late").select(*self.columns)
            late_rows, late_assignments = counts["late_rows"], counts["late_assignments"]
        else:
            valid, late = late_sessions(spec.window, counted, marks.late_ms)
            late_rows, late_assignments = late.count(), 0
        letters = None if spec.dead_letter is None else \
            frames.dead_letter_table(stats, late_rows, counts["rejected"], late_to_dlq=False)
        batch = BatchInput(batch_id, batch_time, stats, late_rows=late_rows, late_assignments=late_assignments,
                           rejected=counts["rejected"], dead_letters=reason_counts(letters) if letters else {},
                           filtered=filtered_rows(stats, counts["rows"]) if spec.transform_sql else 0)
        return ExecutorBatch(batch, marks, valid, late, letters)


def class_totals(partials: DataFrame) -> DataFrame:
    """The counter columns ``batch_counts`` reads from a batch's partials (rows, late assignments,
    reopened rows and each source's rows: summed; each source's newest event time: the max), totalled
    per class in Spark: a row per class instead of one per (window, group), which ``batch_counts``
    reads to the same counters."""
    sums = [c for c in partials.columns if c in (ROWS, LATE_ASSIGNMENTS, REOPENED) or c.startswith(SOURCE_ROWS_PREFIX)]
    maxes = [c for c in partials.columns if c.startswith(SOURCE_MAX_PREFIX)]
    return partials.groupBy(CLASS).agg(*(F.sum(c).alias(c) for c in sums), *(F.max(c).alias(c) for c in maxes))


def late_sessions(window: Window, rows: DataFrame, late_ms: int) -> tuple[DataFrame, DataFrame]:
    """``rows`` split by Spark's session late rule: (those it aggregates, those it drops).

    Found on Spark 4.3 (tests/spark/test_executor_input.py): a row is dropped iff its *own* session,
    ``[t, min(t + gap, bucket end)]`` (the capped gap of ``executor_plan``), ends at or before
    ``late_ms``, whatever the session its batch's rows of the key merge into: Spark judges the
    rows' sessions before it merges them.
    """
    rules = SessionWindows.for_window(window)
    ts = F.unix_micros(EVENT_TS)
    end = F.least(ts + F.lit(rules.gap), (cap_bucket(rules.cap) + F.lit(1)) * F.lit(rules.cap))
    late = end <= F.lit(late_ms * MICROS_PER_MS)
    return rows.filter(~late), rows.filter(late)
