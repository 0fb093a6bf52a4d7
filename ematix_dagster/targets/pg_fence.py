"""The batch fence: a PostgreSQL target records each (query, batch) it wrote, in the rows' transaction.

When Spark holds the window state (``[run] window_state = "executors"``), no state store commits a
batch id together with the target rows, and Spark runs a batch again after a crash when its commit
log entry was not written (same batch id, same rows). The target then keeps the batch from being
written twice itself: before writing a batch's rows, the writer inserts the batch's row into
``<schema>.ematix_written_batches``::

    table_name text, table_oid oid, query_id text, batch_id bigint, written_at timestamptz,
    PRIMARY KEY (table_name, query_id, batch_id)

in the same transaction as the rows, and writes them only when that row is new. The fence row
commits and rolls back with the rows, so a batch is written by exactly one committed transaction:
a replay (or a second writer racing on the same batch, which waits on the first one's uncommitted
key) finds the row and writes nothing.

The key: ``query_id`` is Spark's query id, kept in ``<checkpoint>/metadata`` and stable across
restarts of one checkpoint, so (query, batch) names one batch exactly, while a new checkpoint (a new
query id, batch ids from 0 again) has never written any. ``table_name`` lets the fence rows of every
target of a schema share one table. ``table_oid`` is not in the key: a table dropped and created
again under the same name has a new OID, and its claim takes over the old table's row of that batch
instead of finding it written (as :mod:`~.pg_count` counts such a table afresh).

Old rows are deleted with each claim: Spark re-runs only the latest batch of its offset log, when
that batch has no commit (every earlier one committed), and it keeps the last
``spark.sql.streaming.minBatchesToRetain`` (100) batches' offsets, so no older batch can run again
from the checkpoint. A claim of batch N therefore deletes its query's rows below
N - :data:`KEEP_BATCHES` and the rows of the table's earlier OIDs: a running query keeps at most
``KEEP_BATCHES + 1`` rows per table. A query that stops for good (its checkpoint deleted) leaves its
rows behind; ``DELETE FROM <schema>.ematix_written_batches WHERE query_id = '<id>'`` removes them.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from ematix_dagster.targets.pg_bookkeeping import BookkeepingTable
from ematix_dagster.targets.pg_table import PostgresTable

FENCE_TABLE = "ematix_written_batches"
#: fence rows a query keeps below the batch it writes (Spark's default minBatchesToRetain)
KEEP_BATCHES = 100


class BatchFence:
    """One target table's rows of the fence table, beside it in the target's schema."""

    def __init__(self, pg: PostgresTable) -> None:
        self._table = BookkeepingTable(pg, FENCE_TABLE,
                                       "table_name text NOT NULL, table_oid oid NOT NULL, query_id text NOT NULL, "
                                       "batch_id bigint NOT NULL, written_at timestamptz NOT NULL DEFAULT now(), "
                                       "PRIMARY KEY (table_name, query_id, batch_id)")
        self.ident = self._table.ident

    def ensure(self, conn: psycopg.Connection) -> None:
        """Create the fence table if missing, in ``conn``'s transaction (the caller commits)."""
        with conn.cursor() as cur:
            self._table.create(cur)

    def claim(self, cur: psycopg.Cursor, query_id: str, batch_id: int) -> bool:
        """Record (``query_id``, ``batch_id``) as written to the table, in ``cur``'s transaction; False
        when a committed transaction already wrote it (nothing is then recorded).

        A row left by a dropped table of the same name (another OID) is taken over. A concurrent
        claim of the same batch blocks until this transaction ends, then finds the row (commit) or
        makes it (rollback).
        """
        cur.execute(sql.SQL(
            "INSERT INTO {fence} AS f (table_name, table_oid, query_id, batch_id) VALUES (%s, {oid}, %s, %s) "
            "ON CONFLICT (table_name, query_id, batch_id) DO UPDATE "
            "SET table_oid = EXCLUDED.table_oid, written_at = EXCLUDED.written_at "
            "WHERE f.table_oid <> EXCLUDED.table_oid").format(fence=self.ident, oid=self._table.target_oid(cur)),
                    (self._table.pg.table_name, query_id, batch_id))
        if cur.rowcount != 1:
            return False
        self._prune(cur, query_id, batch_id)
        return True

    def _prune(self, cur: psycopg.Cursor, query_id: str, batch_id: int) -> None:
        """Delete the rows no replay can ask for: the query's below ``batch_id - KEEP_BATCHES``, and
        those of a table dropped under this name."""
        cur.execute(sql.SQL(
            "DELETE FROM {fence} WHERE table_name = %s "
            "AND (table_oid <> {oid} OR (query_id = %s AND batch_id < %s))").format(
                fence=self.ident, oid=self._table.target_oid(cur)),
                    (self._table.pg.table_name, query_id, batch_id - KEEP_BATCHES))
