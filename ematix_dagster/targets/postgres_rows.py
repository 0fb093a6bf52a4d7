"""The postgres target of a row pipeline (sources -> ``[transform] sql`` -> target, no window).

The table has the SELECT's output columns, in its order, typed by :func:`~.pg_types.postgres_type`.
How a replayed batch is kept from duplicating rows depends on whether the target names a key:

* **no key**: the table also has ``_batch_id bigint NOT NULL`` (the batch that released the row,
  indexed), and a batch deletes its ``_batch_id``'s rows before inserting its own, in one
  transaction. A replay of batch N therefore leaves exactly one copy of N's rows, while rows are
  otherwise appended as they are: duplicates the SQL produces are kept.
* **key columns**: a ``UNIQUE NULLS NOT DISTINCT`` constraint on them (NULL key values are one key)
  and an upsert, as the window target does: a replay rewrites identical values, a later batch
  replaces a key's row.

Either way the transaction that changes the rows also changes the table's size in the count table
(:mod:`~.pg_count`), which :meth:`PostgresRowWriter.row_count` reads.

An empty batch writes nothing and deletes nothing, like every other writer. That is safe because
a replay recomputes the same rows from the same input and the same committed state: a batch that
is empty on replay was empty the first time, and left no rows to replace.
"""

from __future__ import annotations

from typing import Sequence

import psycopg
import pyarrow as pa

from ematix_dagster.columns import BATCH_ID
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import Target
from ematix_dagster.targets.pg_count import RowCount
from ematix_dagster.targets.pg_table import PostgresTable
from ematix_dagster.targets.pg_types import _python_columns, postgres_type
from ematix_dagster.targets.pg_write import (
    commit_write,
    copy_rows,
    delete_batch,
    require_columns,
    require_transaction,
    upsert,
)


class PostgresRowWriter:
    """Writes a row pipeline's rows into a PostgreSQL table (see the module docstring).

    What the engine must do:

    * hand all of a batch's rows to one ``write`` (or ``write_in_transaction``) call: without a key,
      a second call for the same batch id replaces the first one's rows (that is what makes a
      replay safe);
    * with key columns, order each key's rows so that the winner comes *last*: the row with the
      largest ``_event_ts``, then the largest tuple of values in SELECT order (docs/contract/
      targets-and-guarantees.md). The writer keeps the last row of each key of a batch and does
      not look at the values itself, so the rule lives in one place, the engine's sort.
    """

    idempotent = True

    def __init__(self, target: Target, pipeline_name: str, schema: pa.Schema, key_columns: Sequence[str]) -> None:
        self._pg = PostgresTable(target.url, target.table, pipeline_name, "target")
        self.create_table = bool(target.create_table)
        self.pipeline_name = pipeline_name
        self.columns = list(schema.names)
        self.key_columns = list(key_columns)
        if len(set(self.columns)) != len(self.columns):
            raise PipelineConfigError("transform.sql", f"the SELECT names a column twice: {self.columns}",
                                      "give every output column its own name (AS ...)")
        unknown = [k for k in self.key_columns if k not in self.columns]
        if unknown or len(set(self.key_columns)) != len(self.key_columns):
            raise PipelineConfigError("target.key", f"key {self.key_columns} must name distinct output columns of "
                                      f"[transform] sql ({', '.join(self.columns)})",
                                      f"remove {unknown or 'the repeated column'} from key, or select it")
        if not self.key_columns and BATCH_ID in self.columns:
            raise PipelineConfigError("transform.sql", f"the output column {BATCH_ID} is the one a postgres target "
                                      "without a key adds", "rename it in the SELECT, or give the target a key")
        #: the table's columns and their types (the output's, then _batch_id without a key)
        self.types = {n: postgres_type(schema.field(n).type, n, "target") for n in self.columns}
        if not self.key_columns:
            self.types[BATCH_ID] = "bigint"
        self._count = RowCount(self._pg)
        self._opened = False

    @property
    def description(self) -> str:
        how = f"upsert on {', '.join(self.key_columns)}" if self.key_columns else f"rows replaced per {BATCH_ID}"
        return f"postgres table {self._pg.table_text} on {self._pg.where} ({how})"

    @property
    def table(self) -> str:
        return self._pg.table_text

    def open(self) -> None:
        """Create the table (``create_table = true``), then check its columns and, with a key, its
        unique key: an unfit table is a :class:`PipelineConfigError` before any batch runs. Its row
        count is made if missing."""
        self._pg.prepare(self._create if self.create_table else None, self.types, "table", self._check)
        self._opened = True

    def _create(self, cur: psycopg.Cursor) -> None:
        self._pg.create(cur, self.types, unique_key=self.key_columns, not_null=(BATCH_ID,))
        if not self.key_columns:
            self._pg.create_batch_id_index(cur)

    def _check(self, conn: psycopg.Connection, oid: int) -> None:
        if self.key_columns:  # any key column of a SELECT may be NULL
            self._pg.check_unique_key(conn, oid, self.key_columns, nullable=self.key_columns)
        self._count.ensure(conn)

    def row_count(self) -> int | None:
        """The table's size as of the last commit (see :mod:`~.pg_count`); None before any writer
        opened it. Safe from any thread, also while a batch is written."""
        return self._count.read()

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        """``part`` names a file part; a table's write replaces the batch's rows whatever the part."""
        commit_write(self, batch_id, rows, f"writing batch {batch_id} to")

    def write_in_transaction(self, conn: psycopg.Connection, batch_id: int, rows: pa.Table) -> None:
        """Write the batch using ``conn``'s current transaction; the caller commits (a postgres
        state store in the same database commits state and rows together: exactly-once).

        ``conn`` must not be in autocommit mode. psycopg errors propagate unchanged so that the
        caller can roll back its whole transaction.
        """
        if rows.num_rows == 0:
            return
        require_transaction(conn)
        require_columns(batch_id, rows, self.columns)
        with conn.cursor() as cur:
            if self.key_columns:  # an updated key does not change the table's size
                change = upsert(cur, self._pg, rows, self.columns, self.key_columns)
            else:
                change = self._replace(cur, batch_id, rows)
            self._count.add(cur, change)

    def _replace(self, cur: psycopg.Cursor, batch_id: int, rows: pa.Table) -> int:
        """Without a key: replace the batch's rows; how many more rows the table holds (COPY writes
        every row or fails)."""
        deleted = delete_batch(cur, self._pg.ident, batch_id)
        values = zip(*_python_columns(rows, self.columns))
        copy_rows(cur, self._pg.ident, [*self.columns, BATCH_ID], ((*row, batch_id) for row in values))
        return rows.num_rows - deleted

    def close(self) -> None:
        self._pg.close()
        self._opened = False
