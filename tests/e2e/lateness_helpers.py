"""Helpers of the end-to-end lateness tests (tests/e2e/test_lateness.py) and the e2e tests built on them: rows
and times, a ``Feed`` of one file per micro-batch, the pipeline spec, and the comparison of what the engine wrote
(rows, dead letters, watermarks, counters) with ``tests/oracle.py``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import tomli_w
from prometheus_client import CollectorRegistry

from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.input.checkpoint import read_offsets, source_log
from ematix_dagster.spark.runner import PipelineRunner, RunSummary
from ematix_dagster.spec import load_pipeline_str
from tests import oracle

UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
FAR_FUTURE = dt.datetime(2099, 1, 1, tzinfo=UTC)
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.int64()), ("page", pa.string()), ("ts", TS)])
DDL = "id BIGINT, k STRING, v BIGINT, page STRING, ts TIMESTAMP"


def at(minutes: int, seconds: int = 0) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes, seconds=seconds)


def us(value: dt.datetime | None) -> int | None:
    return None if value is None else (value - EPOCH) // dt.timedelta(microseconds=1)


def row(id_: int, k: str | None, v: int | None, ts: dt.datetime | None, page: str | None = "p") -> dict[str, Any]:
    return {"id": id_, "k": k, "v": v, "page": page, "ts": ts}


# -- feeding files and the oracle -----------------------------------------------------------------


class Feed:
    """The files of every source and the oracle's view of each file's rows."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def parquet(self, source: str, files, rows: list[dict[str, Any]]) -> None:
        path = files.write(rows, schema=SCHEMA)
        self.rows[(source, path.name)] = [
            {**{k: v for k, v in r.items() if k != "ts"}, "_source": source, "_event_ts": us(r["ts"])} for r in rows
        ]

    def text(self, source: str, files, text: str, rows: list[dict[str, Any]]) -> None:
        path = files.write(text)
        self.rows[(source, path.name)] = [{**r, "_source": source} for r in rows]

    def batches(self, cp: str, sources: list[str]) -> list[oracle.Batch]:
        """What each micro-batch read (from ``sources/<i>/N``) at the time Spark recorded for it."""
        n = len([p for p in (Path(cp) / "offsets").iterdir() if p.name.isdigit()])
        out = []
        for batch_id in range(n):
            rows: list[dict[str, Any]] = []
            for i, source in enumerate(sources):
                for path in source_log(cp, i, batch_id):
                    rows += self.rows[(source, Path(path.removeprefix("file://")).name)]
            out.append(oracle.Batch(pd.DataFrame(rows, dtype=object), read_offsets(cp, batch_id).batch_timestamp_ms * 1_000))
        read = sum(len(b.rows) for b in out)
        assert read == sum(len(r) for r in self.rows.values()), "every file was read by exactly one batch"
        return out


def files_source(name: str, path: Path, fmt: str = "parquet", schema: str = DDL, column: str = "ts",
                 **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "files", "format": fmt, "path": str(path), "schema": schema,
            "event_time_column": column, "max_files_per_trigger": 1, **extra}


def make_spec(tmp: Path, name: str, sources: list[dict[str, Any]], window: dict[str, Any], sql: str | None = None,
              dead_letter: bool = False, end_of_input: str = "keep"):
    transform: dict[str, Any] = {"window": {"max_groups_per_window": 1000, **window}}
    if sql:
        transform["sql"] = sql
    doc: dict[str, Any] = {
        "pipeline_name": name,
        "sources": sources,
        "transform": transform,
        "target": {"kind": "parquet", "path": str(tmp / f"{name}-out")},
        "run": {"checkpoint_location": str(tmp / f"{name}-cp"), "end_of_input": end_of_input},
        "state_store": {"kind": "in_memory"},  # these tests are about the engine's rules, one run each
    }
    if dead_letter:
        doc["dead_letter"] = {"kind": "parquet", "path": str(tmp / f"{name}-dlq")}
    return load_pipeline_str(tomli_w.dumps(doc))


def run(spec, spark, progress: Callable[[str], None] = lambda _: None) -> tuple[RunSummary, CollectorRegistry]:
    registry = CollectorRegistry()
    summary = PipelineRunner(spec, spark=spark, metrics=StreamingMetrics(registry), progress=progress).run()
    return summary, registry


def oracle_params(spec, **extra: Any) -> oracle.Params:
    w = spec.window
    return oracle.Params(
        sources=spec.source_names, duration_ms=w.duration_ms, hop_ms=w.hop_ms, lateness_ms=w.lateness_ms,
        source_idleness_ms=w.source_idleness_ms, late_data=w.late_data, allowed_lateness_ms=w.allowed_lateness_ms or 0,
        max_future_skew_ms=spec.sources[0].max_future_skew_ms, group_by=w.group_by,
        aggregations=tuple((a.agg, a.column, a.as_) for a in w.aggregations),
        dead_letter=spec.dead_letter is not None, end_of_input=spec.run.end_of_input, **extra)


# -- reading what the engine wrote ----------------------------------------------------------------


def _plain(v: Any) -> Any:
    return us(v) if isinstance(v, dt.datetime) else v


