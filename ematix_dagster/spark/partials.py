"""The Spark half of a micro-batch: classify rows, apply the SQL, assign windows, pre-aggregate.

Given the batch's union of sources, this builds (lazily) three things that run as one Spark job:

* per-source statistics measured *before* the SQL (rows, max valid event time, invalid /
  future / malformed counts), collected with ``DataFrame.observe`` so no extra pass is needed;
* the SQL's output with each row's open window assignments, and lateness counters;
* one partial aggregate per (window, group key).

The last two follow the window kind's rules: its plan in ``ematix_dagster.spark.windows``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.errors import PipelineConfigError, first_line
from ematix_dagster.spark.batch_values import BATCH_TIME, BATCH_VALUES, with_batch_values
from ematix_dagster.spark.observed import Observed
from ematix_dagster.spark.readers import CORRUPT, has_heartbeat
from ematix_dagster.spark.recovery import HEARTBEAT
from ematix_dagster.spark.rejects import REJECT_REASONS, reject_reason
from ematix_dagster.spark.safe_sql import ERROR_COLUMN, guard_sql
from ematix_dagster.spark.windows import PartialPlan, partial_plan
from ematix_dagster.spark.windows.base import CLASS, LATE_ASSIGNMENTS, PRIMARY, REOPENED, ROWS, Aggregates
from ematix_dagster.spark.windows.fixed import FixedPlan
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.aggregators import Aggregator, make_aggregator
from ematix_dagster.streaming.windows import MICROS_PER_MS

INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
NUMERIC = INTEGRAL + (T.FloatType, T.DoubleType, T.DecimalType)
#: Plan nodes that make a query look at more than one row at a time.
NOT_ROW_WISE = {"Aggregate", "Window", "WindowGroupLimit", "Sort", "GlobalLimit", "LocalLimit", "Tail", "Offset",
                "Distinct", "Deduplicate", "Intersect", "Except", "Sample", "Expand"}
VIEW = "source"


def _reason(ts: Column, future_after: Column | None) -> Column:
    reason = (F.when(F.col(CORRUPT).isNotNull(), F.lit("malformed"))
              .when(F.col("_event_ts").isNull(), F.lit("invalid_event_time")))
    return reason if future_after is None else reason.when(ts > future_after, F.lit("future"))


def canonical(col: Column, dtype: T.DataType) -> Column:
    """docs/contract/aggregators.md's one cast policy for distinct counting: BIGINT or canonical string.

    Spark's HLL skips the empty string, which docs/README.md counts as a value; it is hashed as the
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
    # A string's UTF-8 bytes as Spark holds them: the sketch DataSketches' update(String) would
    # build, without encode()'s decoding to a Java string and encoding back (measured: a sketch
    # groupBy of 2,000,000 rows 1.13 -> 0.97 s).
    return F.when(value == "", F.unhex(F.lit("FF"))).otherwise(value.cast("binary"))


@dataclass(frozen=True)
class AggregationInput:
    """One aggregation's input column as :class:`~ematix_dagster.streaming.aggregators.SparkInput`.

    ``projected``: where the canonical forms go (:class:`~ematix_dagster.spark.windows.base.Aggregates`):
    the names' prefix and the list of columns projected before the groupBy; None: inline.
    """

    column: Column | None
    dtype: T.DataType | None
    projected: tuple[str, list[Column]] | None = None
    functions = F

    @property
    def integral(self) -> bool:
        return isinstance(self.dtype, INTEGRAL)

    @property
    def decimal(self) -> bool:
        return isinstance(self.dtype, T.DecimalType)

    @property
    def numeric(self) -> bool:
        return isinstance(self.dtype, NUMERIC)

    @property
    def orderable(self) -> bool:
        return not isinstance(self.dtype, (T.MapType, T.BinaryType))

    @property
    def type_name(self) -> str:
        assert self.dtype is not None
        return self.dtype.simpleString()

    def canonical(self) -> Column:
        assert self.column is not None and self.dtype is not None
        return self._row_input(canonical(self.column, self.dtype))

    def hll_input(self) -> Column:
        assert self.column is not None and self.dtype is not None
        return self._row_input(_hll_input(self.column, self.dtype))

    def _row_input(self, value: Column) -> Column:
        if self.projected is None:
            return value
        prefix, columns = self.projected
        name = f"{prefix}{len(columns)}"
        columns.append(value.alias(name))
        return F.col(name)


