"""The Spark half of a micro-batch: classify rows, apply the SQL, assign windows, pre-aggregate.

Given the batch's union of sources, this builds (lazily) three things that run as one Spark job:

* per-source statistics measured *before* the SQL (rows, max valid event time, invalid /
  future / malformed counts), collected with ``DataFrame.observe`` so no extra pass is needed;
* the SQL's output with each row's open window assignments exploded, and lateness counters;
* one partial aggregate per (window start, group key).

Lateness is decided per (row, window) against the watermark before the batch (SPEC.md §3): with
``thr`` = the end at or below which windows are closed, a row's open starts are the multiples of
the hop in ``(max(t - D, thr - D), t]``; a row with none is late.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.errors import PipelineConfigError, first_line
from ematix_dagster.spark.sources import CORRUPT, HEARTBEAT
from ematix_dagster.spec import Aggregation, PipelineSpec
from ematix_dagster.streaming.windows import MICROS_PER_MS, first_start

INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
NUMERIC = INTEGRAL + (T.FloatType, T.DoubleType, T.DecimalType)
#: Plan nodes that make a query look at more than one row at a time.
NOT_ROW_WISE = {"Aggregate", "Window", "WindowGroupLimit", "Sort", "GlobalLimit", "LocalLimit", "Tail", "Offset",
                "Distinct", "Deduplicate", "Intersect", "Except", "Sample", "Expand"}
VIEW = "source"


def _reason() -> Column:
    return (F.when(F.col(CORRUPT).isNotNull(), F.lit("malformed"))
            .when(F.col("_event_ts").isNull(), F.lit("invalid_event_time"))
            .when(F.col("_ts") > F.col("_future_after"), F.lit("future")))


def canonical(col: Column, dtype: T.DataType) -> Column:
    """SPEC.md §4's one cast policy for distinct counting: BIGINT or canonical string.

    Spark's HLL skips the empty string, which SPEC.md counts as a value; it is hashed as the
    single byte 0xFF, which no UTF-8 string encodes to, so it cannot collide with a real value.
    """
    if isinstance(dtype, INTEGRAL):
        return col.cast("bigint")
    if isinstance(dtype, T.TimestampType):
        return F.date_format(col, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'")
    if isinstance(dtype, T.TimestampNTZType):
        return F.date_format(col, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS")
    if isinstance(dtype, T.BinaryType):
        return F.base64(col)
    return col.cast("string")


def _hll_input(col: Column, dtype: T.DataType) -> Column:
    value = canonical(col, dtype)
    if isinstance(dtype, INTEGRAL):
        return value
    return F.when(value == "", F.unhex(F.lit("FF"))).otherwise(F.encode(value, "UTF-8"))


@dataclass(frozen=True)
class BatchPlan:
    """Static facts about a pipeline's batches, checked once at start against the SQL output."""

    spec: PipelineSpec
    output_types: dict[str, T.DataType]  # SQL output column -> type

    @property
    def integral(self) -> tuple[bool, ...]:
        return tuple(a.agg == "sum" and isinstance(self.output_types[a.column], INTEGRAL)  # type: ignore[index]
                     for a in self.spec.window.aggregations)

    def partial_columns(self) -> list[Column]:
        window = self.spec.window
        cols: list[Column] = []
        for i, a in enumerate(window.aggregations):
            cols.extend(_partial(a, i, self.output_types, window.hll_precision))
        return cols


def _partial(a: Aggregation, i: int, types: dict[str, T.DataType], lg_k: int) -> list[Column]:
    name = f"_p{i}"
    if a.agg == "count":
        return [F.count(F.lit(1)).alias(name)]
    col, dtype = F.col(a.column), types[a.column]  # type: ignore[arg-type,index]
    if a.agg == "count_col":
        return [F.count(col).alias(name)]
    if a.agg == "sum":
        if isinstance(dtype, INTEGRAL):
            # DECIMAL(38,0) cannot overflow here; the driver checks the BIGINT range with the window named.
            return [F.sum(col.cast("decimal(38,0)")).alias(name)]
        if isinstance(dtype, T.DecimalType):
            return [F.sum(col).alias(name)]
        return [F.sum(col.cast("double")).alias(name)]
    if a.agg == "min":
        return [F.min(col).alias(name)]
    if a.agg == "max":
        return [F.max(col).alias(name)]
    if a.agg == "avg":
        return [F.sum(col.cast("double")).alias(name), F.count(col).alias(name + "_n")]
    if a.agg in ("first", "last"):
        pair = F.when(col.isNotNull(), F.struct(F.col("_ts").alias("t"), col.alias("v")))
        return [(F.min(pair) if a.agg == "first" else F.max(pair)).alias(name)]
    if a.distinct_mode == "approximate":
        return [F.hll_sketch_agg(_hll_input(col, dtype), lg_k).alias(name)]
    return [F.collect_set(canonical(col, dtype)).alias(name)]


