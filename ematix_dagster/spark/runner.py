"""Run a pipeline as a Spark Structured Streaming query with a ``foreachBatch`` sink.

This module owns the query's lifetime: preflight (lease, fingerprint, checkpoint checks), start,
the ``foreachBatch`` callback's locking, stop and cleanup. What one micro-batch does is
:class:`~ematix_dagster.spark.batch.batch_step.BatchStep`, with the engine call of the pipeline's shape
(``spark.batch.engine_calls``). Blocking py4j calls (waiting for the query) run on a background thread and batch reports travel
through a queue, so the caller's thread (the CLI, or a Dagster step that may be interrupted)
never sits inside py4j (docs/dagster.md).
"""

from __future__ import annotations

import queue
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from ematix_dagster.errors import (
    CheckpointDiverged,
    ConfigError,
    FingerprintChanged,
    LeaseLost,
    StateNotDurableError,
    first_line,
)
from ematix_dagster.fingerprint import describe_changes, fingerprint, fingerprint_doc
from ematix_dagster.metrics import StreamingMetrics, default_metrics, serve
from ematix_dagster.spark.batch.batch_report import BatchReport
from ematix_dagster.spark.batch.batch_step import BatchStep
from ematix_dagster.spark.batch.engine_calls import engine_call
from ematix_dagster.spark.failures.classify import classify, query_failure
from ematix_dagster.spark.failures.quiet import QuietFailures
from ematix_dagster.spark.input import checkpoint
from ematix_dagster.spark.plans.executor_plan import executor_session
from ematix_dagster.spark.recovery import validate_checkpoint
from ematix_dagster.spark.sources.readers import union_sources
from ematix_dagster.spark.spark_session import get_spark
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.stores import guarantee, make_store
from ematix_dagster.streaming.durable import Provenance
from ematix_dagster.targets import DeadLetterWriter, RowWriter, WindowWriter, make_dead_letter_writer
from state_store.contract import RecoveredState, StateStore, TakeOver, make_holder


class _BatchAbandoned(Exception):
    """Raised in a batch that starts after a stop was requested, so Spark does not commit it."""


