"""The postgres target (an upsert per batch) and postgres dead letters (replaced per batch id).

Dead-letter table
-----------------
A fixed shape that survives schema drift of the payload::

    _batch_id bigint NOT NULL, _source text, _event_ts timestamptz, _reason text, payload jsonb NOT NULL

plus an index on ``_batch_id`` (for the replay delete). ``payload`` is a JSON object of every
column other than ``_source``, ``_event_ts``, ``_batch_id`` and ``_reason``
(:mod:`~ematix_dagster.targets.pg_types` says how each value is written). An event time before
4713 BC, which no ``timestamptz`` holds, leaves ``_event_ts`` NULL and is kept in the payload as
text. ``_batch_id`` is always
the batch id passed to ``write``. The table is created only with ``create_table = true`` (as for the
target: DDL is never run without being asked for); otherwise it must exist with those columns,
which ``open()`` checks.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Sequence

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from ematix_dagster.columns import BATCH_ID, DEAD_LETTER_COLUMNS, EMIT_KIND, EMIT_SEQ, EVENT_TS, REASON, RETRACT, SOURCE
from ematix_dagster.spec import DeadLetter, Target
from ematix_dagster.targets.pg_count import RowCount
from ematix_dagster.targets.pg_fence import BatchFence
from ematix_dagster.targets.pg_table import PostgresTable
from ematix_dagster.targets.pg_types import (
    PG_MIN_US,
    _json_value,
    _normalize_column,
    _python_columns,
    _text,
    postgres_type,
    python_values,
)
from ematix_dagster.targets.pg_write import (
    commit_on_own_connection,
    commit_write,
    copy_rows,
    delete_batch,
    delete_time_range,
    require_columns,
    require_transaction,
    stage_rows,
    upsert,
)

_PAYLOAD_COLUMN = "payload"
#: the ``_batch_id`` of dead letters a backfill wrote (no streamed batch has it, so no replay deletes them)
BACKFILL_BATCH_ID = -1


class PostgresWindowWriter:
    """Upserts window rows into a PostgreSQL table (see :mod:`ematix_dagster.targets`).

    ``retract`` rows (a key that disappeared, e.g. a session whose start moved or that merged into
    another, docs/contract/emission.md) delete their key's row instead, before the batch's upserts and
    in the same transaction, whatever the window kind.

    The table holds the latest row per key, so ``_emit_seq`` (order within a batch) is never
    stored. ``_emit_kind`` is stored when ``store_emit_kind`` (the window's emit trigger fires
    early): a key's row may then be an ``early`` one its window's ``final`` will replace, and only
    the column tells readers which. With the watermark trigger every row is final or a correction
    and the table holds the output columns only.

    Each transaction that changes the table also changes its size in the count table
    (:mod:`~ematix_dagster.targets.pg_count`), which :meth:`row_count` reads: Dagster's
    ``dagster/row_count`` without a ``count(*)`` per batch.

    :meth:`write_batch_once` writes a batch only if its (query, batch) is not in the fence table yet
    (:mod:`~ematix_dagster.targets.pg_fence`): for when Spark, not a state store, holds the window
    state, so that nothing else keeps a replayed batch from being written again.
    """

    idempotent = True

    def __init__(self, target: Target, pipeline_name: str, schema: pa.Schema, key_columns: list[str],
                 store_emit_kind: bool) -> None:
        self._pg = PostgresTable(target.url, target.table, pipeline_name, "target")
        self.create_table = bool(target.create_table)
        self.pipeline_name = pipeline_name
        not_stored = (EMIT_SEQ,) if store_emit_kind else (EMIT_SEQ, EMIT_KIND)
        self.columns = [n for n in schema.names if n not in not_stored]
        self.key_columns = list(key_columns)
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"duplicate output column names: {self.columns}")
        self.types = {n: postgres_type(schema.field(n).type, n, "target") for n in self.columns}
        self._count = RowCount(self._pg)
        self._fence = BatchFence(self._pg)
        self._opened = False

    @property
    def description(self) -> str:
        return f"postgres table {self._pg.table_text} on {self._pg.where} (upsert on {', '.join(self.key_columns)})"

    @property
    def table(self) -> str:
        return self._pg.table_text

    def open(self) -> None:
        """Create the table (``create_table = true``), check it, and make its row count if missing."""
        self._pg.prepare(self._create if self.create_table else None, self.types, "table", self._check)
        self._opened = True

    def _create(self, cur: psycopg.Cursor) -> None:
        self._pg.create(cur, self.types, unique_key=self.key_columns)

    def _check(self, conn: psycopg.Connection, oid: int) -> None:
        # window_start (the key's first column) is never NULL, group values may be
        self._pg.check_unique_key(conn, oid, self.key_columns, nullable=self.key_columns[1:])
        self._count.ensure(conn)

    def row_count(self) -> int | None:
        """The table's size as of the last commit (see :mod:`~ematix_dagster.targets.pg_count`);
        None before any writer opened it. Safe from any thread, also while a batch is written."""
        return self._count.read()

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        commit_write(self, batch_id, rows, f"writing batch {batch_id} to")

    def write_in_transaction(self, conn: psycopg.Connection, batch_id: int, rows: pa.Table) -> None:
        """Delete the keys of ``rows``' retract rows, then upsert the others, using ``conn``'s
        current transaction; the caller commits.

        ``conn`` must not be in autocommit mode (the staging table lives until commit). psycopg
        errors propagate unchanged so that the caller can roll back its whole transaction.
        """
        if rows.num_rows == 0:
            return
        require_transaction(conn)
        require_columns(batch_id, rows, self.columns)
        retracts, rows = _split_retracts(rows)
        with conn.cursor() as cur:
            deleted = self._delete_keys(cur, retracts) if retracts.num_rows else 0
            inserted = upsert(cur, self._pg, rows, self.columns, self.key_columns) if rows.num_rows else 0
            self._count.add(cur, inserted - deleted)

    def write_batch_once(self, query_id: str, batch_id: int, rows: pa.Table) -> bool:
        """:meth:`write_batch_once_in_transaction` on the writer's own connection, committed."""
        if rows.num_rows == 0:  # nothing to fence: see write_batch_once_in_transaction
            return False
        return commit_on_own_connection(self, f"writing batch {batch_id} to", lambda conn: (
            self.write_batch_once_in_transaction(conn, query_id, batch_id, rows)))

    def write_batch_once_in_transaction(self, conn: psycopg.Connection, query_id: str, batch_id: int,
                                        rows: pa.Table) -> bool:
        """Record (``query_id``, ``batch_id``) in the fence table and, only when it is new, write
        ``rows`` as :meth:`write_in_transaction` does, in ``conn``'s transaction (the caller commits);
        whether it wrote them. A batch some committed transaction already wrote (a replay) writes
        nothing and returns False.

        An empty batch records nothing, connects to nothing and returns False: Spark replays a batch
        with the same offsets and state, so it is empty again on replay, and a fence row for it
        would only cost a round trip per idle batch.
        """
        if rows.num_rows == 0:
            return False
        require_transaction(conn)
        self._fence.ensure(conn)  # made by its first user (a pipeline that never fences has none); undone by a rollback
        with conn.cursor() as cur:
            if not self._fence.claim(cur, query_id, batch_id):
                return False
        self.write_in_transaction(conn, batch_id, rows)
        return True

    def replace_windows(self, start_us: int, end_us: int, rows: pa.Table,
                        in_transaction: Sequence[Callable[[psycopg.Connection], None]] = ()) -> int:
        """One transaction: delete every row whose window starts in [start_us, end_us), write ``rows``
        (a backfill's windows of that range), run ``in_transaction`` (the range's dead letters),
        commit; how many rows it deleted. Without rows the writer may know no columns: the table is
        then only checked to exist, by the delete."""
        if rows.num_rows and not self._opened:
            self.open()
        conn = self._pg.connect()
        try:
            self._count.ensure(conn)  # an empty range leaves the writer unopened
            with conn.cursor() as cur:
                deleted = delete_time_range(cur, self._pg.ident, self.key_columns[0], start_us, end_us)
                self._count.add(cur, -deleted)
            self.write_in_transaction(conn, 0, rows)
            for callback in in_transaction:
                callback(conn)
            conn.commit()
        except psycopg.Error as exc:
            self._pg.drop_broken_connection()
            raise self._pg.error("replacing a backfill range of", exc) from None
        except BaseException:
            self._pg.drop_broken_connection()
            raise
        return deleted

    def _delete_keys(self, cur: psycopg.Cursor, retracts: pa.Table) -> int:
        """Delete the rows whose key a retract row names (NULL group values match NULL: the key is
        ``NULLS NOT DISTINCT``); how many. The keys are staged with the table's own column types."""
        keys = [sql.Identifier(c) for c in self.key_columns]
        # window_start is never NULL (the unique key's first column); group values may be
        match = sql.SQL(" AND ").join(
            sql.SQL("t.{k} = s.{k}").format(k=k) if i == 0 else
            sql.SQL("(t.{k} = s.{k} OR (t.{k} IS NULL AND s.{k} IS NULL))").format(k=k) for i, k in enumerate(keys))
        stage = stage_rows(cur, "ematix_stage_retracts", self._pg, retracts, self.key_columns)
        cur.execute(sql.SQL("DELETE FROM {target} AS t USING {stage} AS s WHERE {match}").format(
            target=self._pg.ident, stage=stage, match=match))
        deleted = cur.rowcount
        cur.execute(sql.SQL("DROP TABLE {}").format(stage))
        return deleted

    def close(self) -> None:
        self._pg.close()
        self._opened = False


