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

import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from ematix_dagster.errors import EmatixError, PipelineConfigError, StateNotDurableError
from ematix_dagster.metrics import StreamingMetrics, default_metrics, serve
from ematix_dagster.spark import checkpoint
from ematix_dagster.spark.convert import output_schema, partial_lists, rows_to_arrow
from ematix_dagster.spark.partials import BatchPlan, analyse, build_batch
from ematix_dagster.spark.session import get_spark
from ematix_dagster.spark.sources import union_sources
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.micro_batch import BatchInput, BatchResult, Engine, SourceStats
from ematix_dagster.streaming.windows import format_us
from ematix_dagster.targets import make_dead_letter_writer, make_window_writer

log = logging.getLogger("ematix_dagster")
GIB = 1 << 30


class SparkQueryFailed(EmatixError):
    """The streaming query died for a reason outside the engine (a Spark job failure)."""

    terminal = False


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

    >>> # runner = PipelineRunner(load_pipeline("pipelines/clicks.toml")); runner.run()
    """

    def __init__(self, spec: PipelineSpec, spark: SparkSession | None = None,
                 metrics: StreamingMetrics | None = None, progress: Callable[[str], None] | None = None) -> None:
        if spec.state_store.durable:
            raise PipelineConfigError("state_store.kind", f"{spec.state_store.kind!r} stores are not available in this "
                                      "version: window state lives in memory", 'remove [state_store] or use kind = "in_memory"')
        self.spec = spec
        self.spark = spark or get_spark(f"ematix-{spec.pipeline_name}")
        self.metrics = metrics or default_metrics()
        self.progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
        self.query: StreamingQuery | None = None
        self._events: queue.Queue[object] = queue.Queue()
        self._lock = threading.Lock()
        self._stopping = False
        self._error: BaseException | None = None
        self._last_batch_time = 0

    # -- start -------------------------------------------------------------------------------

    def _preflight(self) -> None:
        spec = self.spec
        cp = spec.run.checkpoint_location
        if checkpoint.has_progress(cp):
            raise StateNotDurableError(
                f"pipeline {spec.pipeline_name}: checkpoint {cp} already holds progress, but window state is kept in "
                "memory only, so a restart would silently lose the open windows. Delete the checkpoint directory "
                "to reprocess the input from the start (fix), or configure a durable [state_store] when available."
            )
        bound = spec.state_upper_bound_bytes()
        if bound > GIB:
            self.progress(f"[{spec.pipeline_name}] warning: window state may grow to {bound / GIB:.1f} GiB "
                          "(active windows x max_groups_per_window x per-group state); lower max_groups_per_window "
                          "or hll_precision if that is more than this machine has")
        if spec.target.kind == "console":
            self.progress(f"[{spec.pipeline_name}] warning: the console target is not idempotent: output is "
                          "at-least-once and a restart may print windows again")
        self.progress(f"[{spec.pipeline_name}] state is in memory: a restart loses open windows "
                      "(run refuses to resume from an existing checkpoint)")

    def start(self) -> StreamingQuery:
        spec = self.spec
        self._preflight()
        stream = union_sources(self.spark, spec)
        self.plan: BatchPlan = analyse(self.spark, spec, stream)
        self.engine = Engine.for_window(spec.pipeline_name, spec.window, spec.source_names, self.plan.integral)
        self.schema = output_schema(self.plan)
        key = [spec.window.window_start_column, *spec.window.group_by]
        self.target = make_window_writer(spec.target, spec.pipeline_name, self.schema, key)
        self.target.open()
        self.dead_letter = make_dead_letter_writer(spec.dead_letter, spec.pipeline_name) if spec.dead_letter else None
        if self.dead_letter:
            self.dead_letter.open()
        if spec.metrics_port:
            serve(spec.metrics_port)
        writer = (stream.writeStream.queryName(spec.pipeline_name.replace("-", "_"))
                  .option("checkpointLocation", spec.run.checkpoint_location)
                  .foreachBatch(self._on_batch))
        if spec.run.trigger == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{spec.run.trigger_interval_ms} milliseconds")
        self.query = writer.start()
        return self.query

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
        self._events.put(report)

    def _process(self, df: DataFrame, batch_id: int) -> BatchReport:
        started = time.perf_counter()
        spec, engine = self.spec, self.engine
        if engine.last_batch_id is not None and batch_id <= engine.last_batch_id:
            raise StateNotDurableError(f"pipeline {spec.pipeline_name}: Spark replayed batch {batch_id} "
                                       "but in-memory state already holds it")
        batch_time = checkpoint.read_offsets(spec.run.checkpoint_location, batch_id).batch_timestamp_ms * 1_000
        self._last_batch_time = batch_time
        frames = build_batch(df.sparkSession, self.plan, df, batch_id, batch_time,
                             engine.closed_before(), engine.emitted_before())
        partials = frames.partials.toArrow()
        src = frames.source_stats.values()
        late = frames.late_stats.values()
        stats = {s.name: SourceStats(rows=src[f"rows_{i}"], max_event_ts=src[f"max_{i}"], invalid=src[f"invalid_{i}"],
                                     future=src[f"future_{i}"], malformed=src[f"malformed_{i}"])
                 for i, s in enumerate(spec.sources)}
        dead = self._write_dead_letters(batch_id, frames, stats, late["late_rows"])
        starts, keys, values = partial_lists(self.plan, partials)
        batch = BatchInput(batch_id=batch_id, batch_time=batch_time, sources=stats, starts=starts, keys=keys,
                           partials=values, late_rows=late["late_rows"], late_assignments=late["late_assignments"],
                           reopened_rows=late["reopened_rows"], dead_letters=dead)
        result = engine.process(batch)
        self._write(batch_id, result)
        seconds = time.perf_counter() - started
        self.metrics.record(spec.pipeline_name, spec.window.kind, spec.window.late_data, batch, result, seconds)
        return self._report(batch, result, seconds)

    def _write_dead_letters(self, batch_id: int, frames, stats: dict[str, SourceStats], late_rows: int) -> dict[str, int]:
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
        self.dead_letter.write(batch_id, rows)
        reasons = rows.column("_reason").to_pylist()
        return {r: reasons.count(r) for r in sorted(set(reasons))}

    def _write(self, batch_id: int, result: BatchResult) -> None:
        table = rows_to_arrow(self.schema, result.rows, len(self.spec.window.group_by))
        self.target.write(batch_id, table)

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
        """Start the query and yield a report per micro-batch until it ends or is stopped."""
        self.start()
        waiter = threading.Thread(target=self._wait, name=f"ematix-wait-{self.spec.pipeline_name}", daemon=True)
        waiter.start()
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
                self.progress(item.progress_line(self.spec.pipeline_name))
                yield item
            for report in self._finish():
                yield report
        finally:
            if self.query is not None and self.query.isActive:
                self.request_stop()
            waiter.join(timeout=30)
            self.target.close()
            if self.dead_letter:
                self.dead_letter.close()

    def _raise(self, exc: BaseException) -> None:
        if self._error is not None and not isinstance(self._error, _BatchAbandoned):
            raise self._error
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SparkQueryFailed(f"pipeline {self.spec.pipeline_name}: the streaming query failed: {text}") from exc

    def _finish(self) -> Iterator[BatchReport]:
        spec, engine = self.spec, self.engine
        if spec.run.trigger != "available_now" or self._stopping:
            return
        if spec.run.end_of_input == "flush" and engine.state.windows:
            batch_id = (engine.last_batch_id or -1) + 1
            result = engine.flush(batch_id, self._last_batch_time)
            self._write(batch_id, result)
            self.metrics.record_emit(spec.pipeline_name, spec.window.kind, result)
            report = self._report(BatchInput(batch_id, self._last_batch_time, {}), result, 0.0)
            self.progress(report.progress_line(spec.pipeline_name) + " (end-of-input flush)")
            yield report
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
