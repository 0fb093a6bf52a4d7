"""One micro-batch, end to end, for every pipeline shape (docs/design.md, steps 1-7).

:class:`BatchStep` is the one place that orders a batch's side effects: skip a replay, read the
batch's offsets, read the input (the engine's own files, an unreadable one left out), write the dead
letters, write the target, commit one store transaction, then report. What differs between a
windowed and a row pipeline is only the :class:`EngineCall` it is given: the Spark work that turns
the batch's rows into the driver's input, and what the driver makes of it. A third shape (window
state kept by Spark) is a third ``EngineCall``; an orchestrator drives :class:`BatchStep` through
the runner and never sees the shape.

Kept apart from the runner, which owns the query's lifecycle and threads, so that what a batch
does can be read in one place and lifecycle code cannot disturb the order of its side effects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Generic, Protocol, TypeVar, cast

import pyarrow as pa
from pyspark.sql import DataFrame

from ematix_dagster import faults
from ematix_dagster.columns import HEARTBEAT, REASON
from ematix_dagster.errors import StateNotDurableError
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.batch.batch_report import BatchReport
from ematix_dagster.spark.failures.data_errors import data_error, is_data_error
from ematix_dagster.spark.input import checkpoint
from ematix_dagster.spark.input.file_dead_letters import DeadLetters
from ematix_dagster.spark.input.input_files import UNREADABLE_FILE, InputFiles
from ematix_dagster.spark.recovery import named_offsets, offset_names
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.durable import Progress, Provenance
from ematix_dagster.targets.writer import (
    CountsRows,
    DeadLetterWriter,
    RowWriter,
    WindowWriter,
    WritesBatchOnce,
    WritesInTransaction,
)
from state_store.contract import BatchCommit, PipelineRecord, StateStore
from state_store.loaded_groups import gc_paused

InTransaction = list[Callable[[object], None]]


class ShapeInput(Protocol):
    """What a shape's Spark work hands its driver: at least the batch's dead letters by reason."""

    dead_letters: dict[str, int]


In = TypeVar("In", bound=ShapeInput)
Out = TypeVar("Out")


@dataclass
class DeadLetterSink:
    """The batch's one dead-letter write: in the store's transaction when they share a database."""

    writer: DeadLetters | None
    batch_id: int
    in_transaction: InTransaction
    in_store: bool

    def write(self, rows: pa.Table) -> dict[str, int]:
        """Write ``rows`` (with their ``_reason``); their count by reason. Without a dead-letter
        target nothing is written and nothing counted."""
        writer, batch_id = self.writer, self.batch_id
        if writer is None:
            return {}
        if self.in_store:
            self.in_transaction.append(lambda conn: writer.write_in_transaction(conn, batch_id, rows))
        else:
            writer.write(batch_id, rows)
        return reason_counts(rows)


def reason_counts(rows: pa.Table) -> dict[str, int]:
    """Dead-letter rows per ``_reason``: the ``dead_letter_rows:<reason>`` counters of a batch."""
    reasons = rows.column(REASON).to_pylist()
    return {r: reasons.count(r) for r in sorted(set(reasons))}


class EngineCall(Protocol[In, Out]):
    """A pipeline shape's part of a batch: the only code a windowed and a row pipeline do not share.

    The batch step calls :meth:`read` (possibly again, without a file Spark cannot read), then
    :meth:`process`, writes :meth:`rows`, commits :meth:`commit` and reports :meth:`report`.
    """

    #: whether the target records (query, batch) with its rows, so that a replayed batch writes nothing
    #: twice (the PostgreSQL target; a parquet target replaces the batch's directory anyway)
    writes_once: ClassVar[bool]
    #: whether the engine reads the batches of the sources it reads itself (``Source.read_by_engine``)
    #: in :meth:`read`'s place; False: Spark's stream reads every source
    engine_reads: ClassVar[bool]

    @property
    def engine(self) -> Progress:
        """The driver's progress: its watermarks, counters and last batch."""

    @property
    def schema(self) -> pa.Schema:
        """The target's table: what :meth:`rows` returns."""

    def streamed(self, stream: DataFrame) -> DataFrame:
        """The frame the streaming query writes, given the sources' ``stream``: what :meth:`read` gets."""

    def replayed(self, df: DataFrame) -> None:
        """A batch the store already holds, replayed by Spark: what must still happen to it."""

    def read(self, df: DataFrame, batch_id: int, batch_time: int, letters: DeadLetterSink) -> In:
        """The batch's Spark work: the driver's input, its dead letters written through ``letters``."""

    def idle(self, batch_id: int, batch_time: int) -> In | None:
        """The input of a batch in which only the heartbeat ticked, without Spark; None: read it."""

    def process(self, batch: In) -> Out:
        """The driver's step: what the batch writes and what its commit changes."""

    def flush(self, batch_id: int, batch_time: int) -> tuple[In, Out] | None:
        """``end_of_input = "flush"`` after an ``available_now`` run: what is left to write, with the
        (empty) input it reports (None: the shape holds nothing a flush could write)."""

    def rows(self, outcome: Out) -> pa.Table:
        """The target's table of the batch."""

    def commit(self, outcome: Out, offsets: dict[str, str], provenance: Provenance,
               in_transaction: InTransaction) -> BatchCommit:
        """The store transaction of the batch."""

    def forget(self) -> None:
        """No store keeps the batch: drop what a commit would have taken."""

    def report(self, batch: In, outcome: Out, seconds: float | None) -> BatchReport:
        """The batch's report, after its commit, its metrics recorded (``seconds`` None: the
        end-of-input flush, which reads nothing and is not timed)."""

    def left_open(self) -> int:
        """What a run leaves for the next one: windows not emitted, or rows held back."""

    def left_open_line(self, left: int, store: StateStore | None) -> str:
        """The progress line of an ``available_now`` run that ends with ``left`` open (no flush)."""


