"""A row pipeline's part of a batch (docs/contract/row-pipelines.md).

A row pipeline has no window: each batch classifies its rows (a bad event time goes to the dead
letters, as in a windowed pipeline), measures each source before the SQL, runs the SQL (guarded:
a row whose expression fails is a ``sql_error`` dead letter, never a failed batch) and hands the
driver the output rows, each with its event time and, under ``WATERMARK_TS()``, its release time
(``sql.row_query``). The driver (``streaming.row_release``) advances the watermark and says which
rows leave now and which are held back; ``spark.batch.batch_step.BatchStep`` then writes the target and
commits one store transaction with the held rows inserted and the released ones deleted, as it
does for a windowed batch, so a crash anywhere leaves either the batch before or this one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from ematix_dagster.columns import (
    BATCH_ID,
    BATCH_VALUES,
    CORRUPT,
    EVENT_TS,
    EVENT_US,
    REASON,
    RELEASE_COLUMN,
    SOURCE,
    SOURCE_ROW,
    SQL_ERROR,
    TS,
)
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.batch.batch_columns import pre_sql_reason, source_stats
from ematix_dagster.spark.batch.batch_counts import filtered_rows, sources_of
from ematix_dagster.spark.batch.batch_report import BatchReport, RowCounts
from ematix_dagster.spark.batch.batch_step import DeadLetterSink, InTransaction
from ematix_dagster.spark.batch.batch_values import with_batch_values
from ematix_dagster.spark.batch.convert import UTC_MICROS, arrow_type
from ematix_dagster.spark.batch.observed import Observed
from ematix_dagster.spark.plans.row_plan import analyse_rows
from ematix_dagster.spark.plans.safe_sql import SourceRow, guard_sql
from ematix_dagster.spark.plans.window_plan import VIEW
from ematix_dagster.spark.sources.readers import source_rows
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.sql.row_query import row_query
from ematix_dagster.streaming.durable import Provenance, pipeline_record, restore_progress
from ematix_dagster.streaming.row_release import RowBatch, RowEngine, RowResult
from ematix_dagster.streaming.watermark import Watermarks
from ematix_dagster.targets import RowWriter, make_row_writer
from state_store.contract import BatchCommit, RecoveredState, StateStore


@dataclass(frozen=True)
class RowPlan:
    """What every batch of a row pipeline's run applies, analysed once at start."""

    sql: str  # the guarded query the batches run (its columns renamed to ``columns``)
    columns: tuple[str, ...]  # the query's output columns as written, with the engine's hidden ones
    schema: pa.Schema  # what the target receives: the SELECT list, in its order
    delayed: bool  # the SQL calls WATERMARK_TS()

    @classmethod
    def build(cls, spark: SparkSession, spec: PipelineSpec, stream: DataFrame) -> "RowPlan":
        assert spec.transform_sql is not None  # the spec refuses a row pipeline without SQL
        output = analyse_rows(spark, spec, stream)
        sql, release = row_query(spec.transform_sql)
        hidden = ((RELEASE_COLUMN,) if release is not None else ()) + (EVENT_US,)
        schema = pa.schema([pa.field(f.name, arrow_type(f.dataType)) for f in output.fields])
        # ``_source_row`` always: a failed row's ``_source`` comes from it when the SELECT leaves it out
        return cls(guard_sql(sql, SourceRow(VIEW)).sql, (*output.names, *hidden), schema, release is not None)