def read_batch_dirs(path: str) -> dict[int, list[dict[str, Any]]]:
    """Each batch directory's rows (timestamps as µs), its ``part-0`` file before the end-of-input
    flush's, the order their ``_emit_seq`` numbers them in (docs/contract/targets-and-guarantees.md)."""
    root = Path(path)
    if not root.exists():
        return {}
    out = {}
    for d in root.glob("batch_id=*"):
        files = sorted(d.glob("*.parquet"), key=lambda f: (f.name != "part-0.parquet", f.name))
        rows = [r for f in files for r in pq.read_table(f).to_pylist()]
        out[int(d.name.split("=", 1)[1])] = [{k: _plain(v) for k, v in r.items()} for r in rows]
    return out


def _sorted(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=repr)


def compare_output(spec, expected: oracle.OracleResult, old_batches: int = 0) -> dict[int, list[dict[str, Any]]]:
    """Every emitted row of every batch, in the engine's parquet dirs and the oracle, must agree.

    The first ``old_batches`` batches were written by a version that numbered only session rows:
    they have no ``_emit_seq``.
    """
    w = spec.window
    cols = ["window_start", "window_end", *w.group_by, *(a.as_ for a in w.aggregations), "_emit_kind"]
    got = read_batch_dirs(spec.target.path)
    for batch_id, rows in got.items():
        if batch_id < old_batches:
            assert list(rows[0]) == cols, "output columns of old batches: bounds, groups, aggregations, kind"
            continue
        assert list(rows[0]) == [*cols, "_emit_seq"], "output columns: bounds, groups, aggregations, kind, seq"
        assert [r["_emit_seq"] for r in rows] == list(range(len(rows))), "a batch (and its flush) numbers its rows"
    got_t = {b: _sorted([tuple(r[c] for c in cols) for r in rows]) for b, rows in got.items()}
    want_t = {b: _sorted([tuple(r[c] for c in cols) for r in rows]) for b, rows in expected.emitted.items() if rows}
    assert got_t == want_t
    return got


def dead_letter_view(rows: list[dict[str, Any]]) -> list[tuple]:
    """Malformed rows are identified by their raw line, others by id and event time."""
    return _sorted([(r["_source"], r["_reason"], r.get("_corrupt_record")) if r["_reason"] == "malformed"
                    else (r["_source"], r["_reason"], r["id"], r["_event_ts"]) for r in rows])


def compare_dead_letters(spec, expected: oracle.OracleResult) -> dict[int, list[dict[str, Any]]]:
    got = read_batch_dirs(spec.dead_letter.path)
    for batch_id, rows in got.items():
        for r in rows:
            assert {"_source", "_event_ts", "_batch_id", "_reason"} <= set(r)
            assert r["_batch_id"] == batch_id
    assert {b: dead_letter_view(rows) for b, rows in got.items()} == \
        {b: dead_letter_view(rows) for b, rows in expected.dead_letters.items() if rows}
    return got


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(f"ematix_streaming_{name}", labels) or 0.0


def compare_counters(spec, summary: RunSummary, registry: CollectorRegistry, expected: oracle.OracleResult) -> None:
    p, c = spec.pipeline_name, expected.counters
    policy, kind = spec.window.late_data, spec.window.kind
    assert summary.late_rows == c["late_rows"]
    assert summary.windows_emitted == c["finals"]
    assert sum(r.counts.corrections for r in summary.reports) == c["corrections"]
    assert summary.windows_left_open == expected.windows_left_open
    assert {r.batch_id: r.watermark for r in summary.reports} == expected.watermarks
    assert metric(registry, "late_rows_dropped_total", pipeline=p, policy=policy) == c["late_rows"]
    assert metric(registry, "late_assignments_dropped_total", pipeline=p) == c["late_assignments"]
    assert metric(registry, "late_rows_reopened_total", pipeline=p) == c["reopened_rows"]
    assert metric(registry, "windows_emitted_total", pipeline=p, kind=kind) == c["finals"]
    assert metric(registry, "window_corrections_total", pipeline=p) == c["corrections"]
    for s in spec.source_names:
        assert metric(registry, "rows_consumed_total", pipeline=p, source=s) == c[f"rows:{s}"]
        assert metric(registry, "invalid_event_time_rows_total", pipeline=p, source=s) == c[f"invalid_event_time:{s}"]
        assert metric(registry, "future_rows_total", pipeline=p, source=s) == c[f"future:{s}"]
        assert metric(registry, "malformed_rows_total", pipeline=p, source=s) == c[f"malformed:{s}"]
    dead = 0
    for reason in ("late", "invalid_event_time", "future", "malformed"):
        assert metric(registry, "dead_letter_rows_total", pipeline=p, reason=reason) == c[f"dead_letter:{reason}"]
        dead += c[f"dead_letter:{reason}"]
    assert sum(r.dead_letter_rows for r in summary.reports) == dead
    final_wm = expected.watermarks[max(expected.watermarks)] if expected.watermarks else None
    got_wm = metric(registry, "watermark_seconds", pipeline=p, source="_global") if final_wm is not None else None
    assert got_wm == (None if final_wm is None else final_wm / 1e6)


def check_run(spec, feed: Feed, summary: RunSummary, registry: CollectorRegistry, **extra: Any) -> oracle.OracleResult:
    expected = oracle.run(feed.batches(spec.run.checkpoint_location, list(spec.source_names)), oracle_params(spec, **extra))
    compare_output(spec, expected)
    if spec.dead_letter is not None:
        compare_dead_letters(spec, expected)
    compare_counters(spec, summary, registry, expected)
    return expected
