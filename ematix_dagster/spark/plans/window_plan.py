"""The run's plan, analysed once at start: the SQL's output checked against what the window needs.

:class:`BatchPlan` holds what every batch of the run shares (the SQL's output types, the
aggregators, the run's :class:`~ematix_dagster.spark.batch.batch_columns.BatchColumns`); :func:`apply_sql`
runs the user's SQL as written or guarded (``ematix_dagster.spark.plans.safe_sql``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.columns import (
    CORRUPT,
    EVENT_TS,
    INPUT_PREFIX,
    PARTIAL_PREFIX,
    SOURCE,
    SOURCE_ROW,
    SOURCE_VIEW,
    SQL_ERROR,
)
from ematix_dagster.errors import PipelineConfigError, first_line
from ematix_dagster.spark.batch.batch_columns import BatchColumns, driver_late_plan
from ematix_dagster.spark.plans.aggregation_input import INTEGRAL, AggregationInput
from ematix_dagster.spark.plans.safe_sql import SourceRow, guard_sql
from ematix_dagster.spark.plans.windows.driver_late import DriverLatePlan
from ematix_dagster.spark.plans.windows.kind_plan import Aggregates
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.spec.window import WINDOW_KINDS
from ematix_dagster.streaming.aggregators import Aggregator, make_aggregator, window_aggregators

#: Plan nodes that make a query look at more than one row at a time.
NOT_ROW_WISE = {"Aggregate", "Window", "WindowGroupLimit", "Sort", "GlobalLimit", "LocalLimit", "Tail", "Offset",
                "Distinct", "Deduplicate", "Intersect", "Except", "Sample", "Expand"}
VIEW = SOURCE_VIEW


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
        return BatchColumns.build(self.spec, self.output_types, self.partial_columns)

    @cached_property
    def late_on_driver(self) -> DriverLatePlan | None:
        """The plan that needs no batch values, where the driver can decide lateness
        (``spark.plans.windows.driver_late``); None where it cannot.

        Joining the batch values to every row is most of what a batch's Spark work costs beyond
        the aggregation itself. A tumbling row is late
        exactly when its window is, so with event time and no SQL only the future check needs a
        batch value, and the batch is run with the values whenever its newest event time says a row
        may be in the future (``spark.batch.batch_counts.may_hold_future_rows``). Late rows then reach the
        aggregators (their partials are dropped), so aggregators that grow with their data (exact
        distinct sets) keep lateness in Spark.
        """
        spec = self.spec
        window = spec.window
        if (not WINDOW_KINDS[window.kind].late_on_driver or window.time_mode != "event" or spec.transform_sql
                or any(a.bytes_per_value for a in self.aggregators)):
            return None
        return driver_late_plan(spec, self.output_types, self.partial_columns)

    @cached_property
    def aggregators(self) -> list[Aggregator]:
        return window_aggregators(self.spec.window, self.integral)

    def partial_columns(self, gate: Column) -> Aggregates:
        """Every aggregation's partial expressions, named ``_p<i>`` (and the aggregator's suffixes),
        and their projected inputs (``_in<n>``).

        Rows where ``gate`` is false (class rows: late, bad event time) reach the aggregation
        only to be counted: their values are hidden from the aggregators (NULL), so a backlog of
        late rows never builds, say, one huge distinct set.
        """
        inputs: list[Column] = []
        cols: list[Column] = []
        aggregations = self.spec.window.aggregations
        for i, agg in enumerate(self.aggregators):  # a hidden one after the aggregations counts rows
            column = aggregations[i].column if i < len(aggregations) else None
            spark = AggregationInput(None, None) if column is None else \
                AggregationInput(F.when(gate, F.col(column)), self.output_types[column], (INPUT_PREFIX, inputs))
            cols += [expr.alias(name) for expr, name in zip(agg.spark_partials(spark), agg.partial_names(f"{PARTIAL_PREFIX}{i}"))]
        return Aggregates(inputs, cols)


def analyse(spark: SparkSession, spec: PipelineSpec, stream: DataFrame) -> BatchPlan:
    """Run the SQL on an empty frame of the stream's schema and check what the window needs.

    The user's SQL is checked as written (row-wise, its output columns), then its guarded form
    (``ematix_dagster.spark.plans.safe_sql``) is what batches run, renamed to the written form's column
    names by position (Spark names an unaliased item after its text, which the guard changes).
    """
    empty = spark.createDataFrame([], stream.schema).drop(CORRUPT)
    out = apply_sql(spark, spec, empty)
    sql_columns: tuple[str, ...] = ()
    if spec.transform_sql:
        check_row_wise(empty, out)
        sql_columns = tuple(out.columns)
        out = apply_sql(spark, spec, empty, sql_columns)
    types = {f.name: f.dataType for f in out.schema.fields}
    for needed in (EVENT_TS, SOURCE):
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


def check_row_wise(source: DataFrame, out: DataFrame) -> None:
    """``[transform] sql`` (``out``, run over ``source``) looks at one row at a time, and leaves the
    engine its ``_sql_error`` column: the engine runs it per batch and guards it row by row, so an
    aggregate, a sort or a limit would see only one batch, and a user's ``_sql_error`` would be lost."""
    plan = out._jdf.queryExecution().analyzed().toString()
    nodes = {line.lstrip(" :+-|").split(" ")[0] for line in plan.splitlines()}
    bad = sorted(nodes & NOT_ROW_WISE)
    if bad:
        raise PipelineConfigError("transform.sql", f"is not row-wise (its plan has {', '.join(bad)})",
                                  "keep [transform] sql to filters, projections, casts and lookups; "
                                  "aggregate with [transform.window]")
    for added in (SQL_ERROR, SOURCE_ROW):
        if added in source.columns or added in out.columns:
            raise PipelineConfigError("transform.sql", f"a column is named {added}, a column the engine "
                                      "adds for rows whose SQL failed", f"rename or drop {added}")


#: the guarded form of a pipeline's SQL, parsed once per text (a batch asks again every time)
guarded_sql = lru_cache(maxsize=16)(guard_sql)


def source_row(spec: PipelineSpec) -> SourceRow | None:
    """Which of a windowed pipeline's post-SQL rows carry ``_source_row`` (``[dead_letter]
    include_source_row``); None: the column is not added (no dead letters, or ``none``)."""
    mode = spec.dead_letter.include_source_row if spec.dead_letter is not None else "none"
    return None if mode == "none" else SourceRow(VIEW, every_row=mode == "all")


def apply_sql(spark: SparkSession, spec: PipelineSpec, df: DataFrame, columns: Sequence[str] | None = None) -> DataFrame:
    """The SQL over ``df`` as written, or (``columns``: the written form's output names) guarded,
    with ``_sql_error`` (and ``_source_row``, see :func:`source_row`) last."""
    if not spec.transform_sql:
        return df
    df.createOrReplaceTempView(VIEW)
    try:
        if columns is None:
            return spark.sql(spec.transform_sql)
        added = source_row(spec)
        return spark.sql(guarded_sql(spec.transform_sql, added).sql).toDF(
            *columns, SQL_ERROR, *([SOURCE_ROW] if added is not None else []))
    except PipelineConfigError:
        raise
    except Exception as exc:
        raise PipelineConfigError("transform.sql", f"does not run: {first_line(exc)}",
                                  f"query the view named {VIEW!r}, which holds each source's columns, _event_ts and _source") from None

