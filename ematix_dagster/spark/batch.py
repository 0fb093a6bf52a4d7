"""One micro-batch, end to end: plan, collect, engine, write, commit (docs/design.md, steps 1-7).

Kept apart from the runner, which owns the query's lifecycle and threads, so that what a batch
does can be read in one place and the order of its side effects (target, dead letters, store
transaction, fault points) cannot be disturbed by lifecycle code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from ematix_dagster import faults
from ematix_dagster.columns import CLASS, HEARTBEAT, REASON
from ematix_dagster.errors import StateNotDurableError
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark import checkpoint
from ematix_dagster.spark.batch_counts import batch_counts, filtered_rows, may_hold_future_rows, sources_of
from ematix_dagster.spark.batch_job import BatchFrames, build_batch
from ematix_dagster.spark.batch_shuffle import BatchShuffle
from ematix_dagster.spark.convert import partial_lists, rows_to_arrow
from ematix_dagster.spark.data_errors import data_error, is_data_error
from ematix_dagster.spark.emit_release import EmitStage
from ematix_dagster.spark.file_dead_letters import DeadLetters
from ematix_dagster.spark.input_files import UNREADABLE_FILE, InputFiles
from ematix_dagster.spark.plan import BatchPlan
from ematix_dagster.spark.recovery import named_offsets, offset_names
from ematix_dagster.spark.windows.driver_late import late_windows
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.durable import Provenance, batch_commit
from ematix_dagster.streaming.emitted import Emitted
from ematix_dagster.streaming.micro_batch import BatchInput, BatchResult, Engine, SourceStats
from ematix_dagster.streaming.windows import format_us
from ematix_dagster.targets import DeadLetterWriter, WindowWriter
from ematix_dagster.targets.base import WritesInTransaction
from state_store.base import PipelineRecord, StateStore
from state_store.codec import encode_keys
from state_store.loaded_groups import gc_paused

InTransaction = list[Callable[[object], None]]

#: the engine counter holding how many rows the last batch wrote (set per batch, committed with it):
#: the end-of-input flush numbers its rows after them (``_emit_seq``), in this run or a later one
#: that has no batch of its own (the counter then comes back from the store)
LAST_BATCH_ROWS = "last_batch_rows_written"


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch did, for progress lines, metrics and Dagster metadata."""

    batch_id: int
    batch_time: int
    rows_in: int
    rows_by_source: dict[str, int]
    windows_emitted: int
    corrections: int
    early_rows: int
    retractions: int
    late_rows: int
    dead_letter_rows: int
    watermark: int | None
    source_watermarks: dict[str, int | None]
    idle_sources: list[str]
    state_groups: int
    windows_open: int
    seconds: float
    #: a row pipeline's: rows written, and rows held back by WATERMARK_TS() after the batch (None:
    #: a windowed pipeline's report)
    released_rows: int | None = None
    held_rows: int | None = None
    #: rows the SQL left out (its WHERE; a row pipeline's never-released rows too)
    filtered_rows: int = 0

    def progress_line(self, pipeline: str) -> str:
        """One line per batch; early rows and retractions only when there are some (a pipeline
        whose trigger is the watermark and that never retracts prints the line it always did)."""
        if self.released_rows is not None:
            return (f"[{pipeline}] batch {self.batch_id}: rows in {self.rows_in}, rows out {self.released_rows}, "
                    f"held back {self.held_rows}{self._filtered}, watermark {format_us(self.watermark)}, dead "
                    f"letters {self.dead_letter_rows}, {self.seconds:.2f}s")
        extra = "".join(f", {label} {n}" for label, n in (("early rows", self.early_rows),
                                                          ("retractions", self.retractions)) if n)
        return (f"[{pipeline}] batch {self.batch_id}: rows in {self.rows_in}{self._filtered}, windows emitted "
                f"{self.windows_emitted} (+{self.corrections} corrections){extra}, watermark "
                f"{format_us(self.watermark)}, late rows {self.late_rows}, state groups {self.state_groups}, "
                f"{self.seconds:.2f}s")

    @property
    def _filtered(self) -> str:
        """Rows the SQL left out, when there are some (a pipeline without a WHERE prints the line it always did)."""
        return f", filtered {self.filtered_rows}" if self.filtered_rows else ""


def already_committed(spec: PipelineSpec, last_batch_id: int | None, store: StateStore | None,
                      progress: Callable[[str], None], batch_id: int) -> bool:
    """Spark replays a batch the store committed (it crashed before recording it): already counted,
    skipped. With state in memory only that cannot be told from a lost batch, so it stops the run."""
    if last_batch_id is None or batch_id > last_batch_id:
        return False
    if store is None or not store.durable:
        raise StateNotDurableError(f"pipeline {spec.pipeline_name}: Spark replayed batch {batch_id} "
                                   "but in-memory state already holds it")
    progress(f"[{spec.pipeline_name}] batch {batch_id} is already in the state store: replay skipped")
    return True


