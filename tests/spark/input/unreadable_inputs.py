"""Input files for the unreadable-file tests of tests/spark: rows, good and bad parquet / CSV / JSON
files, the pipeline over them, and what it emitted and dead-lettered.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import tomli_w
from prometheus_client import CollectorRegistry

from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.runner import PipelineRunner, RunSummary
from ematix_dagster.spec import load_pipeline_str

PIPELINE = "unreadable"
DDL = "id BIGINT, k STRING, v BIGINT, page STRING, ts TIMESTAMP, created TIMESTAMP_NTZ"
T0 = pd.Timestamp("2024-01-01 00:00:00")
WINDOW = {"kind": "tumbling", "duration_ms": 60_000, "group_by": ["k"], "max_groups_per_window": 1000,
          "aggregations": [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "v_sum"},
                           {"agg": "min", "column": "ts", "as": "first_ts"},
                           {"agg": "max", "column": "ts", "as": "last_ts"},
                           {"agg": "max", "column": "created", "as": "last_created"}]}
ARROW_US = pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.int64()), ("page", pa.string()),
                      ("ts", pa.timestamp("us", tz="UTC")), ("created", pa.timestamp("us"))])


# -- input ------------------------------------------------------------------------------------------


def rows(first: int, count: int, *, start: pd.Timestamp = T0) -> pd.DataFrame:
    """Rows with nanosecond timestamps (every one has a sub-microsecond part), 7 s apart."""
    ids = range(first, first + count)
    ts = [start + pd.Timedelta(seconds=7 * (i - first), nanoseconds=123_456_789 + i) for i in ids]
    return pd.DataFrame({"id": list(ids), "k": ["ab"[i % 2] for i in ids], "v": [i * 3 for i in ids],
                         "page": "p", "ts": pd.to_datetime(ts), "created": pd.to_datetime(ts) + pd.Timedelta(hours=1)})


class Input:
    """One file per call in ``directory``, in order of modification time (Spark's order), and what
    each readable file holds, for the expected result."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.count = 0
        self.readable: list[pd.DataFrame] = []  # rows of the files the engine must read
        directory.mkdir(parents=True, exist_ok=True)

    def _place(self, write, suffix: str = "parquet") -> Path:
        final = self.directory / f"part-{self.count:05d}.{suffix}"
        tmp = self.directory / f".{final.name}.tmp"
        write(tmp)
        os.replace(tmp, final)
        os.utime(final, (1_700_000_000 + self.count,) * 2)
        self.count += 1
        return final

    def pandas(self, df: pd.DataFrame, *, utc: bool = False) -> Path:
        """``DataFrame.to_parquet`` with pandas' defaults: TIMESTAMP(NANOS) columns."""
        out = df.assign(ts=df.ts.dt.tz_localize("UTC")) if utc else df
        self.readable.append(df)
        return self._place(lambda p: out.to_parquet(p))

    def micros(self, df: pd.DataFrame) -> Path:
        """The same rows written with microsecond columns (the engine's own precision)."""
        floored = df.assign(ts=df.ts.dt.floor("us").dt.tz_localize("UTC"), created=df.created.dt.floor("us"))
        self.readable.append(df)
        return self._place(lambda p: pq.write_table(pa.Table.from_pandas(floored, ARROW_US, preserve_index=False), p))

    def truncated(self, df: pd.DataFrame) -> Path:
        """A parquet file cut in half (its footer gone), as a crashed writer leaves it."""
        def write(p: Path) -> None:
            df.to_parquet(p)
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        return self._place(write)

    def drifted(self, count: int) -> Path:
        """A parquet file whose ``v`` is STRING where the schema says BIGINT."""
        df = rows(9_000, count).assign(v=lambda d: d.v.astype(str))
        return self._place(lambda p: df.to_parquet(p))

    def corrupt_pages(self, count: int) -> Path:
        """A parquet file whose footer reads but whose ``v`` pages do not: only Spark finds out."""
        def write(p: Path) -> None:
            df = rows(20_000, count)
            df.to_parquet(p)
            raw = bytearray(p.read_bytes())
            offset = pq.ParquetFile(p).metadata.row_group(0).column(2).data_page_offset
            raw[offset + 8: offset + 200] = b"\xab" * 192
            p.write_bytes(bytes(raw))
        return self._place(write)

    def expected(self) -> dict[tuple, tuple]:
        return expected_windows(pd.concat(self.readable, ignore_index=True))


def expected_windows(df: pd.DataFrame) -> dict[tuple, tuple]:
    """What the pipeline must emit, computed by pandas: timestamps truncated to microseconds."""
    df = df.dropna(subset=["ts"]).assign(ts=lambda d: d.ts.dt.floor("us"), created=lambda d: d.created.dt.floor("us"))
    df = df.assign(window_start=df.ts.dt.floor("60s"))
    out = {}
    for (start, k), g in df.groupby(["window_start", "k"]):
        out[(start, k)] = (len(g), int(g.v.sum()), g.ts.min(), g.ts.max(), g.created.max())
    return out


# -- the pipeline -----------------------------------------------------------------------------------


def source(path: Path, on_unreadable_file: str | None = None, max_files_per_trigger: int | None = None,
           fmt: str = "parquet", schema: str = DDL) -> dict[str, Any]:
    out: dict[str, Any] = {"name": "s", "kind": "files", "format": fmt, "path": str(path), "schema": schema,
                           "event_time_column": "ts"}
    if on_unreadable_file is not None:
        out["on_unreadable_file"] = on_unreadable_file
    if max_files_per_trigger is not None:
        out["max_files_per_trigger"] = max_files_per_trigger
    return out


def make_spec(tmp: Path, src: dict[str, Any], *, window: dict[str, Any] = WINDOW, dead_letter: dict | None = None,
              store: dict | None = None):
    doc: dict[str, Any] = {
        "pipeline_name": PIPELINE, "sources": [src], "transform": {"window": window},
        "target": {"kind": "parquet", "path": str(tmp / "out")},
        "state_store": store or {"kind": "in_memory"},
        "run": {"checkpoint_location": str(tmp / "cp"), "end_of_input": "flush"},
    }
    if dead_letter is not False:
        doc["dead_letter"] = dead_letter or {"kind": "parquet", "path": str(tmp / "dlq")}
    return load_pipeline_str(tomli_w.dumps(doc))


def run(spec, spark, registry: CollectorRegistry | None = None, lines: list[str] | None = None) -> RunSummary:
    metrics = StreamingMetrics(registry or CollectorRegistry())
    progress = lines.append if lines is not None else (lambda _line: None)
    return PipelineRunner(spec, spark=spark, metrics=metrics, progress=progress).run()


def parquet_rows(path: Path) -> list[dict[str, Any]]:
    return [r for f in sorted(path.glob("batch_id=*/*.parquet")) for r in pq.read_table(f).to_pylist()]


def ts(value: Any) -> pd.Timestamp:
    """An emitted timestamp as a naive UTC pandas timestamp."""
    t = pd.Timestamp(value)
    return t.tz_convert("UTC").tz_localize(None) if t.tzinfo else t


def emitted(tmp: Path) -> dict[tuple, tuple]:
    out = {}
    for r in parquet_rows(tmp / "out"):
        key = (ts(r["window_start"]), r["k"])
        assert key not in out, "every window is emitted once"
        out[key] = (r["n"], r["v_sum"], ts(r["first_ts"]), ts(r["last_ts"]), ts(r["last_created"]))
    return out


def dead_letters(tmp: Path) -> list[dict[str, Any]]:
    return parquet_rows(tmp / "dlq")
