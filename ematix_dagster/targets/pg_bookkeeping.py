"""An engine bookkeeping table beside a PostgreSQL target table, whose rows name the target by name and OID.

The count table (:mod:`~.pg_count`) and the batch fence (:mod:`~.pg_fence`) live in the target's
schema and are created when a writer opens, even without ``create_table``: they are the engine's,
not the user's. Their rows name the target table by ``table_name`` and by ``table_oid``, so that a
table dropped and created again under the same name (a new OID) inherits nothing from the old one.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from ematix_dagster.targets.pg_table import PostgresTable


class BookkeepingTable:
    """``<target schema>.<name>``, created with ``columns`` (an SQL column list) when missing."""

    def __init__(self, pg: PostgresTable, name: str, columns: str) -> None:
        self.pg = pg
        self.ident = sql.Identifier(pg.schema_name, name) if pg.schema_name else sql.Identifier(name)
        self._columns = sql.SQL(columns)

    def create(self, cur: psycopg.Cursor) -> None:
        """Create the table if missing, in ``cur``'s transaction (the caller commits)."""
        name = self.ident.as_string(cur.connection)
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
        row = cur.fetchone()
        if row and row[0]:
            return
        # Writers opening at once: CREATE TABLE IF NOT EXISTS alone can still collide in the catalog.
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (name,))
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(self.ident, self._columns))

    def target_oid(self, cur: psycopg.Cursor) -> sql.Composable:
        """The target table's current OID, as an SQL expression (an error when the table is gone)."""
        return sql.SQL("{}::regclass::oid").format(sql.Literal(self.pg.ident.as_string(cur.connection)))
