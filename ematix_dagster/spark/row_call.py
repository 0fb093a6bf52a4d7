"""One micro-batch of a row pipeline, end to end (docs/contract/row-pipelines.md).

A row pipeline has no window: each batch classifies its rows (a bad event time goes to the dead
letters, as in a windowed pipeline), measures each source before the SQL, runs the SQL (guarded:
a row whose expression fails is a ``sql_error`` dead letter, never a failed batch) and hands the
driver the output rows, each with its event time and, under ``WATERMARK_TS()``, its release time
(``sql.row_query``). The driver (``streaming.row_release``) advances the watermark and says which
rows leave now and which are held back; the target write and the store commit then follow in the
windowed batch's order (target, fault point, one store transaction with the held rows inserted and
the released ones deleted), so a crash anywhere leaves either the batch before or this one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from ematix_dagster import faults
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
from ematix_dagster.spark import checkpoint
from ematix_dagster.spark.batch import BatchReport, InTransaction, already_committed, with_query_id
from ematix_dagster.spark.batch_columns import pre_sql_reason, source_stats
from ematix_dagster.spark.batch_counts import filtered_rows, sources_of
from ematix_dagster.spark.batch_values import with_batch_values
from ematix_dagster.spark.convert import UTC_MICROS, arrow_type
from ematix_dagster.spark.data_errors import data_error, is_data_error
from ematix_dagster.spark.file_dead_letters import DeadLetters
from ematix_dagster.spark.input_files import UNREADABLE_FILE, InputFiles
from ematix_dagster.spark.observed import Observed
from ematix_dagster.spark.plan import VIEW
from ematix_dagster.spark.readers import source_rows
from ematix_dagster.spark.recovery import named_offsets
from ematix_dagster.spark.row_plan import analyse_rows
from ematix_dagster.spark.safe_sql import SourceRow, guard_sql
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.sql.row_query import row_query
from ematix_dagster.streaming.durable import Provenance
from ematix_dagster.streaming.row_release import RowBatch, RowEngine, RowResult
from ematix_dagster.targets.base import DeadLetterWriter, RowWriter, WritesInTransaction
from state_store.base import BatchCommit, PipelineRecord, SourceProgress, StateStore
from state_store.codec import STATE_VERSION


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
class RowStep:
    """Everything a row pipeline's batch needs, opened by the runner before the query starts."""

    spec: PipelineSpec
    plan: RowPlan
    engine: RowEngine
    target: RowWriter
    dead_letter: DeadLetterWriter | None
    store: StateStore | None
    metrics: StreamingMetrics
    progress: Callable[[str], None]
    provenance: Provenance
    record: PipelineRecord | None = None
    input_files: InputFiles | None = None

    def run(self, df: DataFrame, batch_id: int) -> BatchReport | None:
        """Process Spark's batch ``batch_id``; None when the store already holds it (a replay)."""
        started = time.perf_counter()
        spec, engine = self.spec, self.engine
        if already_committed(spec, engine.last_batch_id, self.store, self.progress, batch_id):
            return None
        self.provenance = with_query_id(self.provenance, spec)
        offsets = checkpoint.read_offsets(spec.run.checkpoint_location, batch_id)
        batch_time = offsets.batch_timestamp_ms * 1_000
        in_transaction: InTransaction = []
        try:
            batch, dead = self._read_input(df, batch_id, batch_time, in_transaction)
        except Exception as exc:
            if is_data_error(exc):
                raise data_error(spec, batch_id, exc) from None
            raise
        store = self.store
        result = engine.process(batch, lambda w: store.load_pending(spec.pipeline_name, w) if store else [])
        self._write(batch_id, result.released, in_transaction)
        faults.point("target_write", batch_id)
        self._commit(batch_id, result, named_offsets(spec, offsets.offsets), in_transaction)
        faults.point("after_store_commit", batch_id)
        result.output_watermark = self._output_watermark(result)
        seconds = time.perf_counter() - started
        self.metrics.record_rows(spec.pipeline_name, batch.sources, result, dead, seconds)
        return BatchReport(
            batch_id=batch_id, batch_time=batch_time, rows_in=sum(s.rows for s in batch.sources.values()),
            rows_by_source={k: s.rows for k, s in batch.sources.items()}, windows_emitted=0, corrections=0,
            early_rows=0, retractions=0, late_rows=0, dead_letter_rows=sum(dead.values()), watermark=result.watermark,
            source_watermarks=engine.watermarks.source_watermarks(),
            idle_sources=[s for s in engine.watermarks.sources if engine.watermarks.is_idle(s, batch_time)],
            state_groups=0, windows_open=0, seconds=seconds, released_rows=result.released.num_rows,
            held_rows=result.pending, filtered_rows=result.filtered + result.not_released)

    def _read_input(self, df: DataFrame, batch_id: int, batch_time: int,
                    in_transaction: InTransaction) -> tuple[RowBatch, dict[str, int]]:
        """The batch read as the windowed step reads it: files of managed sources by the engine, an
        unreadable one left out (or stopping the run) and dead-lettered with the batch's own."""
        if self.input_files is None:
            self.input_files = InputFiles(self.spec, self.metrics.unreadable_files, self.progress)
        reader, own = self.input_files, cast(DeadLetters | None, self.dead_letter)  # postgres ones write in transactions
        if not reader.managed:
            return self._read(df, batch_id, batch_time, in_transaction, own)

        def run(frame: DataFrame, writer: DeadLetters | None) -> tuple[RowBatch, dict[str, int]]:
            return self._read(frame, batch_id, batch_time, in_transaction, writer)

        (batch, dead), rows, skipped = reader.attempt(df, batch_id, own, in_transaction, run)
        if rows is not None:
            if not dead:  # no write of the batch's own carried the files' rows
                assert own is not None
                self._write_dead_letters(own, batch_id, rows, in_transaction)
            dead = {**dead, UNREADABLE_FILE: rows.num_rows}
        for source, n in skipped.items():
            self.engine.counters[f"unreadable_files:{source}"] += n
        return batch, dead

    def _read(self, df: DataFrame, batch_id: int, batch_time: int, in_transaction: InTransaction,
              dead_letter: DeadLetters | None) -> tuple[RowBatch, dict[str, int]]:
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
        if dead_letter is not None and (bad or errors.num_rows):
            tables = []
            if bad:
                tables.append(rows.filter(F.col(REASON).isNotNull()).drop(TS, *BATCH_VALUES)
                              .withColumn(BATCH_ID, F.lit(batch_id).cast("bigint")).toArrow())
            if errors.num_rows:
                tables.append(self._sql_errors(errors, batch_id))
            letters = pa.concat_tables([_nullable(t) for t in tables], promote_options="permissive") \
                if len(tables) > 1 else tables[0]
            self._write_dead_letters(dead_letter, batch_id, letters, in_transaction)
            reasons = letters.column(REASON).to_pylist()
            dead = {r: reasons.count(r) for r in sorted(set(reasons))}
        # Under WATERMARK_TS() the WHERE filters nothing in Spark (its rows are the never-released ones)
        filtered = 0 if plan.delayed else filtered_rows(sources, table.num_rows + errors.num_rows)
        self.engine.counters["rejected_rows:sql_error"] += errors.num_rows
        return RowBatch(batch_id, batch_time, sources, table, filtered), dead

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

    def _output_watermark(self, result: RowResult) -> int | None:
        """W, or the oldest held row's event time when it is earlier: how far the output is complete."""
        if not result.pending or self.store is None:
            return result.watermark
        oldest = self.store.pending_summary(self.spec.pipeline_name).min_event_ts
        return result.watermark if oldest is None or result.watermark is None else min(result.watermark, oldest)

    def _write_dead_letters(self, writer: DeadLetters, batch_id: int, rows: pa.Table,
                            in_transaction: InTransaction) -> None:
        """The batch's one dead-letter write: in the store's transaction when they share a database."""
        dl, store = self.spec.dead_letter, self.spec.state_store
        assert dl is not None
        if dl.kind == "postgres" and store.kind == "postgres" and dl.url == store.url:
            in_transaction.append(lambda conn: writer.write_in_transaction(conn, batch_id, rows))
        else:
            writer.write(batch_id, rows)

    def _write(self, batch_id: int, rows: pa.Table, in_transaction: InTransaction) -> None:
        if self.spec.target.same_transaction:
            target = cast(WritesInTransaction, self.target)  # a postgres one: same_transaction
            in_transaction.append(lambda conn: target.write_in_transaction(conn, batch_id, rows))
        else:
            self.target.write(batch_id, rows)

    def _commit(self, batch_id: int, result: RowResult, offsets: dict[str, str], in_transaction: InTransaction) -> None:
        """One store transaction: held rows in, released ones out, offsets, watermarks, counters."""
        store = self.store
        if store is None or not store.durable:
            return
        marks, spec = self.engine.watermarks, self.spec
        record = PipelineRecord(
            pipeline=spec.pipeline_name, state_version=STATE_VERSION, query_id=self.provenance.query_id,
            last_batch_id=batch_id, fingerprint=self.provenance.fingerprint,
            fingerprint_doc=self.provenance.fingerprint_doc, watermark=marks.global_wm,
            sources={n: SourceProgress(c.max_event_ts, c.last_arrival) for n, c in marks.clocks.items()},
            counters=dict(self.engine.counters), offsets=offsets)
        store.commit(BatchCommit(record=record, pending_inserts=result.held, pending_released_up_to=result.released_up_to,
                                 in_transaction=[*in_transaction, lambda _conn: faults.point("store_commit", batch_id)]))
        self.record = record


