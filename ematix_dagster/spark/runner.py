"""Run a pipeline as a Spark Structured Streaming query with a ``foreachBatch`` sink.

The flow of one micro-batch (DESIGN.md §1): read the batch time from ``offsets/N``, build the
Spark frames (``partials.build_batch``), pull the partials to the driver as Arrow, let the pure
:class:`~ematix_dagster.streaming.micro_batch.Engine` merge and emit, write the target and the
dead letters, record metrics, report progress.

Blocking py4j calls (waiting for the query) run on a background thread and batch reports travel
through a queue, so the caller's thread (the CLI, or a Dagster step that may be interrupted)
never sits inside py4j (DESIGN.md §4).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from ematix_dagster import faults
from ematix_dagster.errors import (
    CheckpointDiverged, FingerprintChanged, SparkQueryFailed, StateNotDurableError, first_line,
)
from ematix_dagster.failures import classify
from ematix_dagster.fingerprint import describe_changes, fingerprint, fingerprint_doc
from ematix_dagster.metrics import StreamingMetrics, default_metrics, serve
from ematix_dagster.spark import checkpoint
from ematix_dagster.spark.convert import output_schema, partial_lists, rows_to_arrow
from ematix_dagster.spark.partials import BatchFrames, BatchPlan, analyse, build_batch
from ematix_dagster.spark.session import get_spark
from ematix_dagster.spark.sources import union_sources
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.micro_batch import BatchInput, BatchResult, Engine, SourceStats
from ematix_dagster.streaming.windows import format_us
from ematix_dagster.recovery import named_offsets, validate_checkpoint
from ematix_dagster.stores import guarantee, make_store
from ematix_dagster.targets import DeadLetterWriter, WindowWriter, make_dead_letter_writer, make_window_writer
from state_store.base import BatchCommit, PipelineRecord, RecoveredState, SourceProgress, StateStore, make_holder
from state_store.codec import STATE_VERSION, decode_groups, encode_key, encode_state

GIB = 1 << 30


class _BatchAbandoned(Exception):
    """Raised in a batch that starts after a stop was requested, so Spark does not commit it."""


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch did, for progress lines, metrics and Dagster metadata."""

    batch_id: int
    batch_time: int
    rows_in: int
    rows_by_source: dict[str, int]
    windows_emitted: int
    corrections: int
    late_rows: int
    dead_letter_rows: int
    watermark: int | None
    source_watermarks: dict[str, int | None]
    idle_sources: list[str]
    state_groups: int
    windows_open: int
    seconds: float

    def progress_line(self, pipeline: str) -> str:
        return (f"[{pipeline}] batch {self.batch_id}: rows in {self.rows_in}, windows emitted {self.windows_emitted}"
                f" (+{self.corrections} corrections), watermark {format_us(self.watermark)}, late rows {self.late_rows},"
                f" state groups {self.state_groups}, {self.seconds:.2f}s")


@dataclass
class RunSummary:
    pipeline: str
    batches: int = 0
    rows_in: int = 0
    windows_emitted: int = 0
    late_rows: int = 0
    last_batch_id: int | None = None
    windows_left_open: int = 0
    reports: list[BatchReport] = field(default_factory=list)


