"""The PostgreSQL store's state-row statements: read a pipeline's rows, rewrite their blobs.

Stores of schema 7 and older hold state rows; commits no longer write any (they append segments,
``state_store.segment_rows``), so rows are only read on load, rewritten by ``migrate_state`` and
deleted. Kept beside ``state_store.postgres_store`` (the store's lifecycle, leases and commit) so that
module stays small. Rows are ``(window_start, window_end, key, blob)`` (``state_store.contract``); their
``emitted`` flags (schema step 5) and last written rows (``written_row``, schema step 6) travel
beside them, keyed by ``(window_start, key)``.
"""

from __future__ import annotations

import psycopg
from psycopg import sql


def select_groups(names: dict, stale_only: bool = False) -> sql.Composed:
    """The pipeline's rows (``%s``: the pipeline; with ``stale_only`` also ``%s``: the current version)."""
    text = "SELECT window_start, window_end, group_key, state_blob FROM {state} WHERE pipeline_name = %s"
    if stale_only:
        text += " AND state_version <> %s"
    return sql.SQL(text).format(**names)


def _beside(names: dict, column: str) -> sql.Composed:
    """A column kept beside the groups (``emitted``, ``written_row``) as (window_start, group_key, value),
    its non-NULL values only (``%s``: the pipeline)."""
    return sql.SQL("SELECT window_start, group_key, {column} FROM {state} WHERE pipeline_name = %s "
                   "AND {column} IS NOT NULL").format(column=sql.Identifier(column), **names)


def read_beside(cur: psycopg.Cursor, names: dict, pipeline: str
                ) -> tuple[dict[tuple[int, bytes], bool], dict[tuple[int, bytes], bytes]]:
    """The pipeline's non-NULL emitted flags and written rows by (window_start, key); run in the
    caller's transaction, so they are of the rows :func:`select_groups` read (one snapshot)."""
    cur.execute(_beside(names, "emitted"), (pipeline,))
    flags = {(start, key): flag for start, key, flag in cur.fetchall()}
    cur.execute(_beside(names, "written_row"), (pipeline,))
    written = {(start, key): kept for start, key, kept in cur.fetchall()}
    return flags, written


def rewrite_blobs(conn: psycopg.Connection, names: dict, pipeline: str,
                  rows: list[tuple[int, int | None, bytes, bytes]]) -> None:
    """``migrate_state``'s write: each row's blob (and version) in place, in one statement; its end,
    flag and written row stay as they are."""
    conn.execute(sql.SQL(
        "UPDATE {state} AS s SET state_blob = m.state_blob, state_version = m.state_version, updated_at = now() "
        "FROM unnest(%s::bigint[], %s::bytea[], %s::bytea[], %s::integer[]) "
        "AS m(window_start, group_key, state_blob, state_version) "
        "WHERE s.pipeline_name = %s AND s.window_start = m.window_start AND s.group_key = m.group_key"
    ).format(**names), ([start for start, _, _, _ in rows], [key for _, _, key, _ in rows],
                        [blob for _, _, _, blob in rows], [blob[0] for _, _, _, blob in rows], pipeline))


__all__ = ["read_beside", "rewrite_blobs", "select_groups"]
