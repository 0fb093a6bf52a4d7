"""The streaming aggregation Spark runs when window state lives on the executors (``[run] window_state =
"executors"``): Spark's own stateful windowed aggregation, in append mode, on the RocksDB state store.

Each window is written once, ``final``, in the micro-batch whose watermark reaches its end; nothing of
it is held on the driver. The verified Spark 4.3 behaviours this builds on are the module docstring of
``tests/spark/test_executor_state_spike.py``. What the plan gives:

* each source's rows get ``withWatermark(_event_ts, lateness)`` before the SQL and the union
  (``executor_rows``), and the session
  runs under :data:`EXECUTOR_STATE_CONF` (``multipleWatermarkPolicy = min``), so the watermark is the
  contract's min over the sources of (newest event time - ``lateness_ms``);
* tumbling and hopping windows are Spark's ``window``: the same bounds, the same per-(row, window)
  late rule (``end <= W_prev``) and the same emission (``end <= W``) as the driver;
* sessions are Spark's ``session_window`` per (group key, cap bucket), each row's gap cut at its
  bucket's end so that a session's end is the contract's ``min(last + gap, bucket end)``;
* every aggregation is the driver's own partial expression (``streaming.aggregators``), so the values
  are the driver's: the same NULL, NaN and tie rules, the same canonical input to ``hll_sketch_agg``.

Where Spark cannot follow the contract, ``spec.window_state.executor_refusals`` says so, key by key.
"""

from __future__ import annotations

from functools import reduce
from typing import Final, Mapping

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.columns import BUCKET, EMIT_KIND, EVENT_TS, FINAL, PARTIAL_PREFIX, TS, WINDOW
from ematix_dagster.spark.plans.aggregation_input import INTEGRAL, AggregationInput
from ematix_dagster.spark.plans.window_plan import BatchPlan
from ematix_dagster.spark.plans.windows.session_plan import cap_bucket
from ematix_dagster.spec import Aggregation, PipelineSpec, Window
from ematix_dagster.streaming.aggregators import Aggregator
from ematix_dagster.streaming.aggregators.aggregator import BIGINT_MAX, BIGINT_MIN
from ematix_dagster.streaming.kinds.sessions.session_rules import SessionWindows

#: SQL confs of the session a query of this plan starts on (``spark.newSession()``): they are
#: session-level and copied into the query at ``start()``, and a checkpoint keeps the provider and
#: the watermark policy it was created with (its offset log), so they are set before the first run
EXECUTOR_STATE_CONF: Final[dict[str, str]] = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.multipleWatermarkPolicy": "min",
}

#: the SQL confs of the session a query is started from that its own session keeps
_INHERITED_CONF = ("spark.sql.shuffle.partitions", "spark.sql.session.timeZone",
                   "spark.sql.execution.arrow.pyspark.enabled")


def executor_session(spark: SparkSession) -> SparkSession:
    """A session of ``spark``'s SparkContext for one executors-mode query: :data:`EXECUTOR_STATE_CONF`
    set on it alone (a Dagster code location runs pipelines of both modes in one JVM), with the
    parent's shuffle partitions (the number of state partitions, fixed by the checkpoint's first
    run), time zone and Arrow setting."""
    own = spark.newSession()
    for key in _INHERITED_CONF:
        value = spark.conf.get(key)
        if value is not None:
            own.conf.set(key, value)
    for key, value in EXECUTOR_STATE_CONF.items():
        own.conf.set(key, value)
    return own


#: the start of the message a sum leaving BIGINT fails the query with (Spark's ``raise_error``)
SUM_OVERFLOW = "AggregationOverflow: integer sum left the BIGINT range"
#: the start of the message an exact distinct count over its cap fails the query with
DISTINCT_CAP = "StateCapExceeded: max_distinct_values_per_group reached"


def executor_aggregation(spec: PipelineSpec, sources: Mapping[str, DataFrame]) -> DataFrame:
    """The windows of ``sources`` (source name -> its streaming rows valid for aggregation, with
    ``_event_ts`` and its watermark: ``executor_rows.aggregation_rows``) as Spark's stateful
    aggregation, to be written in append mode.

    Its columns are the driver's output columns of a ``final`` row except those that need the
    batch's rows together (``session_id``, ``_emit_seq``: ``spark.batch.executor_call`` adds them):
    the window bounds, the group columns, the aggregations in declared order and ``_emit_kind``
    (always ``final``).
    """
    window = spec.window
    rows = reduce(DataFrame.unionByName, sources.values())
    plan = BatchPlan(spec=spec, output_types={f.name: f.dataType for f in rows.schema.fields})
    keys = [_window(window).alias(WINDOW), *[F.col(g) for g in window.group_by]]
    if window.kind == "session":
        keys.append(cap_bucket(SessionWindows.for_window(window).cap).alias(BUCKET))
    partials, finals = _aggregates(plan)
    grouped = rows.withColumn(TS, F.unix_micros(EVENT_TS)).groupBy(*keys).agg(*partials)
    start, end = F.col(f"{WINDOW}.start"), F.col(f"{WINDOW}.end")
    return grouped.select(start.alias(window.window_start_column), end.alias(window.window_end_column),
                          *window.group_by, *finals, F.lit(FINAL).alias(EMIT_KIND))