@dataclass
class RunSummary:
    pipeline: str
    batches: int = 0
    rows_in: int = 0
    windows_emitted: int = 0
    late_rows: int = 0
    last_batch_id: int | None = None
    #: what the run left for the next one: windows not emitted (a row pipeline: rows held back)
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
                 batch_progress: Callable[[BatchReport], None] | None = None, quiet_failures: bool = True,
                 announce: bool = True, take_over_lease: TakeOver | None = None) -> None:
        # Sources, stores, targets and the checkpoint are opened with ``${NAME}`` expanded; the
        # fingerprint that the state records keeps the placeholders (never a value).
        self.spec = spec.resolved()
        # Spark starts only after the lease is held and the state checked, so a run that cannot
        # proceed is refused in a second instead of after a JVM start.
        self._spark = spark if spark is not None else (lambda: get_spark(f"ematix-{spec.pipeline_name}"))
        self.metrics = metrics or default_metrics()
        self.progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
        # A streaming run states its guarantee and its state's bound at start; a backfill's one-shot run
        # (``announce=False``) has neither a restart to survive nor a state that outlives it.
        self.announce = announce
        # Hook: a caller reporting batches itself (Dagster: no line for heartbeat-only batches) gets each report here.
        self.batch_progress = batch_progress
        self.query: StreamingQuery | None = None
        self._events: queue.Queue[object] = queue.Queue()
        self._lock = threading.Lock()
        self._stopping = False
        self._error: BaseException | None = None
        self.quiet = QuietFailures(spec.pipeline_name, quiet_failures)  # Spark's log of an explained failure
        self.store: StateStore | None = store if store is not None else (
            make_store(self.spec.state_store) if spec.state_store.durable else None)
        self.run_label = run_label
        # Asked, with the holder's text, when another run holds the lease: yes fences that run (a
        # replacement for one whose worker was killed) instead of refusing this one (``acquire_lease``).
        self.take_over_lease = take_over_lease
        self.recovered = RecoveredState(record=None)
        self.fingerprint_doc = fingerprint_doc(spec)  # as written
        self.fingerprint = fingerprint(self.fingerprint_doc)
        self.target: WindowWriter | RowWriter | None = None
        self.step: BatchStep | None = None  # once the query starts
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
        if not self.announce:
            return
        for warning in engine_call(spec).start_warnings(spec):
            self.progress(f"[{name}] warning: {warning}")
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
            store.acquire_lease(name, make_holder(self.run_label), take_over=self.take_over_lease)
            self.recovered = store.load(name)
            record = self.recovered.record
            if record is not None and record.fingerprint and record.fingerprint != self.fingerprint:
                changes = describe_changes(record.fingerprint_doc, self.fingerprint_doc)
                raise FingerprintChanged(engine_call(spec).refused_change(spec, store, changes))
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
            named = exc  # a source Spark cannot open (no Kafka connector): classified, its report in the run's file
            if isinstance(exc, Exception) and not isinstance(exc, ConfigError):
                named = self.quiet.named(classify(exc, self.spec.pipeline_name), exc)
            self.quiet.restore()
            self._close_resources(failure=exc)
            if named is exc:
                raise
            raise named from exc

    def _start_query(self) -> StreamingQuery:
        spec = self.spec
        if spec.run.window_state == "executors":  # the state store's confs, in a session of the query's own
            self._spark = executor_session(self.spark)
        self.quiet.route(self.spark)  # Spark's report of a failure opening a source or on its stream thread
        stream = union_sources(self.spark, spec)
        self.step = self._step(stream)
        writer = (self.step.call.streamed(stream).writeStream.queryName(spec.pipeline_name.replace("-", "_"))
                  .outputMode("append")
                  .option("checkpointLocation", spec.run.checkpoint_location)
                  .foreachBatch(self._on_batch))
        if spec.run.trigger == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{spec.run.trigger_interval_ms} milliseconds")
        self.query = writer.start()
        return self.query

    def _step(self, stream: DataFrame) -> BatchStep:
        """The run's batch step: the shape's engine call continued from the store, its target and
        dead letters open."""
        spec, record = self.spec, self.recovered.record
        call = engine_call(spec).open(self.spark, spec, stream, self.recovered, self.store, self.metrics)
        self.recovered = RecoveredState(record=record)  # drop the blobs
        self.target = target = call.open_target()
        target.open()
        self.dead_letter = make_dead_letter_writer(spec.dead_letter, spec.pipeline_name) if spec.dead_letter else None
        if self.dead_letter:
            self.dead_letter.open()
        provenance = Provenance(record.query_id if record else None, self.fingerprint, self.fingerprint_doc)
        return BatchStep(spec, call, target, self.dead_letter, self.store, self.metrics, self.progress, provenance,
                         record)

    # -- one micro-batch -----------------------------------------------------------------------

    def _on_batch(self, df: DataFrame, batch_id: int) -> None:
        with self._lock:
            if self._stopping:
                raise _BatchAbandoned(f"stop requested before batch {batch_id}")
            assert self.step is not None  # set before the query starts
            try:
                report = self.step.run(df, batch_id)
            except BaseException as exc:
                self._error = exc
                self.quiet.batch_failed(self.spark, exc)
                raise
        if report is not None:
            self._events.put(report)

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
                self.query.awaitTermination(0.5)  # type: ignore[arg-type]  # typed int, takes float seconds
            if not self._stopping:
                self.query.awaitTermination()
        except BaseException as exc:  # reported to the consumer thread
            self._events.put(exc)
            return
        self._events.put(None)

    def events(self) -> Iterator[BatchReport]:
        """Start the query and yield a report per micro-batch until it ends or is stopped; whatever
        fails leaves as an :class:`EmatixError` with the right ``terminal`` flag."""
        try:
            yield from self._run_events()
        except Exception as exc:
            classified = classify(exc, self.spec.pipeline_name)
            if isinstance(classified, LeaseLost):
                self.progress(f"[{self.spec.pipeline_name}] the lease was taken over by {classified.holder}: "
                              f"this run stops without committing batch {classified.batch}")
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
            yield from self._finish()
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if self.query is not None and self.query.isActive:
                self.request_stop()
            waiter.join(timeout=30)
            self.quiet.restore()
            self._close_resources(failure)

    def _raise(self, exc: BaseException) -> None:
        if self._error is not None and not isinstance(self._error, _BatchAbandoned):
            classified = classify(self._error, self.spec.pipeline_name)  # named: a Spark error from a batch too
            if classified is not self._error:
                raise self.quiet.named(classified, exc) from self._error
            raise self.quiet.named(self._error, exc)
        raise self.quiet.named(query_failure(exc, self.spec.pipeline_name), exc) from exc

    def _finish(self) -> Iterator[BatchReport]:
        """The end of an ``available_now`` run: the flush, or what stays open for the next run."""
        spec, step = self.spec, self.step
        if spec.run.trigger != "available_now" or self._stopping or step is None:
            return
        left = step.call.left_open()
        if not left:
            return
        if spec.run.end_of_input == "flush":
            report = step.flush()
            if report is not None:
                self.progress(report.progress_line(spec.pipeline_name) + " (end-of-input flush)")
                yield report
                return
        self.progress(step.call.left_open_line(left, self.store))

    def run(self) -> RunSummary:
        """Run to the end (``available_now``) or until :meth:`request_stop` (``processing_time``)."""
        summary = RunSummary(self.spec.pipeline_name)
        for report in self.events():
            summary.batches += 1
            summary.rows_in += report.rows_in
            summary.windows_emitted += report.count("windows_emitted")
            summary.late_rows += report.count("late_rows")
            summary.last_batch_id = report.batch_id
            summary.reports.append(report)
        summary.windows_left_open = self.step.call.left_open() if self.step is not None else 0
        return summary


def run_pipeline(spec: PipelineSpec, spark: SparkSession | None = None) -> RunSummary:
    """Run a pipeline spec to completion in this process."""
    return PipelineRunner(spec, spark=spark).run()