def analyse(spark: SparkSession, spec: PipelineSpec, stream: DataFrame) -> BatchPlan:
    """Run the SQL on an empty frame of the stream's schema and check what the window needs."""
    empty = spark.createDataFrame([], stream.schema).drop(CORRUPT)
    out = apply_sql(spark, spec, empty)
    types = {f.name: f.dataType for f in out.schema.fields}
    for needed in ("_event_ts", "_source"):
        if needed not in types:
            raise PipelineConfigError("transform.sql", f"its output has no {needed} column",
                                      f"select {needed} (the engine needs it to assign windows and watermarks)")
    if spec.transform_sql:
        plan = out._jdf.queryExecution().analyzed().toString()
        nodes = {line.lstrip(" :+-|").split(" ")[0] for line in plan.splitlines()}
        bad = sorted(nodes & NOT_ROW_WISE)
        if bad:
            raise PipelineConfigError("transform.sql", f"is not row-wise (its plan has {', '.join(bad)})",
                                      "keep [transform] sql to filters, projections, casts and lookups; "
                                      "aggregate with [transform.window]")
    window = spec.window
    for i, g in enumerate(window.group_by):
        if g not in types:
            raise PipelineConfigError(f"transform.window.group_by[{i}]", f"{g!r} is not a column of the input "
                                      f"(columns: {', '.join(sorted(types))})", "group by an existing column")
    for i, a in enumerate(window.aggregations):
        if a.column is None:
            continue
        key = f"transform.window.aggregations[{i}].column"
        if a.column not in types:
            raise PipelineConfigError(key, f"{a.column!r} is not a column of the input "
                                      f"(columns: {', '.join(sorted(types))})", "aggregate an existing column")
        if a.agg in ("sum", "avg") and not isinstance(types[a.column], NUMERIC):
            raise PipelineConfigError(key, f"{a.agg} needs a number, {a.column!r} is {types[a.column].simpleString()}",
                                      "cast it in [transform] sql or use another aggregator")
        if a.agg in ("min", "max", "first", "last") and isinstance(types[a.column], (T.MapType, T.BinaryType)):
            raise PipelineConfigError(key, f"{a.agg} cannot order {types[a.column].simpleString()} values",
                                      "aggregate an orderable column")
    return BatchPlan(spec=spec, output_types=types)


def apply_sql(spark: SparkSession, spec: PipelineSpec, df: DataFrame) -> DataFrame:
    if not spec.transform_sql:
        return df
    df.createOrReplaceTempView(VIEW)
    try:
        return spark.sql(spec.transform_sql)
    except Exception as exc:
        raise PipelineConfigError("transform.sql", f"does not run: {first_line(exc)}",
                                  f"query the view named {VIEW!r}, which holds each source's columns, _event_ts and _source") from None


@dataclass
class Observed:
    """Aggregates collected while another action runs, with a direct fallback.

    Spark drops an ``observe`` node when the optimiser proves its input empty (an empty
    micro-batch), and the observation is then never filled; the fallback computes the same
    aggregates explicitly in that case.
    """

    observation: Observation
    frame: DataFrame
    exprs: list[Column]

    def values(self) -> dict[str, Any]:
        try:
            values = self.observation.get
        except Exception:  # noqa: BLE001 - the observation was pruned with an empty plan
            values = {}
        if not values:
            values = self.frame.agg(*self.exprs).collect()[0].asDict()
        return values


@dataclass
class BatchFrames:
    """The lazily built frames of one batch and the observations filled when they run."""

    partials: DataFrame
    source_stats: Observed
    late_stats: Observed
    bad_rows: DataFrame  # pre-SQL rows with an invalid / future / malformed event time
    late_rows: DataFrame  # post-SQL rows with no open window