@dataclass
class BatchStep(Generic[In, Out]):
    """Everything a batch needs, opened by the runner before the query starts.

    ``record`` is the last committed pipeline record: the end-of-input flush reads no input and
    commits that record's offsets again.
    """

    spec: PipelineSpec
    call: EngineCall[In, Out]
    target: WindowWriter | RowWriter
    dead_letter: DeadLetterWriter | None
    store: StateStore | None
    metrics: StreamingMetrics
    progress: Callable[[str], None]
    provenance: Provenance
    record: PipelineRecord | None = None
    last_batch_time: int = 0
    input_files: InputFiles | None = field(init=False, default=None)

    @property
    def schema(self) -> pa.Schema:
        """The rows the target receives (Dagster's column schema of the output)."""
        return self.call.schema

    def target_row_count(self) -> int | None:
        """The target table's size as of its last commit (Dagster's ``dagster/row_count``): a
        count the PostgreSQL target keeps with each commit, read on a connection of its own, so
        any thread may ask while a batch is written. None for a target that keeps none (parquet,
        console) or before its writer first opened the table; a
        :class:`~ematix_dagster.errors.TargetError` when the database cannot be read."""
        return self.target.row_count() if isinstance(self.target, CountsRows) else None

    def run(self, df: DataFrame, batch_id: int) -> BatchReport | None:
        """Process Spark's batch ``batch_id``; None when the store already holds it (a replay).

        The cyclic garbage collector is paused meanwhile: a batch makes and keeps hundreds of
        thousands of small containers (partials, accumulators, rows), none in a cycle, and every
        collection would walk the whole window state again (docs/decisions.md).
        """
        with gc_paused():
            return self._run(df, batch_id)

    def _run(self, df: DataFrame, batch_id: int) -> BatchReport | None:
        started = time.perf_counter()
        spec, call = self.spec, self.call
        if already_committed(spec, call.engine.last_batch_id, self.store, self.progress, batch_id):
            call.replayed(df)
            return None
        self.provenance = with_query_id(self.provenance, spec)
        offsets = checkpoint.read_offsets(spec.run.checkpoint_location, batch_id)
        batch_time = offsets.batch_timestamp_ms * 1_000
        self.last_batch_time = batch_time
        in_transaction: InTransaction = []
        batch = None if self._reads_input(offsets) else call.idle(batch_id, batch_time)
        if batch is None:
            try:
                batch = self._read(df, batch_id, batch_time, in_transaction)
            except Exception as exc:
                if is_data_error(exc):
                    raise data_error(spec, batch_id, exc) from None
                raise
        outcome = call.process(batch)
        self._write(batch_id, call.rows(outcome), in_transaction)
        faults.point("target_write", batch_id)
        self._commit(batch_id, outcome, named_offsets(spec, offsets.offsets), in_transaction)
        faults.point("after_store_commit", batch_id)
        return call.report(batch, outcome, time.perf_counter() - started)

    def flush(self) -> BatchReport | None:
        """``end_of_input = "flush"``: what the shape has left, written beside the last real batch.

        It takes the last batch's id (its own file part, ``flush``), so a later run's next batch id
        stays free; it reads no input, so its commit keeps the last batch's offsets.
        """
        call = self.call
        batch_id = call.engine.last_batch_id if call.engine.last_batch_id is not None else 0
        flushed = call.flush(batch_id, self.last_batch_time)
        if flushed is None:
            faults.point("after_store_commit", "flush")
            return None
        batch, outcome = flushed
        in_transaction: InTransaction = []
        self._write(batch_id, call.rows(outcome), in_transaction, part="flush")
        faults.point("target_write", "flush")
        self._commit("flush", outcome, self.record.offsets if self.record else {}, in_transaction)
        faults.point("after_store_commit", "flush")
        return call.report(batch, outcome, None)

    def _reads_input(self, offsets: checkpoint.BatchOffsets) -> bool:
        """Whether a data source advanced since the previous batch (its offset line changed).

        A batch in which only the heartbeat ticked (``processing_time`` with no new input) holds no
        rows; a shape that needs no Spark for it (:meth:`EngineCall.idle`) skips Spark altogether
        and only lets the watermark move by idleness or processing time.
        """
        cp, batch_id = self.spec.run.checkpoint_location, offsets.batch_id
        if batch_id == 0 or not checkpoint.offsets_exist(cp, batch_id - 1):
            return True
        before = checkpoint.read_offsets(cp, batch_id - 1).offsets
        if len(before) != len(offsets.offsets):
            return True
        names = offset_names(self.spec)
        return any(now != then for name, now, then in zip(names, offsets.offsets, before) if name != HEARTBEAT)

    def _read(self, df: DataFrame, batch_id: int, batch_time: int, in_transaction: InTransaction) -> In:
        """The shape's Spark work over the batch; the files of managed sources read by the engine.

        ``input_files.InputFiles`` reads the batch's files of the managed files sources (parquet on
        a local path, and every source with on_unreadable_file = "skip"); the batch is planned again
        without each file Spark fails on. The left-out files' dead-letter rows join the batch's own
        in one write (a postgres write replaces the batch's rows).
        """
        if self.input_files is None:
            self.input_files = InputFiles(self.spec, self.metrics.unreadable_files, self.progress)
        reader, own = self.input_files, cast(DeadLetters | None, self.dead_letter)

        def read(frame: DataFrame, writer: DeadLetters | None) -> In:
            return self.call.read(frame, batch_id, batch_time, self._letters(writer, batch_id, in_transaction))

        if not reader.managed or not self.call.engine_reads:
            return read(df, own)
        batch, rows, skipped = reader.attempt(df, batch_id, own, in_transaction, read)
        if rows is not None:
            if not batch.dead_letters:  # no write of the batch's own carried the files' rows
                self._letters(own, batch_id, in_transaction).write(rows)
            batch.dead_letters = {**batch.dead_letters, UNREADABLE_FILE: rows.num_rows}
        for source, n in skipped.items():
            self.call.engine.counters[f"unreadable_files:{source}"] += n
        return batch

    def _letters(self, writer: DeadLetters | None, batch_id: int, in_transaction: InTransaction) -> DeadLetterSink:
        dl, store = self.spec.dead_letter, self.spec.state_store
        in_store = dl is not None and dl.kind == "postgres" and store.kind == "postgres" and dl.url == store.url
        return DeadLetterSink(writer, batch_id, in_transaction, in_store)

    def _write(self, batch_id: int, table: pa.Table, in_transaction: InTransaction, part: str = "part-0") -> None:
        """The target's write of the batch: in the store's transaction with ``same_transaction``; fenced
        by (query, batch) where the call asks for it and the target keeps a fence (PostgreSQL)."""
        target, query = self.target, self.provenance.query_id or ""
        once = self.call.writes_once and isinstance(target, WritesBatchOnce) and bool(query)
        if self.spec.target.same_transaction:
            if once:
                fenced = cast(WritesBatchOnce, target)

                def write_once(conn: object) -> None:
                    fenced.write_batch_once_in_transaction(conn, query, batch_id, table)
                in_transaction.append(write_once)
            else:
                own = cast(WritesInTransaction, target)  # a postgres one: same_transaction
                in_transaction.append(lambda conn: own.write_in_transaction(conn, batch_id, table))
        elif once:
            cast(WritesBatchOnce, target).write_batch_once(query, batch_id, table)
        else:
            target.write(batch_id, table, part)

    def _commit(self, label: int | str, outcome: Out, offsets: dict[str, str], in_transaction: InTransaction) -> None:
        """One store transaction: the shape's changes, offsets, watermarks, counters.

        ``label`` names the batch for fault points: its id, or ``flush`` for the end-of-input flush.
        """
        store = self.store
        if store is None or not store.durable:
            self.call.forget()
            return
        commit = self.call.commit(outcome, offsets, self.provenance,
                                  [*in_transaction, lambda _conn: faults.point("store_commit", label)])
        store.commit(commit)
        self.record = commit.record


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