def rows_changed(spec: PipelineSpec, store: StateStore, changes: list[str]) -> str:
    """Why a row pipeline refuses state written by another spec: rows held back by the old SQL hold its
    output columns and release times (SPEC §11: a changed output schema with rows pending refuses)."""
    pending = store.pending_summary(spec.pipeline_name).rows
    held = (f"{pending} row{'' if pending == 1 else 's'} pending (held back by WATERMARK_TS(), not written yet) "
            "hold the old SQL's output columns and release times" if pending else "no rows are pending")
    discards = f", which discards the {pending} pending rows" if pending else ""
    return (f"pipeline {spec.pipeline_name}: the state in {store.description} was written by another row pipeline "
            f"spec; changed: {'; '.join(changes) or 'fingerprint'}. {held}. Revert the change (the pending rows then "
            f"leave as planned), or start over with `ematix-dagster reset PIPELINE.toml --yes`{discards} (lateness, "
            "idleness and max_buffered_rows may change freely).")


def restore_rows(engine: RowEngine, record: PipelineRecord | None, pending: int) -> None:
    """Continue a row pipeline from its committed record and the number of rows it holds back."""
    engine.pending = pending
    if record is None:
        return
    engine.last_batch_id = record.last_batch_id
    engine.watermarks.global_wm = record.watermark
    for name, progress in record.sources.items():
        if name in engine.watermarks.clocks:
            clock = engine.watermarks.clocks[name]
            clock.max_event_ts, clock.last_arrival = progress.max_event_ts, progress.last_arrival
    engine.counters.update(record.counters)


def _nullable(table: pa.Table) -> pa.Table:
    """``table`` with every column nullable: dead letters of several kinds are concatenated, and a column one
    kind lacks (a SELECT without ``_source``) is NULL in its rows."""
    return table.cast(pa.schema([f.with_nullable(True) for f in table.schema]))
