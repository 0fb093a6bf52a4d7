"""The PostgreSQL store's state-row statements: read a pipeline's groups, upsert a batch of them.

Kept beside ``state_store.postgres`` (the store's lifecycle, leases and commit) so that module
stays small; a commit's state rows are written by :func:`write_groups`. Rows are ``(window_start, window_end, key, blob)`` (``state_store.base``); their
``emitted`` flags (schema step 5) and last written rows (``written_row``, schema step 6) travel
beside them, keyed by ``(window_start, key)``.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg
from psycopg import sql

from state_store import segment_rows, whole_window
from state_store.base import BatchCommit

# named for its columns: a session that still holds the temp table of an older layout never reuses it
_TEMP = sql.Identifier("pg_temp", "ematix_state_upserts_6")


def select_groups(names: dict, stale_only: bool = False) -> sql.Composed:
    """The pipeline's rows (``%s``: the pipeline; with ``stale_only`` also ``%s``: the current version)."""
    text = "SELECT window_start, window_end, group_key, state_blob FROM {state} WHERE pipeline_name = %s"
    if stale_only:
        text += " AND state_version <> %s"
    return sql.SQL(text).format(**names)


def select_beside(names: dict, column: str, stale_only: bool = False) -> sql.Composed:
    """A column kept beside the groups (``emitted``, ``written_row``) as (window_start, group_key, value),
    its non-NULL values only; parameters as :func:`select_groups`."""
    text = ("SELECT window_start, group_key, {column} FROM {state} WHERE pipeline_name = %s "
            "AND {column} IS NOT NULL")
    if stale_only:
        text += " AND state_version <> %s"
    return sql.SQL(text).format(column=sql.Identifier(column), **names)


def read_beside(cur: psycopg.Cursor, names: dict, params: tuple, stale_only: bool = False
                ) -> tuple[dict[tuple[int, bytes], bool], dict[tuple[int, bytes], bytes]]:
    """The non-NULL emitted flags and written rows of the rows :func:`select_groups` reads with the
    same parameters, by (window_start, key); run in the caller's transaction (one snapshot)."""
    cur.execute(select_beside(names, "emitted", stale_only), params)
    flags = {(start, key): flag for start, key, flag in cur.fetchall()}
    cur.execute(select_beside(names, "written_row", stale_only), params)
    written = {(start, key): kept for start, key, kept in cur.fetchall()}
    return flags, written


def write_groups(conn: psycopg.Connection, names: dict, batch: BatchCommit) -> None:
    """A commit's state rows, in the caller's transaction: a rebase's deletes, whole windows
    (replacing every row of theirs), upserts, then deletes by key, by window and before a start (so
    a group both updated and deleted in a batch ends deleted), then the segments (schema step 8)."""
    pipeline = batch.record.pipeline
    segment_rows.pg_rebase(conn, names, batch)
    if batch.whole_windows:
        conn.execute(sql.SQL("DELETE FROM {state} WHERE pipeline_name = %s AND window_start = ANY(%s::bigint[])")
                     .format(**names), (pipeline, [start for start, _, _ in batch.whole_windows]))
        upsert_groups(conn, names, pipeline, [(start, end, whole_window.WINDOW_KEY, blob)
                                              for start, end, blob in batch.whole_windows])
    if batch.upserts:
        upsert_groups(conn, names, pipeline, batch.upserts, batch.emitted, batch.written)
    if batch.deletes:
        conn.execute(sql.SQL(
            "DELETE FROM {state} s USING unnest(%s::bigint[], %s::bytea[]) AS d(window_start, group_key) "
            "WHERE s.pipeline_name = %s AND s.window_start = d.window_start AND s.group_key = d.group_key"
        ).format(**names), ([s for s, _ in batch.deletes], [k for _, k in batch.deletes], pipeline))
    if batch.deleted_windows:
        conn.execute(sql.SQL("DELETE FROM {state} WHERE pipeline_name = %s AND window_start = ANY(%s::bigint[])")
                     .format(**names), (pipeline, list(batch.deleted_windows)))
    if batch.deleted_before is not None:
        conn.execute(sql.SQL("DELETE FROM {state} WHERE pipeline_name = %s AND window_start < %s")
                     .format(**names), (pipeline, batch.deleted_before))
    segment_rows.pg_append(conn, names, batch)


def upsert_groups(conn: psycopg.Connection, names: dict, pipeline: str,
                  upserts: Sequence[tuple[int, int | None, bytes, bytes]],
                  emitted: dict[tuple[int, bytes], bool] | None = None,
                  written: dict[tuple[int, bytes], bytes] | None = None) -> None:
    """COPY into a temp table, then one INSERT ... ON CONFLICT (the last upsert of a key wins).

    Every row's ``emitted`` and ``written_row`` columns are written: its entry in ``emitted`` /
    ``written``, NULL without one.
    """
    latest = {(start, key): (end, blob) for start, end, key, blob in upserts}
    rows: Any = upserts if len(latest) == len(upserts) else [(s, e, k, b) for (s, k), (e, b) in latest.items()]
    conn.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {temp} (window_start bigint, window_end bigint, "
                         "group_key bytea, state_blob bytea, state_version integer, emitted boolean, "
                         "written_row bytea) ON COMMIT DELETE ROWS").format(temp=_TEMP))
    with conn.cursor() as cur:
        with cur.copy(sql.SQL("COPY {temp} (window_start, window_end, group_key, state_blob, state_version, emitted, "
                              "written_row) FROM STDIN (FORMAT BINARY)").format(temp=_TEMP)) as copy:
            copy.set_types(["int8", "int8", "bytea", "bytea", "int4", "bool", "bytea"])
            write = copy.write_row
            if emitted or written:
                flag, kept = (emitted or {}).get, (written or {}).get
                for start, end, key, blob in rows:
                    write((start, end, key, blob, blob[0] if blob else 0, flag((start, key)), kept((start, key))))
            else:
                for start, end, key, blob in rows:
                    write((start, end, key, blob, blob[0] if blob else 0, None, None))
        cur.execute(sql.SQL(
            "INSERT INTO {state} (pipeline_name, window_start, window_end, group_key, state_blob, state_version, "
            "updated_at, emitted, written_row) SELECT %s, window_start, window_end, group_key, state_blob, "
            "state_version, now(), emitted, written_row FROM {temp} "
            "ON CONFLICT (pipeline_name, window_start, group_key) DO UPDATE SET "
            "window_end = EXCLUDED.window_end, state_blob = EXCLUDED.state_blob, "
            "state_version = EXCLUDED.state_version, updated_at = EXCLUDED.updated_at, emitted = EXCLUDED.emitted, "
            "written_row = EXCLUDED.written_row").format(temp=_TEMP, **names), (pipeline,))


__all__ = ["read_beside", "select_beside", "select_groups", "upsert_groups", "write_groups"]
