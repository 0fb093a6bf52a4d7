"""The columns every batch of a run applies, built once when the query starts.

Each row's pre-SQL reason (invalid / future / malformed event time), the rejections' reason, the
per-source counters (observed on a SQL's input, or hidden aggregates of the partials without one)
and the window kind's plan (``ematix_dagster.spark.windows``), which assigns windows and
pre-aggregates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.columns import (
    BATCH_TIME,
    CORRUPT,
    EVENT_TS,
    HEARTBEAT,
    PRIMARY,
    REASON,
    SOURCE,
    SOURCE_MAX_PREFIX,
    SOURCE_ROWS_PREFIX,
    TS,
)
from ematix_dagster.spark.rejects import REJECT_REASONS, reject_reason
from ematix_dagster.spark.windows import PartialPlan, partial_plan
from ematix_dagster.spark.windows.base import Aggregates
from ematix_dagster.spark.windows.fixed import FixedPlan
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.windows import MICROS_PER_MS


def _reason(ts: Column, future_after: Column | None) -> Column:
    reason = (F.when(F.col(CORRUPT).isNotNull(), F.lit("malformed"))
              .when(F.col(EVENT_TS).isNull(), F.lit("invalid_event_time")))
    return reason if future_after is None else reason.when(ts > future_after, F.lit("future"))


def pre_sql_reason(spec: PipelineSpec, future_in_spark: bool = True) -> Column:
    """A row's pre-SQL reason to update nothing (malformed, invalid event time, future), NULL for a
    valid row; the future check reads the batch time column and each source's skew."""
    skew = F.lit(None).cast("bigint")
    for s in spec.sources:
        skew = F.when(F.col(SOURCE) == s.name, F.lit(s.max_future_skew_ms * MICROS_PER_MS)).otherwise(skew)
    return _reason(F.unix_micros(EVENT_TS), F.col(BATCH_TIME) + skew if future_in_spark else None)


@dataclass(frozen=True)
class BatchColumns:
    """The columns every batch of a run applies, built once (each Column is a round trip to the
    JVM: built per batch, they were several hundred round trips a batch)."""

    data: Column  # not a heartbeat row
    processing_time: Column  # ``_event_ts`` under processing time: the batch time
    classified: list[Column]  # ``_ts`` and ``_reason`` (the pre-SQL reason a row updates no window)
    source_stats: list[Column]  # with a SQL: the per-source counters, observed on its input
    valid: Column  # no pre-SQL reason
    #: the ``_reason`` the window plan reads: with a SQL the rejections' (None when no rule applies),
    #: without one the pre-SQL reason, then the rejections' (a row has one reason)
    reason: Column | None
    windows: PartialPlan  # the window kind's plan

    @classmethod
    def build(cls, spec: PipelineSpec, output_types: dict[str, T.DataType],
              partial_columns: Callable[[Column], Aggregates], future_in_spark: bool = True) -> "BatchColumns":
        """A run's columns from its plan's facts (``ematix_dagster.spark.plan.BatchPlan``: the SQL's
        output types and its aggregations' partial columns).

        ``future_in_spark=False``: no future check and a tumbling plan without batch values
        (``BatchPlan.late_on_driver``)."""
        ts = F.unix_micros(EVENT_TS)
        before_sql = pre_sql_reason(spec, future_in_spark)
        rejected = reject_reason(spec, output_types)
        reason = rejected
        if not spec.transform_sql:
            reason = before_sql if rejected is None else F.coalesce(before_sql, rejected)

        def aggregates(gate: Column) -> Aggregates:
            found = partial_columns(gate)
            return Aggregates(found.inputs, found.columns + ([] if spec.transform_sql else _source_counts(spec)))

        has_reason = not spec.transform_sql or rejected is not None
        return cls(data=F.col(SOURCE) != HEARTBEAT, processing_time=F.timestamp_micros(F.col(BATCH_TIME)),
                   classified=[ts.alias(TS), before_sql.alias(REASON)],
                   source_stats=source_stats(spec) if spec.transform_sql else [],
                   valid=F.col(REASON).isNull(), reason=reason,
                   windows=partial_plan(spec.window, aggregates, has_reason) if future_in_spark
                   else FixedPlan(spec.window, aggregates, has_reason, late_in_spark=False))


def source_stats(spec: PipelineSpec) -> list[Column]:
    """Per-source counters as aggregates over the batch's classified rows (``_ts``, ``_reason``;
    one result row), as ``spark.batch_counts`` and the row step read them."""
    stats: list[Column] = []
    for i, s in enumerate(spec.sources):
        mine = F.col(SOURCE) == s.name
        stats += [
            F.count_if(mine).alias(f"rows_{i}"),
            F.max(F.when(mine & F.col(REASON).isNull(), F.col(TS))).alias(f"max_{i}"),
            F.count_if(mine & (F.col(REASON) == "invalid_event_time")).alias(f"invalid_{i}"),
            F.count_if(mine & (F.col(REASON) == "future")).alias(f"future_{i}"),
            F.count_if(mine & (F.col(REASON) == "malformed")).alias(f"malformed_{i}"),
        ]
    return stats


def _source_counts(spec: PipelineSpec) -> list[Column]:
    """Per-source rows and newest valid event time as hidden aggregates of the partials (no SQL).

    Each class row (``invalid_event_time``, ``future``, ``malformed``, ``late``) then holds that
    class's rows per source; one source needs no source column (``ROWS`` counts its rows).
    """
    several = len(spec.sources) > 1
    cols: list[Column] = []
    for i, s in enumerate(spec.sources):
        mine = F.col(PRIMARY) & (F.col(SOURCE) == s.name) if several else F.col(PRIMARY)
        if several:
            cols.append(F.count_if(mine).alias(f"{SOURCE_ROWS_PREFIX}{i}"))
        # a rejected row (post-SQL reasons) has a valid event time: it moves the watermark
        valid = F.col(REASON).isNull() | F.col(REASON).isin(*REJECT_REASONS)
        cols.append(F.max(F.when(mine & valid, F.col(TS))).alias(f"{SOURCE_MAX_PREFIX}{i}"))
    return cols

