"""Helpers of the row-pipeline e2e tests (tests/e2e/test_row_pipelines.py, test_row_crashes.py): the pipeline
TOML, the input batches, the SQL and its oracle twin (``tests/e2e/row_oracle.py``), and what the targets hold.

The delayed SQL's branches (W = the largest event time minus 30 s of lateness):

1. ``k = 'emb'``: released when W reaches the event time + 2 minutes (``<=``);
2. ``k = 'strict'``: released once W is past the event time + 1 minute (mirrored ``<``);
3. ``v >= 100``: released once W is past ``CAST(page AS TIMESTAMP)`` (a NULL page: never by this branch; a
   page that is no time: ``sql_error``);
4. ``k = 'rt'``: a guard-only branch, released in the batch it arrives in.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import tomli_w

from tests.e2e import row_oracle as ro
from tests.e2e.lateness_helpers import FAR_FUTURE, Feed, at, files_source, read_batch_dirs, row, us
from tests.pipeline_toml import parquet_target, sqlite_store

MIN = 60_000_000  # µs per minute
LATENESS_MS = 30_000

DELAYED_SQL = """SELECT id, k, v, page, _event_ts FROM source
WHERE (k = 'emb' AND _event_ts + INTERVAL 2 MINUTES <= WATERMARK_TS())
   OR (k = 'strict' AND WATERMARK_TS() > _event_ts + INTERVAL 1 MINUTE)
   OR (v >= 100 AND CAST(page AS TIMESTAMP) < WATERMARK_TS())
   OR k = 'rt'"""


def eq(a: Any, b: Any) -> bool | None:
    """SQL's ``=``: NULL when either side is NULL."""
    return None if ro.missing(a) or ro.missing(b) else a == b


def ge(a: Any, b: Any) -> bool | None:
    return None if ro.missing(a) or ro.missing(b) else a >= b


def cast_timestamp(value: Any) -> int | None:
    """``CAST(page AS TIMESTAMP)`` for the pages used here (UTC session time zone); anything else fails."""
    if ro.missing(value):
        return None
    try:
        return us(dt.datetime.strptime(value, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc))
    except ValueError:
        raise ro.SqlError(value) from None


def cast_bigint(value: Any) -> int | None:
    if ro.missing(value):
        return None
    if not str(value).lstrip("-").isdigit():
        raise ro.SqlError(value)
    return int(value)


def plain_row(r: ro.Row, columns: tuple[str, ...]) -> ro.Row:
    return {c: None if ro.missing(r.get(c)) else r[c] for c in columns}


DELAYED_QUERY = ro.Query(
    select=lambda r: plain_row(r, ("id", "k", "v", "page", "_event_ts")),
    branches=(
        ro.Branch(lambda r: eq(r["k"], "emb"), lambda r: r["_event_ts"] + 2 * MIN),
        ro.Branch(lambda r: eq(r["k"], "strict"), lambda r: r["_event_ts"] + MIN, strict=True),
        ro.Branch(lambda r: ge(r["v"], 100), lambda r: cast_timestamp(r["page"]), strict=True),
        ro.Branch(lambda r: eq(r["k"], "rt")),
    ))


# (id, k, v, page, event time) per micro-batch of the first run; see test_row_pipelines.py for what each row tests
DELAYED_RUN_1: list[list[tuple]] = [
    [(1, "rt", 1, None, at(9)), (2, "emb", 2, None, at(7)), (3, "emb", 3, None, at(7, 30)),
     (4, "strict", 4, None, at(8, 30)), (5, "emb", 5, "held-5", at(10)), (6, "other", 6, None, at(9)),
     (7, "emb", 150, "2024-01-01 00:11:00", at(9, 50)), (8, "rt", 100, None, at(9, 10)),
     (9, "other", 120, None, at(9, 20)), (10, "rt", 130, "soon", at(9, 30)), (11, "emb", 11, None, None),
     (12, None, 12, None, at(9)), (13, "strict", 13, None, at(10))],
    [(21, "emb", 21, None, at(10)), (20, "emb", 20, None, at(10)), (22, "emb", 22, "dup", at(11)),
     (22, "emb", 22, "dup", at(11)), (23, "strict", 23, None, at(11)), (24, "emb", 24, "held-24", at(12, 30)),
     (25, "rt", 25, None, FAR_FUTURE), (26, "strict", 26, "held-26", at(12)),
     (27, "emb", 180, "2024-01-01 00:30:00", at(12)), (28, "rt", 28, None, at(12, 30)), (29, "emb", 29, None, at(9))],
    [(30, "rt", 30, None, at(13)), (31, "emb", 31, None, at(10, 30))],
    [(32, "rt", 32, None, at(13, 10)), (33, "other", 33, None, at(13))],
]
DELAYED_RUN_2: list[list[tuple]] = [[(40, "emb", 40, "held-40", at(20)), (41, "rt", 41, None, at(19))]]