@dataclass(frozen=True)
class BatchPlan:
    """Static facts about a pipeline's batches, checked once at start against the SQL output."""

    spec: PipelineSpec
    output_types: dict[str, T.DataType]  # SQL output column -> type (with ``_sql_error`` under a SQL)
    sql_columns: tuple[str, ...] = ()  # the SQL's output columns as written (without ``_sql_error``)

    @property
    def integral(self) -> tuple[bool, ...]:
        return tuple(a.agg == "sum" and isinstance(self.output_types[a.column], INTEGRAL)  # type: ignore[index]
                     for a in self.spec.window.aggregations)

    @cached_property
    def columns(self) -> BatchColumns:
        return BatchColumns.for_plan(self)

    @cached_property
    def late_on_driver(self) -> BatchColumns | None:
        """The columns of a plan that needs no batch values, where the driver can decide lateness
        (``spark.windows.fixed.late_windows``); None where it cannot.

        Joining the batch values to every row is most of what a batch's Spark work costs beyond
        the aggregation itself (measured: 10-15 ms of a 100,000-row batch). A tumbling row is late
        exactly when its window is, so with event time and no SQL only the future check needs a
        batch value, and the batch is run with the values whenever its newest event time says a row
        may be in the future (:func:`may_hold_future_rows`). Late rows then reach the aggregators
        (their partials are dropped), so aggregators that grow with their data (exact distinct sets)
        keep lateness in Spark.
        """
        spec = self.spec
        window = spec.window
        if (window.kind != "tumbling" or window.time_mode != "event" or spec.transform_sql
                or any(a.bytes_per_value for a in self.aggregators)):
            return None
        return BatchColumns.for_plan(self, future_in_spark=False)

    @cached_property
    def aggregators(self) -> list[Aggregator]:
        window = self.spec.window
        return [make_aggregator(a, self.integral[i], window.hll_precision) for i, a in enumerate(window.aggregations)]

    def partial_columns(self, gate: Column) -> Aggregates:
        """Every aggregation's partial expressions, named ``_p<i>`` (and the aggregator's suffixes),
        and their projected inputs (``_in<n>``).

        Rows where ``gate`` is false (class rows: late, bad event time) reach the aggregation
        only to be counted: their values are hidden from the aggregators (NULL), so a backlog of
        late rows never builds, say, one huge distinct set.
        """
        inputs: list[Column] = []
        cols: list[Column] = []
        for i, (a, agg) in enumerate(zip(self.spec.window.aggregations, self.aggregators)):
            spark = AggregationInput(None, None) if a.column is None else \
                AggregationInput(F.when(gate, F.col(a.column)), self.output_types[a.column], ("_in", inputs))
            cols += [expr.alias(name) for expr, name in zip(agg.spark_partials(spark), agg.partial_names(f"_p{i}"))]
        return Aggregates(inputs, cols)


def analyse(spark: SparkSession, spec: PipelineSpec, stream: DataFrame) -> BatchPlan:
    """Run the SQL on an empty frame of the stream's schema and check what the window needs.

    The user's SQL is checked as written (row-wise, its output columns), then its guarded form
    (``ematix_dagster.spark.safe_sql``) is what batches run, renamed to the written form's column
    names by position (Spark names an unaliased item after its text, which the guard changes).
    """
    empty = spark.createDataFrame([], stream.schema).drop(CORRUPT)
    out = apply_sql(spark, spec, empty)
    sql_columns: tuple[str, ...] = ()
    if spec.transform_sql:
        plan = out._jdf.queryExecution().analyzed().toString()
        nodes = {line.lstrip(" :+-|").split(" ")[0] for line in plan.splitlines()}
        bad = sorted(nodes & NOT_ROW_WISE)
        if bad:
            raise PipelineConfigError("transform.sql", f"is not row-wise (its plan has {', '.join(bad)})",
                                      "keep [transform] sql to filters, projections, casts and lookups; "
                                      "aggregate with [transform.window]")
        if ERROR_COLUMN in empty.columns or ERROR_COLUMN in out.columns:
            raise PipelineConfigError("transform.sql", f"a column is named {ERROR_COLUMN}, the column the engine "
                                      "adds for rows whose SQL failed", f"rename or drop {ERROR_COLUMN}")
        sql_columns = tuple(out.columns)
        out = apply_sql(spark, spec, empty, sql_columns)
    types = {f.name: f.dataType for f in out.schema.fields}
    for needed in ("_event_ts", "_source"):
        if needed not in types:
            raise PipelineConfigError("transform.sql", f"its output has no {needed} column",
                                      f"select {needed} (the engine needs it to assign windows and watermarks)")
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
        aggregator = make_aggregator(a, None, window.hll_precision)
        problem = aggregator.input_problem(a, AggregationInput(F.col(a.column), types[a.column]))
        if problem is not None:
            raise PipelineConfigError(key, *problem)
    return BatchPlan(spec=spec, output_types=types, sql_columns=sql_columns)


