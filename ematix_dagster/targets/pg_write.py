"""The statements the PostgreSQL writers run inside a batch's transaction, written once for all of them.

Every function here works on a caller's cursor or connection and commits nothing: a writer's own
``write`` commits through :func:`commit_write`, and the engine's same-transaction path commits
state and output together (exactly-once). Identifiers always go through :mod:`psycopg.sql`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Iterable, Protocol, Sequence, TypeVar

import psycopg
import pyarrow as pa
from psycopg import sql

from ematix_dagster.columns import BATCH_ID
from ematix_dagster.targets.pg_table import PostgresTable
from ematix_dagster.targets.pg_types import _EPOCH, _python_columns

R = TypeVar("R")

#: a staged row's position in its batch, so that the last row of a key can win
_ORD_COLUMN = "__ematix_row_ord"


class TransactionWriter(Protocol):
    """What :func:`commit_write` needs of a PostgreSQL writer."""

    _pg: PostgresTable
    _opened: bool

    def open(self) -> None: ...

    def write_in_transaction(self, conn: psycopg.Connection, batch_id: int, rows: pa.Table) -> None: ...


def commit_write(writer: TransactionWriter, batch_id: int, rows: pa.Table, action: str) -> None:
    """``write_in_transaction`` on the writer's own connection, committed; failures reconnect next time.

    An empty batch neither connects nor writes: replays recompute the same rows, so a batch that
    is empty now was empty the first time and left nothing to replace.
    """
    if rows.num_rows:
        commit_on_own_connection(writer, action, lambda conn: writer.write_in_transaction(conn, batch_id, rows))


def commit_on_own_connection(writer: TransactionWriter, action: str, work: Callable[[psycopg.Connection], R]) -> R:
    """Open the writer if it is not, run ``work`` in a transaction of the writer's own connection and
    commit it; what ``work`` returned. Any failure rolls back (or drops a broken connection, so the
    next call reconnects); a psycopg error becomes the writer's :class:`TargetError` for ``action``."""
    conn = writer._pg.connect()
    if not writer._opened:
        writer.open()
    try:
        result = work(conn)
        conn.commit()
    except psycopg.Error as exc:
        writer._pg.drop_broken_connection()
        raise writer._pg.error(action, exc) from None
    except BaseException:
        writer._pg.drop_broken_connection()
        raise
    return result


def require_transaction(conn: psycopg.Connection) -> None:
    """Refuse an autocommit connection: each statement would commit alone, and temporary staging
    tables (``ON COMMIT DROP``) would vanish between them."""
    if conn.autocommit:
        raise ValueError("write_in_transaction needs a connection with autocommit = False")


def require_columns(batch_id: int, rows: pa.Table, columns: Sequence[str]) -> None:
    """Refuse a batch that lacks one of the table's output columns (an engine bug, not a user error)."""
    missing = [c for c in columns if c not in rows.column_names]
    if missing:
        raise ValueError(f"batch {batch_id} lacks output column(s) {missing}")


def copy_rows(cur: psycopg.Cursor, table: sql.Composable, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """COPY ``rows`` (tuples in ``columns``' order) into ``table``: one round trip for the whole batch."""
    names = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(table, names)) as copy:
        for row in rows:
            copy.write_row(row)


def delete_batch(cur: psycopg.Cursor, table: sql.Composable, batch_id: int) -> int:
    """Delete the rows an earlier attempt of batch ``batch_id`` wrote (a replay then writes them
    again); how many."""
    cur.execute(sql.SQL("DELETE FROM {} WHERE {} = %s").format(table, sql.Identifier(BATCH_ID)), (batch_id,))
    return cur.rowcount


def delete_time_range(cur: psycopg.Cursor, table: sql.Composable, column: str, start_us: int, end_us: int) -> int:
    """Delete the rows whose timestamptz ``column`` is in [start_us, end_us) (a backfill's range); how many."""
    bounds = [_EPOCH + dt.timedelta(microseconds=us) for us in (start_us, end_us)]
    cur.execute(sql.SQL("DELETE FROM {t} WHERE {c} >= %s AND {c} < %s").format(t=table, c=sql.Identifier(column)),
                bounds)
    return cur.rowcount


def stage_rows(cur: psycopg.Cursor, stage: str, pg: PostgresTable, rows: pa.Table, columns: Sequence[str],
               ordinal: bool = False) -> sql.Identifier:
    """COPY ``rows``' ``columns`` into a new temporary table ``stage`` that has the target table's own
    column types (so values convert exactly as an insert would convert them), dropped at commit.
    ``ordinal`` adds :data:`_ORD_COLUMN`, each row's position in ``rows``."""
    ident = sql.Identifier(stage)
    col_list = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    extra = sql.SQL(", 0::bigint AS {}").format(sql.Identifier(_ORD_COLUMN)) if ordinal else sql.SQL("")
    cur.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(ident))
    cur.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {}{} FROM {} WITH NO DATA")
                .format(ident, col_list, extra, pg.ident))
    data = zip(*_python_columns(rows, columns))
    if ordinal:
        copy_rows(cur, ident, [*columns, _ORD_COLUMN], ((*row, i) for i, row in enumerate(data)))
    else:
        copy_rows(cur, ident, columns, data)
    return ident


def upsert(cur: psycopg.Cursor, pg: PostgresTable, rows: pa.Table, columns: Sequence[str],
           key: Sequence[str]) -> int:
    """Insert ``rows`` into ``pg``'s table, replacing the row of each ``key`` already there; how
    many rows it inserted (new keys: the table's growth, for :class:`~.pg_count.RowCount`).

    The rows are staged, and of several rows with one key the *last* in ``rows`` wins
    (``DISTINCT ON`` over the staged position; NULL key values are one key, as in the table's
    ``UNIQUE NULLS NOT DISTINCT`` constraint). A row whose values equal the stored ones is not
    rewritten, so a replay touches nothing. When every column is a key column there is nothing to
    update and a present key is kept as it is.

    A new row is told from an updated one by its ``xmax``: 0 for a row this statement inserted, the
    transaction's id for one ``ON CONFLICT DO UPDATE`` rewrote (unchanged and kept rows are not
    returned at all).
    """
    stage = stage_rows(cur, "ematix_stage_rows", pg, rows, columns, ordinal=True)
    values = [sql.Identifier(c) for c in columns if c not in key]
    col_list = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    key_list = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    on_conflict: sql.Composable = sql.SQL("DO NOTHING")
    if values:
        on_conflict = sql.SQL("DO UPDATE SET {sets} WHERE ({old}) IS DISTINCT FROM ({new})").format(
            sets=sql.SQL(", ").join(sql.SQL("{} = EXCLUDED.{}").format(v, v) for v in values),
            old=sql.SQL(", ").join(sql.SQL("t.{}").format(v) for v in values),
            new=sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(v) for v in values))
    cur.execute(sql.SQL(
        "WITH merged AS (INSERT INTO {target} AS t ({cols}) "
        "SELECT {cols} FROM (SELECT DISTINCT ON ({keys}) {cols} FROM {stage} ORDER BY {keys}, {ord} DESC) s "
        "ON CONFLICT ({keys}) {on_conflict} RETURNING t.xmax = 0 AS inserted) "
        "SELECT count(*) FILTER (WHERE inserted) FROM merged").format(
            target=pg.ident, cols=col_list, keys=key_list, stage=stage, ord=sql.Identifier(_ORD_COLUMN),
            on_conflict=on_conflict))
    row = cur.fetchone()
    cur.execute(sql.SQL("DROP TABLE {}").format(stage))
    return int(row[0]) if row else 0
