"""State rows as stores of schema 7 and older hold them, for the tests that read them.

Since schema step 8 a commit appends segments and writes no state row, yet an older store's rows
are still loaded (whole-window rows expanded, emitted flags and written rows beside them),
rewritten by ``migrate_state``, deleted by ``reset`` and a rebase, and checked by ``check``. Tests put
such rows in a store with plain SQL: :func:`write_rows` through the store's own connection,
``old_schemas`` with :func:`insert_rows` on a store left at an older schema.
"""

from __future__ import annotations

from typing import Any, Sequence

from psycopg import sql

from state_store import migrations
from state_store.contract import StateStore
from state_store.postgres_store import PostgresStateStore
from state_store.sqlite import SqliteStateStore

#: the stores that hold state rows: the in-memory one starts empty in every process, so it never has any
ROW_KINDS = ["sqlite", "postgres"]

#: a row's columns as :func:`write_rows` takes them: the first four always, the last two NULL when left out
COLUMNS = ("window_start", "window_end", "group_key", "state_blob", "emitted", "written_row")


def write_rows(store: StateStore, pipeline: str, rows: Sequence[tuple]) -> None:
    """Store ``pipeline``'s rows, each ``(window_start, window_end, key, blob[, emitted[, written_row]])``,
    with the blob's version byte as ``state_version`` as a schema-7 commit wrote it; a row replaces the
    stored one of its (window_start, key)."""
    columns = (*COLUMNS, "state_version")
    full = [(*row, *[None] * (len(COLUMNS) - len(row)), row[3][0] if row[3] else 0) for row in rows]
    if isinstance(store, SqliteStateStore):
        insert_rows("sqlite", store._db(), migrations.sqlite_names(), pipeline, columns, full)
    elif isinstance(store, PostgresStateStore):
        with store._connection() as conn:
            insert_rows("postgres", conn, store._names, pipeline, columns, full)
    else:
        raise TypeError(f"{store.kind} stores hold no state rows")


def insert_rows(kind: str, conn: Any, names: dict, pipeline: str, columns: Sequence[str],
                rows: Sequence[tuple]) -> None:
    """The one INSERT of test state rows (``kind``: sqlite or postgres), each row holding ``columns`` in
    order; ``names``: the tables as ``state_store.migrations`` names them."""
    values = [(pipeline, *row) for row in rows]
    if kind == "sqlite":
        conn.executemany(f"INSERT OR REPLACE INTO {names['state']} (pipeline_name, {', '.join(columns)}, updated_at) "
                         f"VALUES (?, {', '.join('?' * len(columns))}, 'now')", values)
        return
    statement = sql.SQL(
        "INSERT INTO {state} (pipeline_name, {columns}) VALUES (%s, {values}) "
        "ON CONFLICT (pipeline_name, window_start, group_key) DO UPDATE SET {updates}").format(
        columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
        values=sql.SQL(", ").join([sql.Placeholder()] * len(columns)),
        updates=sql.SQL(", ").join(sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in columns),
        **names)
    with conn.cursor() as cur:
        cur.executemany(statement, values)