def _split_retracts(rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``rows``' retract rows (their keys are deleted) and the others (upserted)."""
    if EMIT_KIND not in rows.column_names:
        return rows.slice(0, 0), rows
    retract = pc.fill_null(pc.equal(rows.column(EMIT_KIND), RETRACT), False)
    if not pc.any(retract).as_py():  # the usual batch: nothing to copy
        return rows.slice(0, 0), rows
    return rows.filter(retract), rows.filter(pc.invert(retract))


class PostgresDeadLetterWriter:
    """Dead-letter rows into a fixed-shape PostgreSQL table, replaced per batch id on replay."""

    idempotent = True

    def __init__(self, dead_letter: DeadLetter, pipeline_name: str) -> None:
        self._pg = PostgresTable(dead_letter.url, dead_letter.table, pipeline_name, "dead_letter")
        self.create_table = bool(dead_letter.create_table)
        self.pipeline_name = pipeline_name
        self._opened = False

    _TYPES = {BATCH_ID: "bigint", SOURCE: "text", EVENT_TS: "timestamptz", REASON: "text",
              _PAYLOAD_COLUMN: "jsonb"}

    @property
    def description(self) -> str:
        return f"postgres dead-letter table {self._pg.table_text} on {self._pg.where}"

    @property
    def table(self) -> str:
        return self._pg.table_text

    def open(self) -> None:
        self._pg.prepare(self._create if self.create_table else None, self._TYPES, "dead-letter table")
        self._opened = True

    def _create(self, cur: psycopg.Cursor) -> None:
        self._pg.create(cur, self._TYPES, not_null=(BATCH_ID, _PAYLOAD_COLUMN))
        self._pg.create_batch_id_index(cur)

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        commit_write(self, batch_id, rows, f"writing dead letters of batch {batch_id} to")

    def write_in_transaction(self, conn: psycopg.Connection, batch_id: int, rows: pa.Table) -> None:
        """Replace the batch's dead letters using ``conn``'s transaction; the caller commits."""
        if rows.num_rows == 0:
            return
        require_transaction(conn)
        with conn.cursor() as cur:
            delete_batch(cur, self._pg.ident, batch_id)
        self._copy(conn, batch_id, rows)

    def replace_range_in_transaction(self, conn: psycopg.Connection, start_us: int, end_us: int,
                                     rows: pa.Table) -> None:
        """A backfill's: delete the dead letters whose event time is in [start_us, end_us) (the stream's
        ``late`` ones included: the backfill counted those rows), then write ``rows`` under
        :data:`BACKFILL_BATCH_ID`, in ``conn``'s transaction."""
        require_transaction(conn)
        if not self._opened:
            self.open()
        with conn.cursor() as cur:
            delete_time_range(cur, self._pg.ident, EVENT_TS, start_us, end_us)
        if rows.num_rows:
            self._copy(conn, BACKFILL_BATCH_ID, rows)

    def _copy(self, conn: psycopg.Connection, batch_id: int, rows: pa.Table) -> None:
        for c in (SOURCE, REASON):
            if c not in rows.column_names:
                raise ValueError(f"dead-letter rows of batch {batch_id} lack the {c} column")
        n = rows.num_rows
        sources = _python_columns(rows, [SOURCE])[0]
        reasons = _python_columns(rows, [REASON])[0]
        if EVENT_TS in rows.column_names:
            ts = rows.column(EVENT_TS)
            if not pa.types.is_timestamp(ts.type):
                raise ValueError(f"{EVENT_TS} of batch {batch_id} is {ts.type}, not a timestamp")
            event_ts = python_values(ts)
            # before 4713 BC: no timestamptz holds it, so the payload keeps it as text instead
            early = [v is not None and v < PG_MIN_US for v in _normalize_column(ts).cast(pa.int64()).to_pylist()]
        else:
            event_ts, early = [None] * n, [False] * n
        payload_cols = [c for c in rows.column_names if c not in DEAD_LETTER_COLUMNS]
        payload_data = [python_values(rows.column(c)) for c in payload_cols]

        def copy_values() -> Iterator[tuple[Any, ...]]:
            for i in range(n):
                payload = {c: _json_value(col[i]) for c, col in zip(payload_cols, payload_data)}
                if early[i]:
                    payload[EVENT_TS], event_ts[i] = event_ts[i], None
                yield (batch_id, _text(sources[i]), event_ts[i], _text(reasons[i]),
                       json.dumps(payload, allow_nan=False, ensure_ascii=False))

        with conn.cursor() as cur:
            copy_rows(cur, self._pg.ident, [*DEAD_LETTER_COLUMNS, _PAYLOAD_COLUMN], copy_values())

    def close(self) -> None:
        self._pg.close()
        self._opened = False