#: the guarded form of a pipeline's SQL, parsed once per text (a batch asks again every time)
guarded_sql = lru_cache(maxsize=16)(guard_sql)


def apply_sql(spark: SparkSession, spec: PipelineSpec, df: DataFrame, columns: Sequence[str] | None = None) -> DataFrame:
    """The SQL over ``df`` as written, or (``columns``: the written form's output names) guarded,
    with ``_sql_error`` last."""
    if not spec.transform_sql:
        return df
    df.createOrReplaceTempView(VIEW)
    try:
        if columns is None:
            return spark.sql(spec.transform_sql)
        return spark.sql(guarded_sql(spec.transform_sql).sql).toDF(*columns, ERROR_COLUMN)
    except PipelineConfigError:
        raise
    except Exception as exc:
        raise PipelineConfigError("transform.sql", f"does not run: {first_line(exc)}",
                                  f"query the view named {VIEW!r}, which holds each source's columns, _event_ts and _source") from None


@dataclass
class BatchFrames:
    """The lazily built frames of one batch (``ematix_dagster.spark.windows.base``: one job)."""

    partials: DataFrame  # partials, class rows and hidden counters: read with ``batch_counts``
    source_stats: Observed | None  # with [transform] sql: pre-SQL counts, observed as the job runs
    # built only when dead letters are written (every DataFrame step is analysed at once)
    bad_rows: Callable[[], DataFrame]  # pre-SQL rows with an invalid / future / malformed event time
    class_rows: Callable[[Sequence[str]], DataFrame]  # post-SQL rows of some classes (late, rejected)


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
    def for_plan(cls, plan: BatchPlan, future_in_spark: bool = True) -> "BatchColumns":
        """``future_in_spark=False``: no future check and a tumbling plan without batch values
        (:attr:`BatchPlan.late_on_driver`)."""
        spec = plan.spec
        skew = F.lit(None).cast("bigint")
        for s in spec.sources:
            skew = F.when(F.col("_source") == s.name, F.lit(s.max_future_skew_ms * MICROS_PER_MS)).otherwise(skew)
        ts = F.unix_micros("_event_ts")
        before_sql = _reason(ts, F.col(BATCH_TIME) + skew if future_in_spark else None)
        rejected = reject_reason(spec, plan.output_types)
        reason = rejected
        if not spec.transform_sql:
            reason = before_sql if rejected is None else F.coalesce(before_sql, rejected)

        def aggregates(gate: Column) -> Aggregates:
            found = plan.partial_columns(gate)
            return Aggregates(found.inputs, found.columns + ([] if spec.transform_sql else _source_counts(spec)))

        has_reason = not spec.transform_sql or rejected is not None
        return cls(data=F.col("_source") != HEARTBEAT, processing_time=F.timestamp_micros(F.col(BATCH_TIME)),
                   classified=[ts.alias("_ts"), before_sql.alias("_reason")],
                   source_stats=_source_stats(spec) if spec.transform_sql else [],
                   valid=F.col("_reason").isNull(), reason=reason,
                   windows=partial_plan(spec.window, aggregates, has_reason) if future_in_spark
                   else FixedPlan(spec.window, aggregates, has_reason, late_in_spark=False))


def build_batch(spark: SparkSession, plan: BatchPlan, df: DataFrame, batch_id: int, batch_time_us: int,
                closed_before: int | None, emitted_before: int | None, late_on_driver: bool = False) -> BatchFrames:
    """The batch's single Spark job, planned.

    Without ``[transform] sql`` the rows with a bad event time ride along into the aggregation as
    class rows, so every counter comes out of the partials' own job. A SQL may filter rows, and
    the source counters are taken before it (docs/contract/time-and-watermarks.md), so with a SQL they are observed on the
    SQL's input instead. The batch's values are columns (``ematix_dagster.spark.batch_values``),
    so the plan's generated code is the same every batch, and its columns are the run's
    (:class:`BatchColumns`): a batch only applies them to its rows.
    """
    spec, columns = plan.spec, plan.columns
    values = (batch_time_us, closed_before, emitted_before)
    if late_on_driver:  # no batch values: the dead-letter frames, built only when asked, are the exact plan's
        fast = plan.late_on_driver
        assert fast is not None
        rows = df.filter(fast.data) if has_heartbeat(spec) else df
        assert fast.reason is not None
        partials = fast.windows.frames(rows.select("*", fast.reason.alias("_reason")), batch_id).partials

        @cache  # bad rows and class rows of one batch from one exact plan
        def exact() -> BatchFrames:
            return build_batch(spark, plan, df, batch_id, *values)

        return BatchFrames(partials, None, lambda: exact().bad_rows(), lambda classes: exact().class_rows(classes))
    df = with_batch_values(df.filter(columns.data) if has_heartbeat(spec) else df, *values)
    if spec.window.time_mode == "processing":
        df = df.withColumn("_event_ts", columns.processing_time)

    def classified() -> DataFrame:
        return df.select("*", *columns.classified)

    def bad_rows() -> DataFrame:
        return (classified().filter(F.col("_reason").isNotNull()).drop("_ts", *BATCH_VALUES)
                .withColumn("_batch_id", F.lit(batch_id).cast("bigint")))

    source_stats: Observed | None = None
    if spec.transform_sql:
        rows = classified()
        source_stats = Observed(Observation(f"sources_{batch_id}"), rows, columns.source_stats)
        valid = rows.observe(source_stats.observation, *columns.source_stats).filter(columns.valid)
        sql_input = valid.drop("_ts", "_reason", CORRUPT, *BATCH_VALUES)
        out = with_batch_values(apply_sql(spark, spec, sql_input, plan.sql_columns), *values)
        if columns.reason is not None:
            out = out.withColumn("_reason", columns.reason)
    else:  # one step: each row's reason beside its columns (the window plan adds ``_ts``)
        assert columns.reason is not None
        out = df.select("*", columns.reason.alias("_reason"))
    windowed = columns.windows.frames(out, batch_id)
    return BatchFrames(windowed.partials, source_stats, bad_rows, windowed.class_rows)