def write_batches(feed: Feed, files, batches: list[list[tuple]]) -> None:
    for rows in batches:
        feed.parquet("a", files, [row(i, k, v, ts, page=page) for i, k, v, page, ts in rows])


def row_toml(name: str, root: Path, sql: str, *, target: dict[str, Any] | None = None,
             store: dict[str, Any] | None = None, dead_letter: dict[str, Any] | None = None,
             source: dict[str, Any] | None = None, max_buffered_rows: int | None = 100,
             end_of_input: str = "flush") -> Path:
    """A row pipeline over ``root/in`` (one parquet file per micro-batch), written to ``root/NAME.toml``."""
    transform: dict[str, Any] = {"sql": sql, "lateness_ms": LATENESS_MS}
    if max_buffered_rows is not None:
        transform["max_buffered_rows"] = max_buffered_rows
    doc: dict[str, Any] = {
        "pipeline_name": name,
        "sources": [source or files_source("a", root / "in")],
        "transform": transform,
        "target": target or parquet_target(root / "out"),
        "state_store": store or sqlite_store(root / "state.db"),
        "run": {"checkpoint_location": str(root / "cp"), "end_of_input": end_of_input},
    }
    if dead_letter is not None:
        doc["dead_letter"] = dead_letter
    path = root / f"{name}.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def oracle_run(feed: Feed, checkpoint: str, query: ro.Query) -> list[ro.BatchOut]:
    """The oracle fed what each micro-batch read, at the batch time Spark recorded (``offsets/N``)."""
    batches = [(b.time_us, b.rows) for b in feed.batches(checkpoint, ["a"])]
    return ro.run(batches, query, ro.Params(lateness_ms=LATENESS_MS))


def expected_batches(outs: list[ro.BatchOut]) -> dict[int, list[tuple]]:
    """batch id -> the rows it writes, in order (batches that write nothing left out)."""
    return {b: [tuple(r.values()) for r in out.rows] for b, out in enumerate(outs) if out.released}


def parquet_batches(path: str) -> dict[int, list[tuple]]:
    """batch id -> the rows of ``batch_id=N/``, in file order, timestamps as µs."""
    return {b: [tuple(r.values()) for r in rows] for b, rows in read_batch_dirs(path).items()}


def dead_letters(path: str) -> dict[int, list[tuple]]:
    """batch id -> (reason, id) of its dead letters; malformed lines by their text."""
    out = {}
    for b, rows in read_batch_dirs(path).items():
        assert all(r["_batch_id"] == b for r in rows)
        out[b] = sorted((r["_reason"], r["_corrupt_record"] if r["_reason"] == "malformed" else r["id"])
                        for r in rows)
    return out


def expected_dead_letters(outs: list[ro.BatchOut]) -> dict[int, list[tuple]]:
    return {b: sorted((reason, r["_corrupt_record"] if reason == "malformed" else r["id"]) for reason, r in out.dead)
            for b, out in enumerate(outs) if out.dead}


def _µs(v: Any) -> Any:
    return int(pd.Timestamp(v).value // 1000) if isinstance(v, dt.datetime) else v


def postgres_rows(dsn: str, table: str, columns: list[str]) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall()
    return [tuple(_µs(v) for v in r) for r in rows]


def by_batch(rows: list[tuple]) -> dict[int, list[tuple]]:
    """Rows whose last column is ``_batch_id``, grouped by it (each group sorted: a table has no order)."""
    out: dict[int, list[tuple]] = {}
    for r in rows:
        out.setdefault(r[-1], []).append(r[:-1])
    return {b: sorted(v, key=repr) for b, v in out.items()}