class PipelineRunner:
    """One streaming query's lifetime for one pipeline spec.

    ``PipelineRunner(load_pipeline("p.toml")).run()`` runs to the end of the input (or until
    :meth:`request_stop`); :meth:`events` yields a report per batch instead, for Dagster.
    """

    def __init__(self, spec: PipelineSpec, spark: SparkSession | Callable[[], SparkSession] | None = None,
                 metrics: StreamingMetrics | None = None, progress: Callable[[str], None] | None = None,
                 store: StateStore | None = None, run_label: str | None = None,
                 batch_progress: Callable[[BatchReport], None] | None = None) -> None:
        # Sources, stores, targets and the checkpoint are opened with ``${NAME}`` expanded; the
        # fingerprint that the state records keeps the placeholders (never a value).
        self.spec = spec.resolved()
        # Spark starts only after the lease is held and the state checked, so a run that cannot
        # proceed is refused in a second instead of after a JVM start.
        self._spark = spark if spark is not None else (lambda: get_spark(f"ematix-{spec.pipeline_name}"))
        self.metrics = metrics or default_metrics()
        self.progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
        # Hook: a caller that reports batches itself (the Dagster step logs no line for heartbeat-only
        # batches) receives each report here instead of ``progress`` getting its progress line.
        self.batch_progress = batch_progress
        self.query: StreamingQuery | None = None
        self._events: queue.Queue[object] = queue.Queue()
        self._lock = threading.Lock()
        self._stopping = False
        self._error: BaseException | None = None
        self._last_batch_time = 0
        self.store: StateStore | None = store if store is not None else (
            make_store(self.spec.state_store) if spec.state_store.durable else None)
        self.run_label = run_label
        self.recovered = RecoveredState(record=None)
        self.fingerprint_doc = fingerprint_doc(spec)  # as written
        self.fingerprint = fingerprint(self.fingerprint_doc)
        self.query_id: str | None = None
        self.target: WindowWriter | None = None
        self.dead_letter: DeadLetterWriter | None = None
        self._store_open = False

    # -- start -------------------------------------------------------------------------------

    def _preflight(self) -> None:
        spec = self.spec
        cp = spec.run.checkpoint_location
        name = spec.pipeline_name
        if self.store is None or not self.store.durable:
            if checkpoint.committed_batches(cp):
                raise StateNotDurableError(
                    f"pipeline {name}: checkpoint {cp} already holds progress, but window state is kept in memory "
                    "only, so a restart would silently lose the open windows. Delete the checkpoint directory to "
                    "reprocess the input from the start (fix), or configure a durable [state_store] (sqlite, postgres)."
                )
        else:
            self._open_store()
        if spec.metrics_port:
            serve(spec.metrics_port, pipeline=name)
        bound = spec.state_upper_bound_bytes()
        if bound > GIB:
            self.progress(f"[{name}] warning: window state may grow to {bound / GIB:.1f} GiB "
                          "(active windows x max_groups_per_window x per-group state); lower max_groups_per_window "
                          "or hll_precision if that is more than this machine has")
        if spec.target.kind == "console":
            self.progress(f"[{name}] warning: the console target is not idempotent: output is "
                          "at-least-once and a restart may print windows again")
        self.progress(f"[{name}] guarantee: {guarantee(spec)}")

    def _open_store(self) -> None:
        spec, store = self.spec, self.store
        assert store is not None
        name = spec.pipeline_name
        store.open()
        self._store_open = True
        try:
            store.acquire_lease(name, make_holder(self.run_label))
            self.recovered = store.load(name)
            record = self.recovered.record
            if record is not None and record.fingerprint and record.fingerprint != self.fingerprint:
                changes = describe_changes(record.fingerprint_doc, self.fingerprint_doc)
                raise FingerprintChanged(
                    f"pipeline {name}: the state in {store.description} was written for another window shape; "
                    f"changed: {'; '.join(changes) or 'fingerprint'}. Revert the change, or start over with "
                    "`ematix-dagster reset PIPELINE.toml --yes` (lateness, caps and idleness may change freely).")
            problems = validate_checkpoint(spec, record)
            if problems:
                raise CheckpointDiverged(f"pipeline {name}: " + " | ".join(str(p) for p in problems))
        except BaseException as exc:
            self._close_store(failure=exc)
            raise
        if record is not None:
            self.progress(f"[{name}] resuming from {store.description} at batch {record.last_batch_id}")

    def _close_resources(self, failure: BaseException | None = None) -> None:
        """Release the lease and close the store and the writers (whatever was opened).

        After a ``failure`` the cleanup's own errors (a database that is gone cannot release a
        lease either) are reported as warnings, so they never replace the error that matters.
        """
        steps = [lambda: self._close_store(failure)]
        steps += [writer.close for writer in (self.target, self.dead_letter) if writer is not None]
        self._cleanup(steps, failure)

    def _close_store(self, failure: BaseException | None = None) -> None:
        if self.store is not None and self._store_open:
            self._store_open = False
            store = self.store
            self._cleanup([lambda: store.release_lease(self.spec.pipeline_name), store.close], failure)

    def _cleanup(self, steps: list[Callable[[], None]], failure: BaseException | None) -> None:
        """Run every step; raise the first error only when nothing failed before the cleanup."""
        first: BaseException | None = None
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - reported below, never hides ``failure``
                if failure is None and first is None:
                    first = exc
                else:
                    self.progress(f"[{self.spec.pipeline_name}] warning: cleanup after the error failed too: "
                                  f"{type(exc).__name__}: {first_line(exc)}")
        if first is not None:
            raise first

    @property
    def spark(self) -> SparkSession:
        if callable(self._spark):
            self._spark = self._spark()
        return self._spark

    def start(self) -> StreamingQuery:
        try:
            self._preflight()
            return self._start_query()
        except BaseException as exc:
            self._close_resources(failure=exc)
            raise

    def _start_query(self) -> StreamingQuery:
        spec = self.spec
        stream = union_sources(self.spark, spec)
        self.plan: BatchPlan = analyse(self.spark, spec, stream)
        self.engine = Engine.for_window(spec.pipeline_name, spec.window, spec.source_names, self.plan.integral)
        self._restore()
        self.schema = output_schema(self.plan)
        key = [spec.window.window_start_column, *spec.window.group_by]
        self.target = make_window_writer(spec.target, spec.pipeline_name, self.schema, key)
        self.target.open()
        self.dead_letter = make_dead_letter_writer(spec.dead_letter, spec.pipeline_name) if spec.dead_letter else None
        if self.dead_letter:
            self.dead_letter.open()
        writer = (stream.writeStream.queryName(spec.pipeline_name.replace("-", "_"))
                  .option("checkpointLocation", spec.run.checkpoint_location)
                  .foreachBatch(self._on_batch))
        if spec.run.trigger == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{spec.run.trigger_interval_ms} milliseconds")
        self.query = writer.start()
        return self.query

    def _restore(self) -> None:
        record = self.recovered.record
        if record is None:
            return
        where = self.store.description if self.store else None
        windows = decode_groups(self.spec.pipeline_name, self.recovered.groups, where)
        groups = [(start, key, accs) for start, by_key in windows.items() for key, accs in by_key.items()]
        self.engine.restore(record.last_batch_id, record.watermark,
                            {n: (p.max_event_ts, p.last_arrival) for n, p in record.sources.items()},
                            record.counters, record.emitted, groups, store=where)
        self.query_id = record.query_id
        self.recovered = RecoveredState(record=record)  # drop the blobs

    # -- one micro-batch -----------------------------------------------------------------------

    def _on_batch(self, df: DataFrame, batch_id: int) -> None:
        with self._lock:
            if self._stopping:
                raise _BatchAbandoned(f"stop requested before batch {batch_id}")
            try:
                report = self._process(df, batch_id)
            except BaseException as exc:
                self._error = exc
                raise
        if report is not None:
            self._events.put(report)

    def _process(self, df: DataFrame, batch_id: int) -> BatchReport | None:
        started = time.perf_counter()
        spec, engine = self.spec, self.engine
        if engine.last_batch_id is not None and batch_id <= engine.last_batch_id:
            if self.store is None or not self.store.durable:
                raise StateNotDurableError(f"pipeline {spec.pipeline_name}: Spark replayed batch {batch_id} "
                                           "but in-memory state already holds it")
            # The store committed this batch but Spark did not record it: already counted, skip.
            self.progress(f"[{spec.pipeline_name}] batch {batch_id} is already in the state store: replay skipped")
            return None
        if self.query_id is None:
            self.query_id = checkpoint.query_id(spec.run.checkpoint_location)
        offsets = checkpoint.read_offsets(spec.run.checkpoint_location, batch_id)
        batch_time = offsets.batch_timestamp_ms * 1_000
        self._last_batch_time = batch_time
        frames = build_batch(df.sparkSession, self.plan, df, batch_id, batch_time,
                             engine.closed_before(), engine.emitted_before())
        partials = frames.partials.toArrow()
        src = frames.source_stats.values()
        late = frames.late_stats.values()
        stats = {s.name: SourceStats(rows=src[f"rows_{i}"], max_event_ts=src[f"max_{i}"], invalid=src[f"invalid_{i}"],
                                     future=src[f"future_{i}"], malformed=src[f"malformed_{i}"])
                 for i, s in enumerate(spec.sources)}
        in_transaction: list[Callable[[object], None]] = []
        dead = self._write_dead_letters(batch_id, frames, stats, late["late_rows"], in_transaction)
        starts, keys, values = partial_lists(self.plan, partials)
        batch = BatchInput(batch_id=batch_id, batch_time=batch_time, sources=stats, starts=starts, keys=keys,
                           partials=values, late_rows=late["late_rows"], late_assignments=late["late_assignments"],
                           reopened_rows=late["reopened_rows"], dead_letters=dead)
        result = engine.process(batch)
        self._write(batch_id, result, in_transaction)
        faults.point("target_write", batch_id)
        self._commit(batch_id, batch_id, named_offsets(spec, offsets.offsets), in_transaction)
        faults.point("after_store_commit", batch_id)
        seconds = time.perf_counter() - started
        self.metrics.record(spec.pipeline_name, spec.window.kind, spec.window.late_data, batch, result, seconds)
        return self._report(batch, result, seconds)

    def _write_dead_letters(self, batch_id: int, frames: BatchFrames, stats: dict[str, SourceStats], late_rows: int,
                            in_transaction: list[Callable[[object], None]]) -> dict[str, int]:
        if self.dead_letter is None:
            return {}
        tables: list[pa.Table] = []
        if any(s.invalid or s.future or s.malformed for s in stats.values()):
            tables.append(frames.bad_rows.toArrow())
        if late_rows and self.spec.window.late_data == "dlq":
            tables.append(frames.late_rows.toArrow())
        if not tables:
            return {}
        rows = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
        if self._dead_letters_in_store:
            in_transaction.append(lambda conn: self.dead_letter.write_in_transaction(conn, batch_id, rows))
        else:
            self.dead_letter.write(batch_id, rows)
        reasons = rows.column("_reason").to_pylist()
        return {r: reasons.count(r) for r in sorted(set(reasons))}

    def _write(self, batch_id: int, result: BatchResult, in_transaction: list[Callable[[object], None]],
               part: str = "part-0") -> None:
        table = rows_to_arrow(self.schema, result.rows, len(self.spec.window.group_by))
        if self.spec.target.same_transaction:
            in_transaction.append(lambda conn: self.target.write_in_transaction(conn, batch_id, table))
        else:
            self.target.write(batch_id, table, part)

    @property
    def _dead_letters_in_store(self) -> bool:
        """Postgres dead letters in the Postgres store's database commit with the state."""
        dl, store = self.spec.dead_letter, self.spec.state_store
        return dl is not None and dl.kind == "postgres" and store.kind == "postgres" and dl.url == store.url

    def _commit(self, batch_id: int, label: int | str, offsets: dict[str, str],
                in_transaction: list[Callable[[object], None]]) -> None:
        """One store transaction: changed groups, evicted windows, offsets, watermarks, counters.

        ``label`` names the batch for fault points: its id, or ``flush`` for the end-of-input flush.
        """
        store, engine, spec = self.store, self.engine, self.spec
        upserts, evicted = engine.state.take_changes()
        if store is None or not store.durable:
            return
        marks = engine.watermarks
        record = PipelineRecord(
            pipeline=spec.pipeline_name, state_version=STATE_VERSION, query_id=self.query_id,
            last_batch_id=engine.last_batch_id, fingerprint=self.fingerprint, fingerprint_doc=self.fingerprint_doc,
            watermark=marks.global_wm,
            sources={n: SourceProgress(c.max_event_ts, c.last_arrival) for n, c in marks.clocks.items()},
            counters=dict(engine.counters), emitted=sorted(engine.state.emitted), offsets=offsets,
        )
        store.commit(BatchCommit(
            record=record,
            upserts=[(start, encode_key(key), encode_state(accs)) for start, key, accs in upserts],
            deleted_windows=evicted,
            in_transaction=[*in_transaction, lambda _conn: faults.point("store_commit", label)],
        ))
        self.recovered = RecoveredState(record=record)

    def _report(self, batch: BatchInput, result: BatchResult, seconds: float) -> BatchReport:
        return BatchReport(
            batch_id=batch.batch_id, batch_time=batch.batch_time,
            rows_in=sum(s.rows for s in batch.sources.values()),
            rows_by_source={k: s.rows for k, s in batch.sources.items()},
            windows_emitted=result.finals, corrections=result.corrections, late_rows=batch.late_rows,
            dead_letter_rows=sum(batch.dead_letters.values()), watermark=result.watermark,
            source_watermarks=result.source_watermarks, idle_sources=result.idle_sources,
            state_groups=result.groups, windows_open=result.windows_open, seconds=seconds,
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop at a batch boundary: wait for the batch in flight, refuse new ones, stop the query."""
        with self._lock:
            self._stopping = True
        if self.query is not None:
            self.query.stop()

    def _wait(self) -> None:
        try:
            assert self.query is not None
            while not self._stopping and self.query.isActive:
                self.query.awaitTermination(0.5)
            if not self._stopping:
                self.query.awaitTermination()
        except BaseException as exc:  # reported to the consumer thread
            self._events.put(exc)
            return
        self._events.put(None)

    def events(self) -> Iterator[BatchReport]:
        """Start the query and yield a report per micro-batch until it ends or is stopped.

        Whatever fails leaves as an :class:`EmatixError` with the right ``terminal`` flag.
        """
        try:
            yield from self._run_events()
        except Exception as exc:
            classified = classify(exc, self.spec.pipeline_name)
            if classified is exc:
                raise
            raise classified from exc

    def _run_events(self) -> Iterator[BatchReport]:
        self.start()
        waiter = threading.Thread(target=self._wait, name=f"ematix-wait-{self.spec.pipeline_name}", daemon=True)
        waiter.start()
        failure: BaseException | None = None
        try:
            while True:
                try:
                    item = self._events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if item is None:
                    break
                if isinstance(item, BaseException):
                    if self._stopping and (self._error is None or isinstance(self._error, _BatchAbandoned)):
                        break
                    self._raise(item)
                assert isinstance(item, BatchReport)
                if self.batch_progress is not None:
                    self.batch_progress(item)
                else:
                    self.progress(item.progress_line(self.spec.pipeline_name))
                yield item
            for report in self._finish():
                yield report
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if self.query is not None and self.query.isActive:
                self.request_stop()
            waiter.join(timeout=30)
            self._close_resources(failure)

    def _raise(self, exc: BaseException) -> None:
        if self._error is not None and not isinstance(self._error, _BatchAbandoned):
            raise self._error
        raise SparkQueryFailed(f"pipeline {self.spec.pipeline_name}: the streaming query failed: "
                               f"{first_line(exc)}") from exc

    def _finish(self) -> Iterator[BatchReport]:
        spec, engine = self.spec, self.engine
        if spec.run.trigger != "available_now" or self._stopping:
            return
        if spec.run.end_of_input == "flush" and self._not_emitted():
            # Written beside the last real batch (its own file), so a later run's next batch id is free.
            batch_id = engine.last_batch_id if engine.last_batch_id is not None else 0
            result = engine.flush(batch_id, self._last_batch_time)
            in_transaction: list[Callable[[object], None]] = []
            self._write(batch_id, result, in_transaction, part="flush")
            faults.point("target_write", "flush")
            # The flush reads no input: the offsets stay those of the last committed batch.
            self._commit(batch_id, "flush", self.recovered.record.offsets if self.recovered.record else {},
                         in_transaction)
            faults.point("after_store_commit", "flush")
            self.metrics.record_emit(spec.pipeline_name, spec.window.kind, result)
            report = self._report(BatchInput(batch_id, self._last_batch_time, {}), result, 0.0)
            self.progress(report.progress_line(spec.pipeline_name) + " (end-of-input flush)")
            yield report
        elif self._not_emitted() and self.store is not None and self.store.durable:
            self.progress(f"[{spec.pipeline_name}] input exhausted: {self._not_emitted()} open windows are kept in "
                          f"{self.store.description} for the next run")
        elif self._not_emitted():
            self.progress(f"[{spec.pipeline_name}] warning: input exhausted with {self._not_emitted()} open "
                          f"windows ({engine.state.group_count} groups) not emitted; with in-memory state they are "
                          'lost when this process ends (use end_of_input = "flush" to emit them)')

    def run(self) -> RunSummary:
        """Run to the end (``available_now``) or until :meth:`request_stop` (``processing_time``)."""
        summary = RunSummary(self.spec.pipeline_name)
        for report in self.events():
            summary.batches += 1
            summary.rows_in += report.rows_in
            summary.windows_emitted += report.windows_emitted
            summary.late_rows += report.late_rows
            summary.last_batch_id = report.batch_id
            summary.reports.append(report)
        summary.windows_left_open = self._not_emitted()
        return summary

    def _not_emitted(self) -> int:
        """Windows still open (never emitted); retained windows under reopen were emitted already."""
        state = self.engine.state
        return sum(1 for start in state.windows if start not in state.emitted)


def run_pipeline(spec: PipelineSpec, spark: SparkSession | None = None) -> RunSummary:
    """Run a pipeline spec to completion in this process."""
    return PipelineRunner(spec, spark=spark).run()
