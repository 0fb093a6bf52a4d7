"""State segments (schema step 8): the SQL of both databases for ``BatchCommit.segments``.

A segment is an opaque blob (``state_store.segments`` makes and reads them); the stores keep a
pipeline's segments in append order, numbered by ``seq``. Decisions shared by the three stores:

* A rebase (``BatchCommit.rebase``) deletes the pipeline's segments and state rows before any
  other write of the commit; the commit's segments then land on empty state.
* A dropped prefix (``BatchCommit.dropped_segments = N``) deletes the pipeline's N segments of the
  smallest ``seq`` at the same point, before the append; a commit never asks for both (the store
  refuses it: a rebase deletes them all anyway).
* Segments are appended numbered from the largest stored ``seq`` plus one (from 0 when none is
  left), so a load replays them in the order they were committed; after a dropped prefix the
  smallest stored ``seq`` is no longer 0, and nothing reads it as a position.
* A load reads them in its snapshot, after the state rows of an older store (commits write none);
  ``reset`` deletes them with the rows.
"""

from __future__ import annotations

import sqlite3

from psycopg import sql

from state_store.contract import BatchCommit
from state_store.migrations import sqlite_names

_N = sqlite_names()
_DELETE_SQLITE = [f"DELETE FROM {_N[table]} WHERE pipeline_name = ?" for table in ("segments", "state")]
_DROP_SQLITE = (f"DELETE FROM {_N['segments']} WHERE pipeline_name = ? AND seq IN "
                f"(SELECT seq FROM {_N['segments']} WHERE pipeline_name = ? ORDER BY seq LIMIT ?)")


def sqlite_drop(conn: sqlite3.Connection, batch: BatchCommit) -> None:
    """The rebase's or the dropped prefix's deletes, first in the commit."""
    pipeline = batch.record.pipeline
    if batch.rebase:
        for statement in _DELETE_SQLITE:
            conn.execute(statement, (pipeline,))
    elif batch.dropped_segments:
        conn.execute(_DROP_SQLITE, (pipeline, pipeline, batch.dropped_segments))


def sqlite_append(conn: sqlite3.Connection, batch: BatchCommit) -> None:
    if not batch.segments:
        return
    pipeline = batch.record.pipeline
    first = conn.execute(f"SELECT coalesce(max(seq), -1) + 1 FROM {_N['segments']} WHERE pipeline_name = ?",
                         (pipeline,)).fetchone()[0]
    conn.executemany(f"INSERT INTO {_N['segments']} (pipeline_name, seq, blob) VALUES (?, ?, ?)",
                     [(pipeline, first + i, blob) for i, blob in enumerate(batch.segments)])


def sqlite_load(conn: sqlite3.Connection, pipeline: str) -> list[bytes]:
    return [blob for (blob,) in conn.execute(f"SELECT blob FROM {_N['segments']} WHERE pipeline_name = ? "
                                             "ORDER BY seq", (pipeline,))]


def sqlite_discard(conn: sqlite3.Connection, pipeline: str) -> None:
    conn.execute(_DELETE_SQLITE[0], (pipeline,))


def pg_drop(conn, names: dict, batch: BatchCommit) -> None:
    pipeline = batch.record.pipeline
    if batch.rebase:
        for table in ("segments", "state"):
            conn.execute(sql.SQL("DELETE FROM {t} WHERE pipeline_name = %s").format(t=names[table]), (pipeline,))
    elif batch.dropped_segments:
        conn.execute(sql.SQL("DELETE FROM {segments} WHERE pipeline_name = %s AND seq IN "
                             "(SELECT seq FROM {segments} WHERE pipeline_name = %s ORDER BY seq LIMIT %s)")
                     .format(**names), (pipeline, pipeline, batch.dropped_segments))


def pg_append(conn, names: dict, batch: BatchCommit) -> None:
    if not batch.segments:
        return
    pipeline = batch.record.pipeline
    first = conn.execute(sql.SQL("SELECT coalesce(max(seq), -1) + 1 FROM {segments} WHERE pipeline_name = %s")
                         .format(**names), (pipeline,)).fetchone()[0]
    with conn.cursor() as cur:
        cur.executemany(sql.SQL("INSERT INTO {segments} (pipeline_name, seq, blob) VALUES (%s, %s, %s)").format(**names),
                        [(pipeline, first + i, blob) for i, blob in enumerate(batch.segments)])


def pg_load(conn, names: dict, pipeline: str) -> list[bytes]:
    cur = conn.cursor(binary=True)
    cur.execute(sql.SQL("SELECT blob FROM {segments} WHERE pipeline_name = %s ORDER BY seq").format(**names),
                (pipeline,))
    return [bytes(blob) for (blob,) in cur.fetchall()]


def pg_discard(conn, names: dict, pipeline: str) -> None:
    conn.execute(sql.SQL("DELETE FROM {segments} WHERE pipeline_name = %s").format(**names), (pipeline,))


__all__ = ["pg_append", "pg_discard", "pg_drop", "pg_load", "sqlite_append", "sqlite_discard", "sqlite_drop",
           "sqlite_load"]