def build_batch(spark: SparkSession, plan: BatchPlan, df: DataFrame, batch_id: int, batch_time_us: int,
                closed_before: int | None, emitted_before: int | None) -> BatchFrames:
    spec, window = plan.spec, plan.spec.window
    df = df.filter(F.col("_source") != HEARTBEAT)
    if window.time_mode == "processing":
        df = df.withColumn("_event_ts", F.timestamp_micros(F.lit(batch_time_us)))
    skew = F.lit(None).cast("bigint")
    for s in spec.sources:
        skew = F.when(F.col("_source") == s.name, F.lit(s.max_future_skew_ms * MICROS_PER_MS)).otherwise(skew)
    df = (df.withColumn("_ts", F.unix_micros("_event_ts"))
          .withColumn("_future_after", F.lit(batch_time_us) + skew)
          .withColumn("_reason", _reason()))
    stats: list[Column] = []
    for i, s in enumerate(spec.sources):
        mine = F.col("_source") == s.name
        stats += [
            F.count_if(mine).alias(f"rows_{i}"),
            F.max(F.when(mine & F.col("_reason").isNull(), F.col("_ts"))).alias(f"max_{i}"),
            F.count_if(mine & (F.col("_reason") == "invalid_event_time")).alias(f"invalid_{i}"),
            F.count_if(mine & (F.col("_reason") == "future")).alias(f"future_{i}"),
            F.count_if(mine & (F.col("_reason") == "malformed")).alias(f"malformed_{i}"),
        ]
    source_stats = Observed(Observation(f"sources_{batch_id}"), df, stats)
    observed = df.observe(source_stats.observation, *stats)
    bad_rows = (df.filter(F.col("_reason").isNotNull())
                .drop("_ts", "_future_after")
                .withColumn("_batch_id", F.lit(batch_id).cast("bigint")))
    valid = observed.filter(F.col("_reason").isNull()).drop("_ts", "_future_after", "_reason", CORRUPT)
    out = apply_sql(spark, spec, valid)

    duration = window.duration_ms * MICROS_PER_MS
    hop = window.hop * MICROS_PER_MS
    ts = F.unix_micros("_event_ts")
    # Integer arithmetic throughout (pmod is a floor modulo): doubles would misplace rows near a
    # window bound once timestamps exceed 2^53 µs.
    last = ts - F.pmod(ts, F.lit(hop))
    start_of_first = ts - F.lit(duration)
    first = start_of_first - F.pmod(start_of_first, F.lit(hop)) + F.lit(hop)
    if closed_before is None:
        first_open = first
    else:
        first_open = F.greatest(first, F.lit(first_start(closed_before, duration, hop)))
    out = (out.withColumn("_ts", ts).withColumn("_last", last.cast("bigint")).withColumn("_first", first.cast("bigint"))
           .withColumn("_first_open", first_open.cast("bigint"))
           .withColumn("_late", F.col("_first_open") > F.col("_last")))
    reopened = F.lit(False) if emitted_before is None or window.late_data != "reopen" else \
        (~F.col("_late")) & (F.col("_first_open") + duration <= F.lit(emitted_before))
    late_rows = (out.filter(F.col("_late")).drop("_ts", "_last", "_first", "_first_open", "_late")
                 .withColumn("_batch_id", F.lit(batch_id).cast("bigint")).withColumn("_reason", F.lit("late")))
    late_exprs = [
        F.count_if(F.col("_late")).alias("late_rows"),
        F.coalesce(F.sum(F.when(~F.col("_late"), F.expr(f"(_first_open - _first) div {hop}"))), F.lit(0))
        .cast("bigint").alias("late_assignments"),
        F.count_if(reopened).alias("reopened_rows"),
    ]
    late_stats = Observed(Observation(f"late_{batch_id}"), out, late_exprs)
    out = out.observe(late_stats.observation, *late_exprs)
    assigned = (out.filter(~F.col("_late"))
                .withColumn("_ws", F.explode(F.sequence(F.col("_first_open"), F.col("_last"), F.lit(hop).cast("bigint")))))
    keys = [F.col("_ws")] + [F.col(g) for g in window.group_by]
    partials = assigned.groupBy(*keys).agg(*plan.partial_columns())
    return BatchFrames(partials, source_stats, late_stats, bad_rows, late_rows)
