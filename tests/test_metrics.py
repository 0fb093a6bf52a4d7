"""Metric families and labels as docs/contract/operations.md, and the endpoint bound to 127.0.0.1."""

from __future__ import annotations

import socket
import urllib.request

from prometheus_client import CollectorRegistry

from ematix_dagster.metrics import StreamingMetrics, default_metrics, serve
from ematix_dagster.streaming.emitted import Emitted, EmittedRow
from ematix_dagster.streaming.micro_batch import BatchInput, BatchResult, SourceStats


def _record(metrics: StreamingMetrics) -> None:
    batch = BatchInput(batch_id=3, batch_time=10_000_000,
                       sources={"a": SourceStats(rows=5, max_event_ts=9_000_000, invalid=1, future=2, malformed=1),
                                "b": SourceStats(rows=0)},
                       late_rows=4, late_assignments=2, reopened_rows=1, dead_letters={"late": 4, "future": 2})
    emitted = Emitted()
    emitted.add_rows([EmittedRow(0, 60, ("x",), (1,), "final"), EmittedRow(0, 60, ("y",), (2,), "final"),
                      EmittedRow(-60, 0, ("x",), (3,), "correction")])
    result = BatchResult(batch_id=3, emitted=emitted, watermark_before=None, watermark=8_000_000,
                         source_watermarks={"a": 8_000_000, "b": None}, idle_sources=["b"], windows_open=2, groups=7)
    metrics.record("p1", "hopping", "reopen", batch, result, 0.25)


def test_families_and_labels():
    registry = CollectorRegistry()
    metrics = StreamingMetrics(registry)
    _record(metrics)
    v = registry.get_sample_value
    assert v("ematix_streaming_windows_emitted_total", {"pipeline": "p1", "kind": "hopping"}) == 2
    assert v("ematix_streaming_window_corrections_total", {"pipeline": "p1"}) == 1
    assert v("ematix_streaming_windows_active", {"pipeline": "p1"}) == 2
    assert v("ematix_streaming_state_groups_total", {"pipeline": "p1"}) == 7
    assert v("ematix_streaming_late_rows_dropped_total", {"pipeline": "p1", "policy": "reopen"}) == 4
    assert v("ematix_streaming_watermark_seconds", {"pipeline": "p1", "source": "a"}) == 8.0
    assert v("ematix_streaming_watermark_seconds", {"pipeline": "p1", "source": "_global"}) == 8.0
    assert v("ematix_streaming_watermark_seconds", {"pipeline": "p1", "source": "b"}) is None
    assert v("ematix_streaming_rows_consumed_total", {"pipeline": "p1", "source": "a"}) == 5
    assert v("ematix_streaming_invalid_event_time_rows_total", {"pipeline": "p1", "source": "a"}) == 1
    assert v("ematix_streaming_future_rows_total", {"pipeline": "p1", "source": "a"}) == 2
    assert v("ematix_streaming_malformed_rows_total", {"pipeline": "p1", "source": "a"}) == 1
    assert v("ematix_streaming_dead_letter_rows_total", {"pipeline": "p1", "reason": "late"}) == 4
    assert v("ematix_streaming_late_rows_reopened_total", {"pipeline": "p1"}) == 1
    assert v("ematix_streaming_late_assignments_dropped_total", {"pipeline": "p1"}) == 2
    assert v("ematix_streaming_batch_duration_seconds_count", {"pipeline": "p1"}) == 1
    rows = {kind: v("ematix_streaming_rows_emitted_total", {"pipeline": "p1", "emit_kind": kind})
            for kind in ("early", "final", "correction", "retract")}
    assert rows == {"early": 0, "final": 2, "correction": 1, "retract": 0}


def test_rows_emitted_counts_every_row_written_by_kind_batches_and_flush():
    """Early rows and retracts are counted like the others, in a batch and in the end-of-input flush
    (``record_emit``), while ``windows_emitted_total`` still counts finals only."""
    registry = CollectorRegistry()
    metrics = StreamingMetrics(registry)
    batch_rows = [EmittedRow(0, 60, ("x",), (1,), "retract"), EmittedRow(0, 60, ("x",), (4,), "early"),
                  EmittedRow(0, 60, ("y",), (2,), "early"), EmittedRow(-60, 0, ("x",), (3,), "final")]
    flush_rows = [EmittedRow(0, 60, ("x",), (4,), "retract"), EmittedRow(0, 60, ("x",), (5,), "final"),
                  EmittedRow(0, 60, ("y",), (2,), "final")]
    for batch_id, rows in ((0, batch_rows), (0, flush_rows)):
        emitted = Emitted()
        emitted.add_rows(rows)
        result = BatchResult(batch_id=batch_id, emitted=emitted, watermark_before=None, watermark=None,
                             source_watermarks={}, idle_sources=[], windows_open=0, groups=0)
        metrics.record_emit("p2", "tumbling", result)
    v = registry.get_sample_value
    rows = {kind: v("ematix_streaming_rows_emitted_total", {"pipeline": "p2", "emit_kind": kind})
            for kind in ("early", "final", "correction", "retract")}
    assert rows == {"early": 2, "final": 3, "correction": 0, "retract": 2}
    assert sum(rows.values()) == len(batch_rows) + len(flush_rows)
    assert v("ematix_streaming_windows_emitted_total", {"pipeline": "p2", "kind": "tumbling"}) == 3


def test_endpoint_on_localhost():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _record(default_metrics())
    serve(port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'ematix_streaming_windows_emitted_total{kind="hopping",pipeline="p1"} 2.0' in body
    # Bound to loopback only: the port is not open on another local address of this host.
    addresses = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
    for address in addresses:
        with socket.socket() as probe:
            probe.settimeout(1)
            assert probe.connect_ex((address, port)) != 0
