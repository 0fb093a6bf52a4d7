"""Prometheus metrics exactly as docs/contract/operations.md: one registry per process, partitioned by label.

Families are created once per process (a second pipeline in the same process reuses them with its
own ``pipeline`` label), so nothing is registered twice. The HTTP endpoint binds to 127.0.0.1.
"""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ematix_dagster.columns import CORRECTION, EARLY, FINAL, RETRACT
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.streaming.micro_batch import BatchInput, BatchResult, SourceStats
from ematix_dagster.streaming.row_release import RowResult

PREFIX = "ematix_streaming"
#: the ``emit_kind`` label values of ``rows_emitted_total``: every marker a written row may carry
EMIT_KINDS = (EARLY, FINAL, CORRECTION, RETRACT)


class StreamingMetrics:
    """All metric families of the engine, bound to one registry."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.windows_active = Gauge(f"{PREFIX}_windows_active", "Windows held in state.", ["pipeline"], registry=registry)
        self.windows_emitted = Counter(f"{PREFIX}_windows_emitted", "Final (window, group) rows emitted.",
                                       ["pipeline", "kind"], registry=registry)
        self.late_rows_dropped = Counter(f"{PREFIX}_late_rows_dropped", "Rows no window took, by late-data policy.",
                                         ["pipeline", "policy"], registry=registry)
        self.state_groups = Gauge(f"{PREFIX}_state_groups_total", "(window, group) entries held in state.",
                                  ["pipeline"], registry=registry)
        self.watermark = Gauge(f"{PREFIX}_watermark_seconds", "Per-source watermark; source=_global is the pipeline's.",
                               ["pipeline", "source"], registry=registry)
        self.rows_consumed = Counter(f"{PREFIX}_rows_consumed", "Rows read per source.", ["pipeline", "source"],
                                     registry=registry)
        self.batch_duration = Histogram(f"{PREFIX}_batch_duration_seconds", "Driver time per micro-batch.",
                                        ["pipeline"], registry=registry)
        self.invalid_event_time = Counter(f"{PREFIX}_invalid_event_time_rows", "Rows with a NULL or unparseable event time.",
                                          ["pipeline", "source"], registry=registry)
        self.future_rows = Counter(f"{PREFIX}_future_rows", "Rows beyond max_future_skew_ms.", ["pipeline", "source"],
                                   registry=registry)
        self.dead_letter_rows = Counter(f"{PREFIX}_dead_letter_rows", "Rows written to the dead-letter target.",
                                        ["pipeline", "reason"], registry=registry)
        self.late_rows_reopened = Counter(f"{PREFIX}_late_rows_reopened", "Late rows that reopened an emitted window.",
                                          ["pipeline"], registry=registry)
        self.window_corrections = Counter(f"{PREFIX}_window_corrections", "Correction rows re-emitted under reopen.",
                                          ["pipeline"], registry=registry)
        self.late_assignments_dropped = Counter(f"{PREFIX}_late_assignments_dropped",
                                                "Closed window assignments of rows that had open ones.", ["pipeline"],
                                                registry=registry)
        self.malformed_rows = Counter(f"{PREFIX}_malformed_rows", "Malformed json/csv rows (kept in the dead letters when configured).",
                                      ["pipeline", "source"], registry=registry)
        self.unreadable_files = Counter(f"{PREFIX}_unreadable_files",
                                        "Input files left out of their batch: unreadable (on_unreadable_file = "
                                        '"skip") or removed after their batch listed them.', ["pipeline", "source"],
                                        registry=registry)
        self.rows_emitted = Counter(f"{PREFIX}_rows_emitted", "Rows written to the target, by _emit_kind (retracts "
                                    "included).", ["pipeline", "emit_kind"], registry=registry)
        self.rows_filtered = Counter(f"{PREFIX}_rows_filtered", "Rows the SQL left out: reason=where (its WHERE), "
                                     "not_released (a row pipeline's rows no WATERMARK_TS() branch releases).",
                                     ["pipeline", "reason"], registry=registry)
        self.released_rows = Counter(f"{PREFIX}_released_rows", "Rows a row pipeline wrote, or a windowed one released under [emit] sql.", ["pipeline"],
                                     registry=registry)
        self.buffered_rows = Gauge(f"{PREFIX}_buffered_rows", "Rows held back by WATERMARK_TS() in the state store (row pipelines, [emit] sql).",
                                   ["pipeline"], registry=registry)
        self.rejected_rows = Counter(f"{PREFIX}_rejected_rows",
                                     "Rows no target or state store can hold, or whose SQL failed (kept in the dead "
                                     "letters when configured).", ["pipeline", "reason"], registry=registry)

    def record(self, pipeline: str, window_kind: str, policy: str, batch: BatchInput, result: BatchResult,
               seconds: float) -> None:
        self.record_input(pipeline, policy, batch, seconds)
        self.record_emit(pipeline, window_kind, result)

    def record_input(self, pipeline: str, policy: str, batch: BatchInput, seconds: float) -> None:
        """What a windowed batch read: its rows by source and class, and its time."""
        for source, stats in batch.sources.items():
            self.rows_consumed.labels(pipeline, source).inc(stats.rows)
            self.invalid_event_time.labels(pipeline, source).inc(stats.invalid)
            self.future_rows.labels(pipeline, source).inc(stats.future)
            self.malformed_rows.labels(pipeline, source).inc(stats.malformed)
        self.late_rows_dropped.labels(pipeline, policy).inc(batch.late_rows)
        self.late_assignments_dropped.labels(pipeline).inc(batch.late_assignments)
        self.late_rows_reopened.labels(pipeline).inc(batch.reopened_rows)
        for reason, n in batch.rejected.items():
            self.rejected_rows.labels(pipeline, reason).inc(n)
        self.rows_filtered.labels(pipeline, "where").inc(batch.filtered)
        for reason, n in batch.dead_letters.items():
            self.dead_letter_rows.labels(pipeline, reason).inc(n)
        self.batch_duration.labels(pipeline).observe(seconds)

    def record_rows(self, pipeline: str, sources: dict[str, SourceStats], result: RowResult,
                    dead_letters: dict[str, int], seconds: float) -> None:
        """A row pipeline's batch (docs/contract/row-pipelines.md)."""
        for source, stats in sources.items():
            self.rows_consumed.labels(pipeline, source).inc(stats.rows)
            self.invalid_event_time.labels(pipeline, source).inc(stats.invalid)
            self.future_rows.labels(pipeline, source).inc(stats.future)
            self.malformed_rows.labels(pipeline, source).inc(stats.malformed)
        for reason, n in dead_letters.items():
            self.dead_letter_rows.labels(pipeline, reason).inc(n)
        self.rows_filtered.labels(pipeline, "where").inc(result.filtered)
        self.record_release(pipeline, result.released.num_rows, result.not_released, result.pending,
                            result.output_watermark)
        if result.watermark is not None:
            self.watermark.labels(pipeline, "_global").set(result.watermark / 1e6)
        self.batch_duration.labels(pipeline).observe(seconds)

    def record_release(self, pipeline: str, released: int, not_released: int, pending: int,
                       output_watermark: int | None) -> None:
        """Rows held back by WATERMARK_TS() (a row pipeline's, or a windowed one's under ``[emit]``)."""
        self.rows_filtered.labels(pipeline, "not_released").inc(not_released)
        self.released_rows.labels(pipeline).inc(released)
        self.buffered_rows.labels(pipeline).set(pending)
        if output_watermark is not None:
            self.watermark.labels(pipeline, "_output").set(output_watermark / 1e6)

    def record_emit(self, pipeline: str, window_kind: str, result: BatchResult) -> None:
        """What a batch (or the end-of-input flush) wrote and where the stream stands after it."""
        self.windows_emitted.labels(pipeline, window_kind).inc(result.finals)
        for emit_kind in EMIT_KINDS:
            self.rows_emitted.labels(pipeline, emit_kind).inc(result.emitted.count(emit_kind))
        self.window_corrections.labels(pipeline).inc(result.corrections)
        self.record_position(pipeline, result.windows_open, result.groups, result.watermark, result.source_watermarks)

    def record_final_windows(self, pipeline: str, window_kind: str, windows: int) -> None:
        """Windows written ``final`` by Spark's stateful aggregation (``window_state = "executors"``)."""
        self.windows_emitted.labels(pipeline, window_kind).inc(windows)
        self.rows_emitted.labels(pipeline, FINAL).inc(windows)

    def record_position(self, pipeline: str, windows_open: int, groups: int, watermark: int | None,
                        source_watermarks: dict[str, int | None]) -> None:
        """Where the stream stands after a batch: its open state and its watermarks (µs)."""
        self.windows_active.labels(pipeline).set(windows_open)
        self.state_groups.labels(pipeline).set(groups)
        for source, wm in source_watermarks.items():
            if wm is not None:
                self.watermark.labels(pipeline, source).set(wm / 1e6)
        if watermark is not None:
            self.watermark.labels(pipeline, "_global").set(watermark / 1e6)


_lock = threading.Lock()
_default: StreamingMetrics | None = None
_servers: dict[int, object] = {}


def default_metrics() -> StreamingMetrics:
    """The process-wide families on prometheus-client's default registry."""
    global _default
    with _lock:
        if _default is None:
            _default = StreamingMetrics()
        return _default


def serve(port: int, host: str = "127.0.0.1", pipeline: str | None = None) -> None:
    """Expose the default registry on ``host:port`` once per process.

    A port another process holds is a configuration problem (terminal), named with the port.
    """
    with _lock:
        if port not in _servers:
            try:
                _servers[port] = start_http_server(port, addr=host)
            except OSError as exc:
                who = f"pipeline {pipeline}: " if pipeline else ""
                raise PipelineConfigError(
                    "metrics_port", f"{who}cannot serve Prometheus metrics on {host}:{port}: {exc.strerror or exc}",
                    "pick a free port, or stop the process that holds it") from None