@dataclass
class RowCall:
    """A row pipeline's engine call, opened once per run."""

    writes_once: ClassVar[bool] = False  # its writes are idempotent by key or batch (targets)
    engine_reads: ClassVar[bool] = True  # the sources it reads itself: InputFiles

    spec: PipelineSpec
    plan: RowPlan
    engine: RowEngine
    store: StateStore
    metrics: StreamingMetrics

    @classmethod
    def open(cls, spark: SparkSession, spec: PipelineSpec, stream: DataFrame, recovered: RecoveredState,
             store: StateStore | None, metrics: StreamingMetrics) -> RowCall:
        """The run's plan analysed over the stream, and the engine continued from ``recovered``."""
        assert store is not None and store.durable  # the spec requires a durable store
        plan = RowPlan.build(spark, spec, stream)
        engine = RowEngine(Watermarks.of(spec.watermark, spec.source_names),
                           max_buffered_rows=spec.rows.max_buffered_rows if spec.rows else None,
                           pipeline=spec.pipeline_name, by_event_time=bool(spec.target.key))
        engine.pending = store.pending_summary(spec.pipeline_name).rows
        if recovered.record is not None:
            restore_progress(engine, recovered.record)
        return cls(spec, plan, engine, store, metrics)

    @staticmethod
    def start_warnings(spec: PipelineSpec) -> list[str]:
        return []

    @staticmethod
    def refused_change(spec: PipelineSpec, store: StateStore, changes: list[str]) -> str:
        """Why a row pipeline refuses state written by another spec: rows held back by the old SQL hold
        its output columns and release times (docs/contract/row-pipelines.md: a changed output schema
        with rows pending refuses)."""
        pending = store.pending_summary(spec.pipeline_name).rows
        held = (f"{pending} row{'' if pending == 1 else 's'} pending (held back by WATERMARK_TS(), not written yet) "
                "hold the old SQL's output columns and release times" if pending else "no rows are pending")
        discards = f", which discards the {pending} pending rows" if pending else ""
        return (f"pipeline {spec.pipeline_name}: the state in {store.description} was written by another row "
                f"pipeline spec; changed: {'; '.join(changes) or 'fingerprint'}. {held}. Revert the change (the "
                f"pending rows then leave as planned), or start over with `ematix-dagster reset PIPELINE.toml --yes`"
                f"{discards} (lateness, idleness and max_buffered_rows may change freely).")

    @property
    def schema(self) -> pa.Schema:
        return self.plan.schema

    def open_target(self) -> RowWriter:
        spec = self.spec
        return make_row_writer(spec.target, spec.pipeline_name, self.plan.schema, spec.target.key)

    def streamed(self, stream: DataFrame) -> DataFrame:
        """The query writes the sources' rows: the batch's Spark work is this call's."""
        return stream

    def replayed(self, df: DataFrame) -> None:
        """A batch the store holds needs nothing from Spark."""

    def idle(self, batch_id: int, batch_time: int) -> None:
        """A heartbeat-only batch is read like any other (its SQL runs over no rows)."""
        return None

    def read(self, df: DataFrame, batch_id: int, batch_time: int, letters: DeadLetterSink) -> RowBatch:
        """The batch's rows through the SQL, its source counters and its dead letters (by reason)."""
        spec, plan = self.spec, self.plan
        rows = with_batch_values(source_rows(spec, df), batch_time, None, None)
        if spec.watermark.time_mode == "processing":
            rows = rows.withColumn(EVENT_TS, F.timestamp_micros(F.lit(batch_time)))
        rows = rows.select("*", F.unix_micros(EVENT_TS).alias(TS), pre_sql_reason(spec).alias(REASON))
        stats = source_stats(spec)
        observed = Observed(Observation(f"sources_{batch_id}"), rows, stats)
        valid = rows.observe(observed.observation, *stats).filter(F.col(REASON).isNull())
        valid.drop(TS, REASON, CORRUPT, *BATCH_VALUES).createOrReplaceTempView(VIEW)
        table = df.sparkSession.sql(plan.sql).toDF(*plan.columns, SQL_ERROR, SOURCE_ROW).toArrow()
        sources = sources_of(spec, observed.values())
        failed = pc.is_valid(table.column(SQL_ERROR))
        errors, table = table.filter(failed), table.filter(pc.invert(failed)).drop_columns([SQL_ERROR, SOURCE_ROW])
        dead: dict[str, int] = {}
        bad = sum(s.invalid + s.future + s.malformed for s in sources.values())
        if letters.writer is not None and (bad or errors.num_rows):
            tables = []
            if bad:
                tables.append(rows.filter(F.col(REASON).isNotNull()).drop(TS, *BATCH_VALUES)
                              .withColumn(BATCH_ID, F.lit(batch_id).cast("bigint")).toArrow())
            if errors.num_rows:
                tables.append(self._sql_errors(errors, batch_id))
            dead = letters.write(pa.concat_tables([_nullable(t) for t in tables], promote_options="permissive")
                                 if len(tables) > 1 else tables[0])
        # Under WATERMARK_TS() the WHERE filters nothing in Spark (its rows are the never-released ones)
        filtered = 0 if plan.delayed else filtered_rows(sources, table.num_rows + errors.num_rows)
        self.engine.counters["rejected_rows:sql_error"] += errors.num_rows
        return RowBatch(batch_id, batch_time, sources, table, filtered, dead)

    def process(self, batch: RowBatch) -> RowResult:
        store, name = self.store, self.spec.pipeline_name
        return self.engine.process(batch, lambda w: store.load_pending(name, w))

    def flush(self, batch_id: int, batch_time: int) -> None:
        """Nothing: held rows leave only when the watermark reaches them, in a later run's batch."""
        return None

    def rows(self, outcome: RowResult) -> pa.Table:
        return outcome.released

    def commit(self, outcome: RowResult, offsets: dict[str, str], provenance: Provenance,
               in_transaction: InTransaction) -> BatchCommit:
        """Held rows in, released ones out, offsets, watermarks, counters."""
        commit = BatchCommit(pipeline_record(self.engine, self.spec.pipeline_name, provenance, offsets),
                             in_transaction=in_transaction)
        outcome.changes.add_to(commit)
        return commit

    def forget(self) -> None:
        """Nothing to drop (a row pipeline's store is always durable)."""

    def report(self, batch: RowBatch, outcome: RowResult, seconds: float | None) -> BatchReport:
        outcome.complete_to(self.store.pending_summary(self.spec.pipeline_name).min_event_ts if outcome.pending
                            else None)
        seconds = seconds or 0.0
        engine, batch_time = self.engine, batch.batch_time
        self.metrics.record_rows(self.spec.pipeline_name, batch.sources, outcome, batch.dead_letters, seconds)
        return BatchReport(
            batch_id=batch.batch_id, batch_time=batch_time, rows_in=sum(s.rows for s in batch.sources.values()),
            rows_by_source={k: s.rows for k, s in batch.sources.items()},
            dead_letter_rows=sum(batch.dead_letters.values()), watermark=outcome.watermark,
            source_watermarks=engine.watermarks.source_watermarks(),
            idle_sources=[s for s in engine.watermarks.sources if engine.watermarks.is_idle(s, batch_time)],
            seconds=seconds, counts=RowCounts(released_rows=outcome.released.num_rows, held_rows=outcome.pending),
            filtered_rows=outcome.filtered + outcome.not_released, totals=dict(engine.counters))

    def left_open(self) -> int:
        """Rows held back by WATERMARK_TS()."""
        return self.engine.pending

    def left_open_line(self, left: int, store: StateStore | None) -> str:
        return (f"[{self.spec.pipeline_name}] input exhausted: {left} rows held back by WATERMARK_TS() stay in "
                f"{self.store.description} until the watermark reaches their release time")

    def _sql_errors(self, errors: pa.Table, batch_id: int) -> pa.Table:
        """Rows whose SQL failed as dead letters: the SELECT's columns plus ``_event_ts`` (from the hidden
        event time when the SELECT left it out), ``_source`` (when the SELECT left it out: the row's own,
        read from the row before the SQL), ``_source_row`` (unless ``include_source_row = "none"``),
        ``_batch_id`` and ``_reason``."""
        n = errors.num_rows
        letters = errors.drop_columns([c for c in (RELEASE_COLUMN, EVENT_US, SOURCE_ROW) if c in errors.column_names])
        if EVENT_TS not in letters.column_names:
            letters = letters.append_column(EVENT_TS, errors.column(EVENT_US).cast(UTC_MICROS))
        before = errors.column(SOURCE_ROW).to_pylist()
        if SOURCE not in letters.column_names:
            only = self.spec.sources[0].name if len(self.spec.sources) == 1 else None
            letters = letters.append_column(
                SOURCE, pa.array([json.loads(row)[SOURCE] if row else only for row in before], pa.string()))
        assert self.spec.dead_letter is not None  # dead letters are written
        if self.spec.dead_letter.include_source_row != "none":
            letters = letters.append_column(SOURCE_ROW, pa.array(before, pa.string()))
        return (letters.append_column(BATCH_ID, pa.array([batch_id] * n, pa.int64()))
                .append_column(REASON, pa.array(["sql_error"] * n, pa.string())))


def _nullable(table: pa.Table) -> pa.Table:
    """``table`` with every column nullable: dead letters of several kinds are concatenated, and a column one
    kind lacks (a SELECT without ``_source``) is NULL in its rows."""
    return table.cast(pa.schema([f.with_nullable(True) for f in table.schema]))
