"""The columns every batch of a run applies, built once when the query starts.

Each row's pre-SQL reason (invalid / future / malformed event time), the rejections' reason, the
per-source counters (observed on a SQL's input, or hidden aggregates of the partials without one)
and the window kind's plan (``ematix_dagster.spark.plans.windows``), which assigns windows and
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
    PRIMARY,
    REASON,
    SOURCE,
    SOURCE_MAX_PREFIX,
    SOURCE_ROWS_PREFIX,
    TS,
)
from ematix_dagster.spark.batch.reasons import Rule, reason_column
from ematix_dagster.spark.batch.rejects import REJECT_REASONS, reject_rules
from ematix_dagster.spark.plans.windows import PartialPlan, partial_plan
from ematix_dagster.spark.plans.windows.driver_late import CountedAggregates, DriverLatePlan
from ematix_dagster.spark.plans.windows.kind_plan import Aggregates
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.kinds import MICROS_PER_MS


def pre_sql_rules(spec: PipelineSpec, future_in_spark: bool = True) -> list[Rule]:
    """Why a row updates nothing before the SQL (malformed, invalid event time, future); the future
    rule reads the batch time column and each source's skew."""
    rules: list[Rule] = [(F.col(CORRUPT).isNotNull(), "malformed"), (F.col(EVENT_TS).isNull(), "invalid_event_time")]
    if future_in_spark:
        skew = F.lit(None).cast("bigint")
        for s in spec.sources:
            skew = F.when(F.col(SOURCE) == s.name, F.lit(s.max_future_skew_ms * MICROS_PER_MS)).otherwise(skew)
        rules.append((F.unix_micros(EVENT_TS) > F.col(BATCH_TIME) + skew, "future"))
    return rules


def pre_sql_reason(spec: PipelineSpec) -> Column:
    """A row's pre-SQL reason to update nothing (:func:`pre_sql_rules`), NULL for a valid row."""
    return reason_column(pre_sql_rules(spec))


@dataclass(frozen=True)
class BatchColumns:
    """The columns every batch of a run applies, built once (each Column is a round trip to the
    JVM: built per batch, they were several hundred round trips a batch)."""

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
              partial_columns: Callable[[Column], Aggregates]) -> "BatchColumns":
        """A run's columns from its plan's facts (``ematix_dagster.spark.plans.window_plan.BatchPlan``: the SQL's
        output types and its aggregations' partial columns)."""
        before_sql = pre_sql_rules(spec)
        rules = window_rules(spec, output_types, before_sql)
        reason = F.col(REASON)
        timed = reason.isNull() | reason.isin(*REJECT_REASONS)  # a rejected row's event time is valid
        aggregates = counted_aggregates(spec, partial_columns)
        return cls(processing_time=F.timestamp_micros(F.col(BATCH_TIME)),
                   classified=[F.unix_micros(EVENT_TS).alias(TS), reason_column(before_sql).alias(REASON)],
                   source_stats=source_stats(spec) if spec.transform_sql else [],
                   valid=reason.isNull(), reason=reason_column(rules) if rules else None,
                   windows=partial_plan(spec.window, lambda gate: aggregates(gate, timed), bool(rules)))


def window_rules(spec: PipelineSpec, output_types: dict[str, T.DataType], before_sql: list[Rule]) -> list[Rule]:
    """Why a row of the window plan's input updates no window: with a SQL the rejections' rules,
    without one ``before_sql`` (:func:`pre_sql_rules`), then the rejections' (a row has one reason)."""
    rejected = reject_rules(spec, output_types)
    return rejected if spec.transform_sql else [*before_sql, *rejected]


def counted_aggregates(spec: PipelineSpec, partial_columns: Callable[[Column], Aggregates]) -> CountedAggregates:
    """The aggregates of a batch given which rows update windows and which rows' event times count
    towards their source's newest: the aggregations' partials, and without a SQL the per-source
    counters (with a SQL they are observed before it)."""
    def aggregates(gate: Column, timed: Column) -> Aggregates:
        found = partial_columns(gate)
        return Aggregates(found.inputs, found.columns + ([] if spec.transform_sql else _source_counts(spec, timed)))

    return aggregates


def driver_late_plan(spec: PipelineSpec, output_types: dict[str, T.DataType],
                     partial_columns: Callable[[Column], Aggregates]) -> DriverLatePlan:
    """The tumbling plan that needs no batch values (``BatchPlan.late_on_driver``): no future rule."""
    return DriverLatePlan(spec.window, window_rules(spec, output_types, pre_sql_rules(spec, future_in_spark=False)),
                          counted_aggregates(spec, partial_columns))


def source_stats(spec: PipelineSpec) -> list[Column]:
    """Per-source counters as aggregates over the batch's classified rows (``_ts``, ``_reason``;
    one result row), as ``spark.batch.batch_counts`` and the row step read them."""
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


def _source_counts(spec: PipelineSpec, timed: Column) -> list[Column]:
    """Per-source rows and newest event time of the ``timed`` rows as hidden aggregates of the
    partials (no SQL).

    Each class row (``invalid_event_time``, ``future``, ``malformed``, ``late``) then holds that
    class's rows per source; one source needs no source column (``ROWS`` counts its rows).
    """
    several = len(spec.sources) > 1
    cols: list[Column] = []
    for i, s in enumerate(spec.sources):
        mine = F.col(PRIMARY) & (F.col(SOURCE) == s.name) if several else F.col(PRIMARY)
        if several:
            cols.append(F.count_if(mine).alias(f"{SOURCE_ROWS_PREFIX}{i}"))
        cols.append(F.max(F.when(mine & timed, F.col(TS))).alias(f"{SOURCE_MAX_PREFIX}{i}"))
    return cols