def with_query_id(provenance: Provenance, spec: PipelineSpec) -> Provenance:
    """``provenance`` with the streaming query's id, read from the checkpoint once it has one."""
    if provenance.query_id is not None:
        return provenance
    return Provenance(checkpoint.query_id(spec.run.checkpoint_location), provenance.fingerprint,
                      provenance.fingerprint_doc)


@dataclass
class BatchStep:
    """Everything a batch needs, opened by the runner before the query starts.

    ``record`` is the last committed pipeline record: the end-of-input flush reads no input and
    commits that record's offsets again.
    """

    spec: PipelineSpec
    plan: BatchPlan
    engine: Engine
    schema: pa.Schema
    target: WindowWriter
    dead_letter: DeadLetterWriter | None
    store: StateStore | None
    metrics: StreamingMetrics
    progress: Callable[[str], None]
    provenance: Provenance
    record: PipelineRecord | None = None
    last_batch_time: int = 0
    #: ``[emit] sql``: which emitted rows leave now (the rest wait in the store, loaded from it here)
    emit: EmitStage | None = field(init=False, default=None)
    shuffle: BatchShuffle = field(init=False, default_factory=BatchShuffle)

    def __post_init__(self) -> None:
        self.emit = EmitStage.open(self.spec, self.store, self.schema)

    def run(self, df: DataFrame, batch_id: int) -> BatchReport | None:
        """Process Spark's batch ``batch_id``; None when the store already holds it (a replay).

        The cyclic garbage collector is paused meanwhile: a batch makes and keeps hundreds of
        thousands of small containers (partials, accumulators, rows), none in a cycle, and every
        collection would walk the whole window state again (measured: a third of a sliding
        window batch's driver CPU).
        """
        with gc_paused():
            return self._run(df, batch_id)

    def _run(self, df: DataFrame, batch_id: int) -> BatchReport | None:
        started = time.perf_counter()
        spec, engine = self.spec, self.engine
        if already_committed(spec, engine.last_batch_id, self.store, self.progress, batch_id):
            return None
        self.provenance = with_query_id(self.provenance, spec)
        offsets = checkpoint.read_offsets(spec.run.checkpoint_location, batch_id)
        batch_time = offsets.batch_timestamp_ms * 1_000
        self.last_batch_time = batch_time
        in_transaction: InTransaction = []
        if self._reads_input(offsets):
            try:
                batch = self._aggregate_input(df, batch_id, batch_time, in_transaction)
            except Exception as exc:
                if is_data_error(exc):
                    raise data_error(spec, batch_id, exc) from None
                raise
        else:
            batch = BatchInput(batch_id, batch_time, {s.name: SourceStats() for s in spec.sources})
        result = engine.process(batch)
        engine.counters[LAST_BATCH_ROWS] = len(result.emitted)
        if self.emit is not None:
            result = self.emit.release(engine, result, batch_time, self._table)
        self._write(batch_id, result, in_transaction)
        faults.point("target_write", batch_id)
        self._commit(batch_id, batch_id, named_offsets(spec, offsets.offsets), in_transaction)
        faults.point("after_store_commit", batch_id)
        seconds = time.perf_counter() - started
        self.metrics.record(spec.pipeline_name, spec.window.kind, spec.window.late_data, batch, result, seconds)
        if self.emit is not None:
            self.emit.record(self.metrics)
        return self._report(batch, result, seconds)

    def _reads_input(self, offsets: checkpoint.BatchOffsets) -> bool:
        """Whether a data source advanced since the previous batch (its offset line changed).

        A batch in which only the heartbeat ticked (``processing_time`` with no new input) holds no
        rows; it skips Spark altogether (no plan, no job: the query's own bookkeeping is all it
        costs) and only lets the watermark move by idleness or processing time.
        """
        cp, batch_id = self.spec.run.checkpoint_location, offsets.batch_id
        if batch_id == 0 or not checkpoint.offsets_exist(cp, batch_id - 1):
            return True
        before = checkpoint.read_offsets(cp, batch_id - 1).offsets
        if len(before) != len(offsets.offsets):
            return True
        names = offset_names(self.spec)
        return any(now != then for name, now, then in zip(names, offsets.offsets, before) if name != HEARTBEAT)

    def _aggregate(self, df: DataFrame, batch_id: int, batch_time: int, in_transaction: InTransaction,
                   dead_letter: DeadLetterWriter | None) -> BatchInput:
        """The batch's Spark work: one job computes the partials and every counter."""
        engine, spec = self.engine, self.spec
        self.shuffle.plan(df.sparkSession)
        bounds = (engine.closed_before(), engine.emitted_before())
        late_on_driver = self.plan.late_on_driver is not None
        frames = build_batch(df.sparkSession, self.plan, df, batch_id, batch_time, *bounds, late_on_driver)
        table = frames.partials.toArrow()
        self.shuffle.ran(table)
        if late_on_driver:
            if may_hold_future_rows(spec, table, batch_time):  # this batch the exact way
                frames = build_batch(df.sparkSession, self.plan, df, batch_id, batch_time, *bounds)
                table = frames.partials.toArrow()
            else:
                table = late_windows(spec.window, table, *bounds)
        src, late = batch_counts(spec, table, frames.source_stats)
        stats = sources_of(spec, src)
        dead = self._write_dead_letters(dead_letter, batch_id, frames, stats, late["late_rows"], late["rejected"],
                                        in_transaction)
        classes = table.column(CLASS)
        windowed = table if classes.null_count == len(classes) else table.filter(pc.is_null(classes))
        kind_plan = self.plan.late_on_driver or self.plan.columns.windows  # the exact plan is built only if a batch needs it
        if kind_plan.sort_by_start:
            windowed = windowed.sort_by(kind_plan.start_column)
        starts, keys, values = partial_lists(self.plan, windowed, kind_plan.start_column, engine.state.typed_partials)
        lasts = windowed.column(kind_plan.last_column).to_pylist() if kind_plan.last_column else []
        return BatchInput(batch_id=batch_id, batch_time=batch_time, sources=stats, starts=starts, keys=keys,
                          partials=values, lasts=lasts, late_rows=late["late_rows"],
                          late_assignments=late["late_assignments"], reopened_rows=late["reopened_rows"],
                          rejected=late["rejected"], dead_letters=dead,
                          filtered=filtered_rows(stats, late["rows"]) if spec.transform_sql else 0)

    def flush(self) -> BatchReport:
        """``end_of_input = "flush"``: emit every open window, written beside the last real batch.

        It takes the last batch's id (its own file part), so a later run's next batch id stays free,
        and numbers its rows after that batch's (:data:`LAST_BATCH_ROWS`): a reader orders the two
        files' rows of one key by ``_emit_seq``. The flush leaves the counter as it is, so a flush
        replayed after a crash numbers its rows as the first try did.
        """
        spec, engine = self.spec, self.engine
        batch_id = engine.last_batch_id if engine.last_batch_id is not None else 0
        result = engine.flush(batch_id, self.last_batch_time)
        if self.emit is not None:  # its rows all wait for a later batch (SPEC §11)
            result = self.emit.release(engine, result, self.last_batch_time, self._table,
                                       engine.counters[LAST_BATCH_ROWS], flush=True)
        in_transaction: InTransaction = []
        self._write(batch_id, result, in_transaction, part="flush", first_seq=engine.counters[LAST_BATCH_ROWS])
        faults.point("target_write", "flush")
        # The flush reads no input: the offsets stay those of the last committed batch.
        self._commit(batch_id, "flush", self.record.offsets if self.record else {}, in_transaction)
        faults.point("after_store_commit", "flush")
        self.metrics.record_emit(spec.pipeline_name, spec.window.kind, result)
        if self.emit is not None:
            self.emit.record(self.metrics)
        return self._report(BatchInput(batch_id, self.last_batch_time, {}), result, 0.0)

    def _write_dead_letters(self, dead_letter: DeadLetterWriter | None, batch_id: int, frames: BatchFrames,
                            stats: dict[str, SourceStats], late_rows: int, rejected: dict[str, int],
                            in_transaction: InTransaction) -> dict[str, int]:
        if dead_letter is None:
            return {}
        tables: list[pa.Table] = []
        if any(s.invalid or s.future or s.malformed for s in stats.values()):
            tables.append(frames.bad_rows().toArrow())
        classes = [*(["late"] if late_rows and self.spec.window.late_data == "dlq" else []), *rejected]
        if classes:  # the post-SQL ones in one frame (one Spark job)
            tables.append(frames.class_rows(classes).toArrow())
        if not tables:
            return {}
        rows = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
        self._write_dead_letter_rows(dead_letter, batch_id, rows, in_transaction)
        reasons = rows.column(REASON).to_pylist()
        return {r: reasons.count(r) for r in sorted(set(reasons))}

    def _write_dead_letter_rows(self, dead_letter: DeadLetterWriter, batch_id: int, rows: pa.Table,
                                in_transaction: InTransaction) -> None:
        """The batch's one dead-letter write: in the store's transaction when they share a database."""
        if self._dead_letters_in_store:
            writer = cast(WritesInTransaction, dead_letter)  # a postgres one: _dead_letters_in_store
            in_transaction.append(lambda conn: writer.write_in_transaction(conn, batch_id, rows))
        else:
            dead_letter.write(batch_id, rows)

    def _write(self, batch_id: int, result: BatchResult, in_transaction: InTransaction, part: str = "part-0",
               first_seq: int = 0) -> None:
        table = self._table(result.emitted, first_seq)
        if self.spec.target.same_transaction:
            target = cast(WritesInTransaction, self.target)  # a postgres one: same_transaction
            in_transaction.append(lambda conn: target.write_in_transaction(conn, batch_id, table))
        else:
            self.target.write(batch_id, table, part)

    def _table(self, emitted: Emitted, first_seq: int = 0) -> pa.Table:
        """``emitted`` as the target's table, ``_emit_seq`` from ``first_seq``."""
        ids = None
        kind = self.engine.state.kind
        if kind.id_column is not None:
            ids = kind.row_ids(self.spec.pipeline_name, encode_keys(emitted.keys), emitted.starts)
        return rows_to_arrow(self.schema, emitted, len(self.spec.window.group_by), ids, first_seq)

    @property
    def _dead_letters_in_store(self) -> bool:
        """Postgres dead letters in the Postgres store's database commit with the state."""
        dl, store = self.spec.dead_letter, self.spec.state_store
        return dl is not None and dl.kind == "postgres" and store.kind == "postgres" and dl.url == store.url

    def _commit(self, batch_id: int, label: int | str, offsets: dict[str, str], in_transaction: InTransaction) -> None:
        """One store transaction: changed groups, evicted windows, offsets, watermarks, counters.

        ``label`` names the batch for fault points: its id, or ``flush`` for the end-of-input flush.
        """
        store = self.store
        if store is None or not store.durable:
            self.engine.state.take_column_changes()  # nothing keeps the changes: forget them
            return
        commit = batch_commit(self.engine, self.spec.pipeline_name, self.provenance, offsets,
                              [*in_transaction, lambda _conn: faults.point("store_commit", label)])
        if self.emit is not None:
            self.emit.add_to(commit)
        store.commit(commit)
        self.record = commit.record

    def _report(self, batch: BatchInput, result: BatchResult, seconds: float) -> BatchReport:
        return BatchReport(
            batch_id=batch.batch_id, batch_time=batch.batch_time,
            rows_in=sum(s.rows for s in batch.sources.values()),
            rows_by_source={k: s.rows for k, s in batch.sources.items()},
            windows_emitted=result.finals, corrections=result.corrections, early_rows=result.early,
            retractions=result.retractions, late_rows=batch.late_rows,
            dead_letter_rows=sum(batch.dead_letters.values()), watermark=result.watermark,
            source_watermarks=result.source_watermarks, idle_sources=result.idle_sources,
            state_groups=result.groups, windows_open=result.windows_open, seconds=seconds,
            filtered_rows=batch.filtered,
        )

    # -- input files the engine reads itself (issue 13) ------------------------------------------
    # ``input_files.InputFiles`` reads the batch's files of the managed files sources (parquet on a
    # local path, and every source with on_unreadable_file = "skip"); the batch is planned again
    # without each file Spark fails on. The left-out files' dead-letter rows join the batch's own in
    # one write (a postgres write replaces the batch's rows).

    input_files: InputFiles | None = None

    def _aggregate_input(self, df: DataFrame, batch_id: int, batch_time: int,
                         in_transaction: InTransaction) -> BatchInput:
        if self.input_files is None:
            self.input_files = InputFiles(self.spec, self.metrics.unreadable_files, self.progress)
        reader = self.input_files
        if not reader.managed:
            return self._aggregate(df, batch_id, batch_time, in_transaction, self.dead_letter)
        own = self.dead_letter

        def run(frame: DataFrame, writer: DeadLetters | None) -> BatchInput:
            return self._aggregate(frame, batch_id, batch_time, in_transaction, cast(DeadLetterWriter | None, writer))

        batch, rows, skipped = reader.attempt(df, batch_id, cast(DeadLetters | None, own), in_transaction, run)
        if rows is not None:
            if not batch.dead_letters:  # no write of the batch's own carried the files' rows
                assert own is not None
                self._write_dead_letter_rows(own, batch_id, rows, in_transaction)
            batch.dead_letters = {**batch.dead_letters, UNREADABLE_FILE: rows.num_rows}
        for source, n in skipped.items():
            self.engine.counters[f"unreadable_files:{source}"] += n
        return batch