def _window(window: Window) -> Column:
    """The row's windows as Spark's window struct (``start``, ``end``), by the spec's kind."""
    if window.kind == "session":
        return F.session_window(EVENT_TS, _capped_gap(SessionWindows.for_window(window)))
    size = f"{window.duration_ms} milliseconds"
    if window.kind == "hopping":
        return F.window(EVENT_TS, size, f"{window.hop_ms} milliseconds")
    return F.window(EVENT_TS, size)


def _capped_gap(rules: SessionWindows) -> Column:
    """Each row's gap, cut at its cap bucket's end: its session ``[t, min(t + gap, bucket end)]``, so
    a merged session ends at the contract's ``min(last + gap, bucket end)``; rows of one bucket join
    exactly when they are at most ``gap`` apart (a row is before its bucket's end). Grouping by the
    bucket keeps a row at a bucket's start out of the session the bucket before ends at it."""
    ts = F.unix_micros(EVENT_TS)
    bucket_end = (cap_bucket(rules.cap) + F.lit(1)) * F.lit(rules.cap)
    micros = F.least(F.lit(rules.gap), bucket_end - ts)
    # session_window takes a CalendarInterval gap; decimal division keeps the microseconds exact
    return F.make_interval(secs=(micros.cast("decimal(38,0)") / F.lit(1_000_000)).cast("decimal(18,6)"))


def _aggregates(plan: BatchPlan) -> tuple[list[Column], list[Column]]:
    """Every aggregation's buffer columns (named ``_p<i>`` and the aggregator's suffixes) and its
    output column (named its ``as``), read from the buffers once the window is written."""
    window = plan.spec.window
    partials: list[Column] = []
    finals: list[Column] = []
    for i, (agg, aggregator) in enumerate(zip(window.aggregations, plan.aggregators)):
        names = aggregator.partial_names(f"{PARTIAL_PREFIX}{i}")
        dtype = plan.output_types[agg.column] if agg.column else None
        partials += [expr.alias(name) for expr, name in zip(_partials(agg, aggregator, dtype), names)]
        finals.append(_final(plan, agg, dtype, [F.col(n) for n in names]).alias(agg.as_))
    return partials, finals


def _partials(agg: Aggregation, aggregator: Aggregator, dtype: T.DataType | None) -> list[Column]:
    """The driver's partial expressions: the same values, rules and canonical distinct input. A
    decimal sum is summed at the output's DECIMAL(38, s) instead, the range the driver's sum has
    (the driver adds its batches' sums in Python)."""
    if agg.agg == "sum" and isinstance(dtype, T.DecimalType):
        return [F.sum(F.col(agg.column).cast(T.DecimalType(38, dtype.scale)))]  # type: ignore[arg-type]
    column = F.col(agg.column) if agg.column else None
    return aggregator.spark_partials(AggregationInput(column, dtype))


def _final(plan: BatchPlan, agg: Aggregation, dtype: T.DataType | None, parts: list[Column]) -> Column:
    """An aggregation's output from its buffers, as the driver's ``Aggregator.result`` gives it."""
    if agg.agg in ("first", "last"):
        return parts[0].getField("v")  # the (event time, value) pair's value
    if agg.agg == "avg":
        total, count = parts
        return F.when(count > 0, total / count)
    if agg.agg == "count_distinct":
        if agg.distinct_mode == "approximate":
            return F.hll_sketch_estimate(parts[0])
        size = F.size(parts[0])
        return F.when(size <= agg.max_distinct_values_per_group, size).otherwise(  # type: ignore[operator]
            _failure(plan, f"{DISTINCT_CAP} ({agg.max_distinct_values_per_group}) in {agg.as_}"))
    if agg.agg == "sum" and isinstance(dtype, INTEGRAL):
        total = parts[0]  # DECIMAL(38,0): no overflow while summing
        in_range = total.isNull() | total.between(BIGINT_MIN, BIGINT_MAX)
        return F.when(in_range, total.cast("bigint")).otherwise(_failure(plan, f"{SUM_OVERFLOW} in {agg.as_}"))
    return parts[0]


def _failure(plan: BatchPlan, what: str) -> Column:
    """Fails the query with ``what``, the pipeline, the window's start and the group named (the
    driver's ``AggregationOverflow`` / ``StateCapExceeded`` name the same)."""
    window = plan.spec.window
    named = [F.lit(f"{what}, pipeline {plan.spec.pipeline_name!r}, window starting "),
             F.col(f"{WINDOW}.start").cast("string")]
    if window.group_by:
        named += [F.lit(", group "), F.to_json(F.struct(*window.group_by))]
    return F.raise_error(F.concat(*named))
