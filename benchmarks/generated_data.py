"""The benchmarks' generated data and a pipeline over it.

``--events`` rows over ``--keys`` keys in ``--files`` parquet files, columns :data:`SCHEMA_DDL`:
event time increases file by file (each file covers the next 60 s, offset by 30 s, so every file
touches two 1-minute windows), with up to ``--disorder-ms`` of disorder inside the lateness.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_DDL = "key BIGINT, amount DOUBLE, item STRING, ts TIMESTAMP"
BASE_US = 1_704_067_230_000_000  # 2024-01-01T00:00:30Z: each 60 s file spans two 1-minute windows
FILE_SPAN_US = 60_000_000
WINDOW_US = 60_000_000
LATENESS_MS = 5_000
HLL_PRECISION = 14


def generate(directory: Path, events: int, keys: int, files: int, items: int, disorder_ms: int, seed: int,
             tick_us: int = 1) -> None:
    """``files`` parquet files, event times increasing file by file, mild disorder inside.

    ``tick_us`` > 1 rounds event times down to its multiples, so rows share event times.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pool = pa.array([f"item-{i}" for i in range(items)], pa.string())
    per_file = [events // files + (1 if i < events % files else 0) for i in range(files)]
    for i, n in enumerate(per_file):
        start = BASE_US + i * FILE_SPAN_US
        ts = np.sort(rng.integers(start, start + FILE_SPAN_US, n, dtype=np.int64))
        ts -= rng.integers(0, disorder_ms * 1_000 + 1, n, dtype=np.int64)  # out of order, within lateness
        ts -= ts % tick_us
        table = pa.table({
            "key": pa.array(rng.integers(0, keys, n, dtype=np.int64)),
            "amount": pa.array(np.round(rng.random(n) * 100.0, 2)),
            "item": pool.take(pa.array(rng.integers(0, items, n, dtype=np.int64))),
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        })
        write_part(directory, i, table)


def write_part(directory: Path, i: int, table: pa.Table) -> None:
    """``table`` as the ``i``-th parquet file of ``directory``, written whole before Spark may list
    it, its modification time ordered by ``i`` (a file source takes files oldest first)."""
    name = f"part-{i:05d}.parquet"
    tmp, final = directory / f".{name}.tmp", directory / name  # Spark ignores dot files
    pq.write_table(table, tmp)
    os.replace(tmp, final)
    mtime = 1_700_000_000 + i
    os.utime(final, (mtime, mtime))


def source_toml(data: Path, source_format: str = "parquet") -> str:
    """The ``[[sources]]`` table every benchmark pipeline reads the generated files with, one per batch
    (``csv``: :func:`write_csv`'s files, no header)."""
    header = "header = false\n" if source_format == "csv" else ""
    return f"""
[[sources]]
name = "events"
kind = "files"
format = "{source_format}"
{header}path = "{data}"
schema = "{SCHEMA_DDL}"
event_time_column = "ts"
max_files_per_trigger = 1
"""


def state_store_toml(work: Path, postgres_url: str | None = None, schema: str | None = None) -> str:
    """``[state_store]``: SQLite in ``work`` (the default), or PostgreSQL at ``postgres_url`` in ``schema``."""
    if postgres_url is None:
        return f'[state_store]\nkind = "sqlite"\npath = "{work / "state.db"}"\n'
    return (f'[state_store]\nkind = "postgres"\nurl = "{postgres_url}"\n'
            + (f'schema = "{schema}"\n' if schema else ""))


def pipeline_toml(name: str, data: Path, work: Path, shape: str, max_groups: int, extra_aggregations: str,
                  run: str, target: str = "", source_format: str = "parquet") -> str:
    """A benchmark pipeline over the generated files (in ``source_format``): count + sum(amount) per
    key (plus ``extra_aggregations``, TOML tables) in the window ``shape``, SQLite state, parquet
    target (plus ``target``, TOML keys of ``[target]``)."""
    return f"""
pipeline_name = "{name}"
{source_toml(data, source_format)}
[transform.window]
{shape}
lateness_ms = {LATENESS_MS}
source_idleness_ms = 3_600_000
group_by = ["key"]
late_data = "drop"
max_groups_per_window = {max_groups}
hll_precision = {HLL_PRECISION}

[[transform.window.aggregations]]
agg = "count"
as = "n"

[[transform.window.aggregations]]
agg = "sum"
column = "amount"
as = "total"
{extra_aggregations}
[target]
kind = "parquet"
path = "{work / 'target'}"
{target}

{state_store_toml(work)}
[run]
{run}
checkpoint_location = "{work / 'checkpoint'}"
"""


def row_pipeline_toml(name: str, data: Path, work: Path, sql: str, run: str, state_store: str,
                      max_buffered_rows: int | None = None) -> str:
    """A row pipeline (no ``[transform.window]``) over the generated files: ``sql`` over the view
    ``source``, the windowed pipelines' lateness and idleness, a parquet target, ``state_store``
    (:func:`state_store_toml`) and ``max_buffered_rows`` (mandatory with ``WATERMARK_TS()``)."""
    bound = f"max_buffered_rows = {max_buffered_rows}\n" if max_buffered_rows is not None else ""
    return f"""
pipeline_name = "{name}"
{source_toml(data)}
[transform]
sql = '''{sql}'''
lateness_ms = {LATENESS_MS}
source_idleness_ms = 3_600_000
{bound}
[target]
kind = "parquet"
path = "{work / 'target'}"

{state_store}
[run]
{run}
checkpoint_location = "{work / 'checkpoint'}"
"""


def write_csv(parquet_dir: Path, csv_dir: Path) -> None:
    """The generated parquet files again as CSV files without a header, one per parquet file in the
    same order (names and modification times), event times as ``yyyy-MM-dd HH:mm:ss.SSS`` (UTC):
    the text every engine of ``peers.py`` parses the same way (Flink's CSV format reads SQL
    timestamps; Pathway has no parquet reader)."""
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    csv_dir.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(sorted(parquet_dir.glob("part-*.parquet"))):
        table = pq.read_table(path)
        ts = pc.strftime(table["ts"].cast(pa.timestamp("ms", tz="UTC")), format="%Y-%m-%d %H:%M:%S")
        table = table.set_column(table.schema.get_field_index("ts"), "ts", ts)
        final = csv_dir / path.name.replace(".parquet", ".csv")
        tmp = csv_dir / f".{final.name}.tmp"
        pacsv.write_csv(table, tmp, pacsv.WriteOptions(include_header=False, quoting_style="none"))
        os.replace(tmp, final)
        mtime = 1_700_000_000 + i
        os.utime(final, (mtime, mtime))
