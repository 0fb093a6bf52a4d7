"""The size of a PostgreSQL target table, kept by its writer with each commit.

Dagster's ``dagster/row_count`` is the size of the target table. A ``count(*)`` per batch would scan
a table that only grows, so the writers keep the size instead: every statement that inserts or
deletes target rows adds its exact change (rows inserted, minus rows deleted; an upsert that
updates a key or leaves a row unchanged adds nothing) to the table's row of
``<schema>.ematix_row_counts``::

    table_name text PRIMARY KEY, table_oid oid NOT NULL, row_count bigint NOT NULL

in the same transaction as the rows, whichever commits it (the writer's own ``write``, or the
state store's transaction with ``same_transaction``): the count commits and rolls back with the
rows, and a replay that changes nothing adds nothing.

The count table is the engine's bookkeeping, so it is created when a writer opens even without
``create_table`` (the role needs CREATE on the schema). The table's row is made once, from a
``count(*)``, when it is missing, so a table that already holds rows starts right; ``table_oid``
names the table it counts, so a table dropped and created again (a new OID under the same name)
is counted afresh instead of inheriting the old count. Rows changed by
anything but these writers are not counted: to have the table counted again, delete its row
(``DELETE FROM <schema>.ematix_row_counts WHERE table_name = '<table>'``); the next open or write
counts it.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from ematix_dagster.targets.pg_bookkeeping import BookkeepingTable
from ematix_dagster.targets.pg_table import PostgresTable

COUNT_TABLE = "ematix_row_counts"


class RowCount:
    """One target table's row of the count table, beside it in the target's schema."""

    def __init__(self, pg: PostgresTable) -> None:
        self._pg = pg
        self._table = BookkeepingTable(pg, COUNT_TABLE,
                                       "table_name text PRIMARY KEY, table_oid oid NOT NULL, row_count bigint NOT NULL")
        self.ident = self._table.ident

    def ensure(self, conn: psycopg.Connection) -> None:
        """Create the count table and the target table's row if missing, in ``conn``'s transaction
        (the caller commits); the row starts at a ``count(*)`` of the table, the only one, and so does
        the row of a table dropped and created again."""
        with conn.cursor() as cur:
            self._table.create(cur)
            if not self._current(cur):
                self._initialise(cur)

    def add(self, cur: psycopg.Cursor, delta: int) -> None:
        """Add ``delta`` (rows inserted minus rows deleted) in ``cur``'s transaction, after the
        statements that changed the rows.

        A missing or stale row (deleted to have the table counted again, or left by a dropped
        table) is made from a ``count(*)``, which sees this transaction's own changes, so ``delta``
        is already in it; when another writer made the row meanwhile, its count did not see them,
        and ``delta`` is added to it.
        """
        if delta == 0 or self._update(cur, delta):
            return
        if not self._initialise(cur):
            self._update(cur, delta)

    def read(self) -> int | None:
        """The committed count, on a connection of its own (autocommit, one primary-key lookup), so
        that it never runs inside the writer's open transaction nor on its connection from another
        thread. None when the count table or the table's row does not exist yet (never opened), or the
        row counts a table since dropped."""
        try:
            with self._pg.new_connection(autocommit=True) as conn, conn.cursor() as cur:
                cur.execute(sql.SQL("SELECT row_count FROM {} WHERE table_name = %s AND table_oid = "
                                    "to_regclass(%s)::oid").format(self.ident),
                            (self._pg.table_name, self._pg.ident.as_string(conn)))
                row = cur.fetchone()
        except psycopg.errors.UndefinedTable:
            return None
        except psycopg.Error as exc:
            raise self._pg.error("reading the row count of", exc) from None
        return None if row is None else int(row[0])

    def _current(self, cur: psycopg.Cursor) -> bool:
        """The table's row exists and counts this table (not one dropped under the same name)."""
        cur.execute(sql.SQL("SELECT 1 FROM {} WHERE table_name = %s AND table_oid = {}").format(
            self.ident, self._table.target_oid(cur)), (self._pg.table_name,))
        return cur.fetchone() is not None

    def _initialise(self, cur: psycopg.Cursor) -> bool:
        """Count the table into a new row, or into a stale one; False when a concurrent writer made
        the current row first."""
        cur.execute(sql.SQL(
            "INSERT INTO {counts} AS c (table_name, table_oid, row_count) SELECT %s, {oid}, count(*) FROM {table} "
            "ON CONFLICT (table_name) DO UPDATE SET table_oid = EXCLUDED.table_oid, row_count = EXCLUDED.row_count "
            "WHERE c.table_oid <> EXCLUDED.table_oid").format(counts=self.ident, oid=self._table.target_oid(cur),
                                                              table=self._pg.ident),
                    (self._pg.table_name,))
        return cur.rowcount == 1

    def _update(self, cur: psycopg.Cursor, delta: int) -> bool:
        cur.execute(sql.SQL("UPDATE {} SET row_count = row_count + %s WHERE table_name = %s AND table_oid = {}")
                    .format(self.ident, self._table.target_oid(cur)), (delta, self._pg.table_name))
        return cur.rowcount == 1