def _source_stats(spec: PipelineSpec) -> list[Column]:
    """Per-source counters as aggregates over the batch's rows (one row each)."""
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
    return stats


def _source_counts(spec: PipelineSpec) -> list[Column]:
    """Per-source rows and newest valid event time as hidden aggregates of the partials (no SQL).

    Each class row (``invalid_event_time``, ``future``, ``malformed``, ``late``) then holds that
    class's rows per source; one source needs no source column (``ROWS`` counts its rows).
    """
    several = len(spec.sources) > 1
    cols: list[Column] = []
    for i, s in enumerate(spec.sources):
        mine = F.col(PRIMARY) & (F.col("_source") == s.name) if several else F.col(PRIMARY)
        if several:
            cols.append(F.count_if(mine).alias(f"_rows_{i}"))
        # a rejected row (post-SQL reasons) has a valid event time: it moves the watermark
        valid = F.col("_reason").isNull() | F.col("_reason").isin(*REJECT_REASONS)
        cols.append(F.max(F.when(mine & valid, F.col("_ts"))).alias(f"_max_{i}"))
    return cols


def batch_counts(spec: PipelineSpec, table: pa.Table, source_stats: Observed | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(per-source counters as ``_source_stats`` names them, lateness and rejection counters) from the
    job's result (``rejected``: rows per reason of ``ematix_dagster.spark.rejects``).

    Vectorised over the partials table: a sum or max per hidden column, over the class rows
    where the counter is a class's.
    """
    classes = table.column(CLASS)
    windowed = pc.is_null(classes)

    def total(column: str, where: pa.ChunkedArray | None = None) -> int:
        if column not in table.column_names:
            return 0
        values = table.column(column) if where is None else table.column(column).filter(where)
        return int(pc.sum(values).as_py() or 0)

    late: dict[str, Any] = {"late_rows": total(ROWS, pc.equal(classes, "late")),
            "late_assignments": total(LATE_ASSIGNMENTS, windowed), "reopened_rows": total(REOPENED, windowed),
            "rejected": {r: n for r in REJECT_REASONS if (n := total(ROWS, pc.equal(classes, r)))}}
    if source_stats is not None:
        return source_stats.values(), late
    stats: dict[str, Any] = {}
    several = len(spec.sources) > 1
    for i in range(len(spec.sources)):
        rows = f"_rows_{i}" if several else ROWS
        stats[f"rows_{i}"] = total(rows)
        stats[f"max_{i}"] = pc.max(table.column(f"_max_{i}")).as_py()
        for reason in ("invalid_event_time", "future", "malformed"):
            stats[f"{reason.split('_')[0]}_{i}"] = total(rows, pc.equal(classes, reason))
    return stats, late


def may_hold_future_rows(spec: PipelineSpec, table: pa.Table, batch_time_us: int) -> bool:
    """Whether a row of a batch planned without the future check (:attr:`BatchPlan.late_on_driver`)
    may be in the future: a source's newest valid event time passes the batch time plus its skew."""
    for i, source in enumerate(spec.sources):
        newest = pc.max(table.column(f"_max_{i}")).as_py()
        if newest is not None and newest > batch_time_us + source.max_future_skew_ms * MICROS_PER_MS:
            return True
    return False
