"""The PostgreSQL store (psycopg 3 + psycopg_pool), for shared, durable, exactly-once state.

* Tables live in a configurable schema (default ``ematix``), created and migrated on first use
  (``state_store.migrations``); every identifier goes through ``psycopg.sql.Identifier``.
* A commit is one transaction: a rebase's deletes, then the segments appended
  (``state_store.segment_rows``); pending rows inserted and released (``state_store.pending``);
  the batch's offsets; the pipeline row; then each ``in_transaction`` callback with the
  connection; then COMMIT. State rows (stores of schema 7 and older) are read on load and
  rewritten by ``migrate_state`` (``state_store.pg_rows``), never written by a commit.
* Lease: a session-level ``pg_try_advisory_lock(<64-bit hash of schema + pipeline>)`` on a
  dedicated connection (not from the pool), held until ``release_lease`` / ``close`` or until
  the process (and so its connection) dies. The holder text is written to the pipeline row.
  Each commit checks in its own transaction that the lease is still held by that connection
  (a dropped connection loses the lock: the commit fails with ``StoreUnavailable`` rather than
  write without the lease); a store object that does not hold the lease writes under
  ``pg_try_advisory_xact_lock`` and so never while another run holds it. Session advisory locks
  need a direct connection (or PgBouncer in session mode), not a transaction-pooling proxy.
* The URL arrives resolved (``PipelineSpec.resolved``: this package does not read pipeline specs)
  and may hold a password. The password never appears in ``description``, in logs or in error
  messages: it is removed from DSNs and from psycopg's texts (``state_store.pg_url``), and errors
  are raised without chaining the original exception.
* Unreachable server -> ``StoreUnavailable`` (transient); refused credentials, a missing role or
  database -> ``StoreAccessDenied``; missing privileges -> ``StorePermissionError`` (both
  terminal); all name the store (user@host:port/db, schema) and the pipeline.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar, cast

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from state_store import codec, loaded_groups, migrations, pending, segment_rows
from state_store._common import (
    PIPELINE_COLUMNS,
    bring_forward,
    bring_forward_stored,
    check_batch,
    check_record_version,
    expand_windows,
    fill_window_ends,
    lease_held,
    record_from_row,
    where,
)
from state_store.contract import BatchCommit, PendingRow, PendingSummary, PipelineRecord, RecoveredState, StateStore
from state_store.errors import EmatixError, StoreConfigError, StoreUnavailable
from state_store.names import lease_key
from state_store.pg_rows import read_beside, rewrite_blobs, select_groups
from state_store.pg_url import describe, parse_url, store_error

log = logging.getLogger(__name__)
T = TypeVar("T")

# ---- the store -------------------------------------------------------------------------------


class PostgresStateStore(StateStore):
    kind = "postgres"
    durable = True

    def __init__(self, url: str, schema: str = "ematix", *, connect_timeout: int = 10,
                 pool_min: int = 1, pool_max: int = 4) -> None:
        if not schema or not isinstance(schema, str):
            raise StoreConfigError("state_store.schema", "must be a non-empty schema name")
        self._url = url  # may hold a password: never shown as is
        self.schema = schema
        self.connect_timeout = connect_timeout
        self.pool_min, self.pool_max = pool_min, pool_max
        self._pool: ConnectionPool | None = None
        self._conninfo: str | None = None
        self._lease_conn: psycopg.Connection | None = None
        self._lease_pid: int | None = None
        self._leases: dict[str, str] = {}  # pipeline -> holder text
        self._lock = threading.RLock()
        self._names = migrations.postgres_names(schema)

    # ---- naming ----------------------------------------------------------------------------------

    @property
    def description(self) -> str:
        return f"PostgreSQL state store {describe(self._url)} (schema {self.schema})"

    # ---- errors ----------------------------------------------------------------------------------

    def _translate(self, exc: BaseException, action: str, pipeline: str | None) -> EmatixError | None:
        return store_error(exc, f"{action} failed for {where(pipeline, self.description)}", schema=self.schema,
                           connect_timeout=self.connect_timeout)

    def _guard(self, action: str, pipeline: str | None, fn: Callable[[], T]) -> T:
        """Run ``fn``; turn database errors into the package's errors, raised without a chained cause."""
        try:
            return fn()
        except BaseException as exc:  # noqa: BLE001
            err = self._translate(exc, action, pipeline)
            if err is None:
                raise
        raise err  # outside the handler: no __context__ carrying the driver's original text

    # ---- connection ------------------------------------------------------------------------------

    def _resolve(self) -> str:
        if self._conninfo is None:
            parse_url(self._url)  # StoreConfigError when it does not parse; its password is redacted from now on
            self._conninfo = self._url
        return self._conninfo

    def _connect(self, autocommit: bool) -> psycopg.Connection:
        return psycopg.connect(self._resolve(), autocommit=autocommit, connect_timeout=self.connect_timeout,
                               application_name="ematix-dagster state store")

    def open(self) -> None:
        with self._lock:
            if self._pool is not None:
                return
            self._guard("opening the store", None, self._open)

    def _open(self) -> None:
        conn = self._connect(autocommit=False)
        try:
            migrations.apply_postgres(conn, self.schema, self.description)
            conn.commit()
        finally:
            conn.close()
        pool = ConnectionPool(
            self._resolve(), min_size=self.pool_min, max_size=self.pool_max, open=False,
            name=f"ematix-state-{self.schema}", timeout=float(self.connect_timeout),
            check=ConnectionPool.check_connection,
            kwargs={"connect_timeout": self.connect_timeout, "application_name": "ematix-dagster state store"})
        try:
            pool.open(wait=True, timeout=float(self.connect_timeout) + 5)
        except BaseException:
            pool.close()
            raise
        self._pool = pool

    def _ensure_open(self) -> None:
        """Open on first use (inside the caller's ``_guard``, so errors name its pipeline)."""
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._open()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        self._ensure_open()
        assert self._pool is not None
        with self._pool.connection() as conn:
            yield conn

    def _lease_connection(self) -> psycopg.Connection:
        conn = self._lease_conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if self._leases:
            raise StoreUnavailable(
                f"{self.description}: the connection holding the leases of {sorted(self._leases)} was lost, "
                "so those leases are gone; restart the run")
        conn = self._connect(autocommit=True)
        self._lease_conn, self._lease_pid = conn, conn.info.backend_pid
        return conn

    # ---- lease -----------------------------------------------------------------------------------

    def _lock_parts(self, pipeline: str) -> tuple[int, int, int]:
        key = lease_key(self.schema, pipeline)
        unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
        return key, unsigned >> 32, unsigned & 0xFFFF_FFFF

    def _holder(self, conn: psycopg.Connection, pipeline: str) -> tuple[int | None, str | None]:
        """(backend pid, holder text) of whoever holds the lease now, (None, None) when free."""
        _, hi, lo = self._lock_parts(pipeline)
        row = conn.execute(sql.SQL(
            "SELECT l.pid, (SELECT lease_holder FROM {pipelines} WHERE pipeline_name = %s) FROM pg_locks l "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.classid::bigint = %s "
            "AND l.objid::bigint = %s AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "LIMIT 1").format(**self._names), (pipeline, hi, lo)).fetchone()
        if row is None:
            return None, None
        return row[0], row[1] or f"PostgreSQL backend pid {row[0]} (holder text not written yet)"

    def acquire_lease(self, pipeline: str, holder: str) -> None:
        with self._lock:
            self._guard("acquiring the lease", pipeline, lambda: self._acquire(pipeline, holder))

    def _acquire(self, pipeline: str, holder: str) -> None:
        self._ensure_open()
        if pipeline not in self._leases:
            conn = self._lease_connection()
            key = self._lock_parts(pipeline)[0]
            if not cast(tuple, conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone())[0]:  # one row
                with self._connection() as other:
                    _, text = self._holder(other, pipeline)
                raise lease_held(pipeline, self.description, text)
            try:
                self._write_holder(pipeline, holder)
            except BaseException:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                raise
        else:
            self._write_holder(pipeline, holder)
        self._leases[pipeline] = holder

    def _write_holder(self, pipeline: str, holder: str | None) -> None:
        with self._connection() as conn:
            conn.execute(sql.SQL(
                "INSERT INTO {pipelines} (pipeline_name, lease_holder) VALUES (%s, %s) ON CONFLICT (pipeline_name) "
                "DO UPDATE SET lease_holder = EXCLUDED.lease_holder, updated_at = now()").format(**self._names),
                (pipeline, holder))

    def release_lease(self, pipeline: str) -> None:
        with self._lock:
            self._guard("releasing the lease", pipeline, lambda: self._release(pipeline))

    def _release(self, pipeline: str) -> None:
        holder = self._leases.pop(pipeline, None)
        if holder is None:
            return
        try:
            with self._connection() as conn:
                conn.execute(sql.SQL("UPDATE {pipelines} SET lease_holder = NULL, updated_at = now() "
                                     "WHERE pipeline_name = %s AND lease_holder = %s").format(**self._names),
                             (pipeline, holder))
        finally:
            conn2 = self._lease_conn
            if conn2 is not None and not conn2.closed and not conn2.broken:
                conn2.execute("SELECT pg_advisory_unlock(%s)", (self._lock_parts(pipeline)[0],))

    def lease_holder(self, pipeline: str) -> str | None:
        with self._lock:
            if pipeline in self._leases:
                return self._leases[pipeline]

        def ask() -> str | None:
            with self._connection() as conn:
                return self._holder(conn, pipeline)[1]

        return self._guard("asking for the lease holder", pipeline, ask)

    def _check_writer(self, conn: psycopg.Connection, pipeline: str) -> None:
        """Inside a write transaction: make sure no other run holds the pipeline's lease."""
        key, hi, lo = self._lock_parts(pipeline)
        if pipeline in self._leases:
            ours = conn.execute(
                "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                "AND classid::bigint = %s AND objid::bigint = %s AND pid = %s "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                (hi, lo, self._lease_pid)).fetchone()
            if ours:
                return
            pid, text = self._holder(conn, pipeline)
            if pid is not None:
                raise lease_held(pipeline, self.description, text)
            raise StoreUnavailable(
                f"{where(pipeline, self.description)}: the lease was lost (its connection dropped); "
                "nothing was written, restart the run")
        if not cast(tuple, conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (key,)).fetchone())[0]:  # one row
            raise lease_held(pipeline, self.description, self._holder(conn, pipeline)[1])

    # ---- data ------------------------------------------------------------------------------------

    def load(self, pipeline: str, groups: bool = True) -> RecoveredState:
        return self._guard("loading state", pipeline, lambda: self._load(pipeline, groups))

    def _load(self, pipeline: str, with_groups: bool) -> RecoveredState:
        n = self._names
        with self._connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = conn.execute(sql.SQL("SELECT {columns} FROM {pipelines} WHERE pipeline_name = %s").format(
                columns=sql.SQL(", ").join(map(sql.Identifier, PIPELINE_COLUMNS)), **n), (pipeline,)).fetchone()
            if row is None or row[0] is None:  # no row, or only a lease marker: never committed
                return RecoveredState(record=None)
            offsets = dict(conn.execute(sql.SQL("SELECT source_id, offset_json FROM {offsets} "
                                                "WHERE pipeline_name = %s").format(**n), (pipeline,)).fetchall())
            groups: list[tuple[int, int | None, bytes, bytes]] = []
            flags: dict[tuple[int, bytes], bool] = {}
            written: dict[tuple[int, bytes], bytes] = {}
            segments: list[bytes] = []
            if with_groups:
                cur = conn.cursor(binary=True)
                cur.execute(select_groups(n), (pipeline,))
                with loaded_groups.gc_paused():
                    groups = cur.fetchall()
                flags, written = read_beside(cur, n, pipeline)
                segments = segment_rows.pg_load(conn, n, pipeline)
        record = record_from_row(pipeline, row, offsets, self.description)
        check_record_version(record, self.description)
        groups = expand_windows(pipeline, self.description, groups)
        groups, migrated = bring_forward(pipeline, self.description, fill_window_ends(groups, record))
        return RecoveredState(record=record, groups=groups, migrated=migrated, emitted=flags, written=written,
                              segments=segments)

    def commit(self, batch: BatchCommit) -> None:
        check_batch(batch)
        self._guard("committing a batch", batch.record.pipeline, lambda: self._commit(batch))

    def _commit(self, batch: BatchCommit) -> None:
        record, n = batch.record, self._names
        pipeline = record.pipeline
        with self._connection() as conn, conn.transaction():
            self._check_writer(conn, pipeline)
            segment_rows.pg_drop(conn, n, batch)
            segment_rows.pg_append(conn, n, batch)
            pending.pg_commit(conn, n, batch, self.description)
            conn.execute(sql.SQL("DELETE FROM {offsets} WHERE pipeline_name = %s").format(**n), (pipeline,))
            if record.offsets:
                batch_id = record.last_batch_id if record.last_batch_id is not None else -1
                with conn.cursor() as cur:
                    cur.executemany(sql.SQL(
                        "INSERT INTO {offsets} (pipeline_name, source_id, batch_id, offset_json, state_version) "
                        "VALUES (%s, %s, %s, %s, %s)").format(**n),
                        [(pipeline, source, batch_id, offset, record.state_version)
                         for source, offset in record.offsets.items()])
            values = (record.state_version, record.query_id, record.last_batch_id, record.fingerprint,
                      Jsonb(record.fingerprint_doc), record.watermark, Jsonb(_sources_doc(record)),
                      Jsonb(record.counters), self._leases.get(pipeline),
                      bool(record.pending_migration), record.trigger_fired_at, record.release_watermark,
                      record.last_batch_rows)
            conn.execute(sql.SQL(
                "INSERT INTO {pipelines} (pipeline_name, {columns}, updated_at) VALUES (%s, {params}, now()) "
                "ON CONFLICT (pipeline_name) DO UPDATE SET {updates}, updated_at = now()").format(
                columns=sql.SQL(", ").join(map(sql.Identifier, PIPELINE_COLUMNS)),
                params=sql.SQL(", ").join([sql.Placeholder()] * len(PIPELINE_COLUMNS)),
                updates=sql.SQL(", ").join(sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c))
                                           for c in PIPELINE_COLUMNS), **n), (pipeline, *values))
            for callback in batch.in_transaction:
                callback(conn)

    def load_pending(self, pipeline: str, up_to_release_us: int, limit: int | None = None) -> list[PendingRow]:
        pending.check_load(up_to_release_us, limit)

        def load() -> list[PendingRow]:
            with self._connection() as conn:
                return pending.pg_load(conn, self._names, pipeline, up_to_release_us, limit)

        return self._guard("loading pending rows", pipeline, load)

    def pending_summary(self, pipeline: str) -> PendingSummary:
        def summary() -> PendingSummary:
            with self._connection() as conn:
                return pending.pg_summary(conn, self._names, pipeline)

        return self._guard("summing up pending rows", pipeline, summary)

    def reset(self, pipeline: str) -> int:
        return self._guard("resetting state", pipeline, lambda: self._reset(pipeline))

    def _reset(self, pipeline: str) -> int:
        with self._connection() as conn, conn.transaction():
            self._check_writer(conn, pipeline)
            for table in ("state", "offsets", "pipelines"):
                conn.execute(sql.SQL("DELETE FROM {t} WHERE pipeline_name = %s").format(t=self._names[table]),
                             (pipeline,))
            discarded = pending.pg_discard(conn, self._names, pipeline)
            segment_rows.pg_discard(conn, self._names, pipeline)
            if pipeline in self._leases:  # keep showing who holds the lease
                conn.execute(sql.SQL("INSERT INTO {pipelines} (pipeline_name, lease_holder) VALUES (%s, %s)")
                             .format(**self._names), (pipeline, self._leases[pipeline]))
            return discarded

    def migrate_state(self, pipeline: str) -> int:
        return self._guard("migrating state", pipeline, lambda: self._migrate_state(pipeline))

    def _migrate_state(self, pipeline: str) -> int:
        with self._connection() as conn, conn.transaction():
            self._check_writer(conn, pipeline)
            cur = conn.cursor(binary=True)
            cur.execute(select_groups(self._names, stale_only=True), (pipeline, codec.STATE_VERSION))
            rows, migrated = bring_forward_stored(pipeline, self.description, cur.fetchall())
            if rows:
                rewrite_blobs(conn, self._names, pipeline, rows)
            return migrated

    def close(self) -> None:
        with self._lock:
            for pipeline in list(self._leases):
                try:
                    self._release(pipeline)
                except Exception:  # noqa: BLE001 - closing the connection below frees the locks anyway
                    self._leases.pop(pipeline, None)
            if self._lease_conn is not None:
                self._lease_conn.close()
                self._lease_conn = self._lease_pid = None
            if self._pool is not None:
                self._pool.close()
                self._pool = None


def _sources_doc(record: PipelineRecord) -> list[list[Any]]:
    # an array keeps the source order (jsonb would sort object keys); same shape as SQLite's
    return [[name, p.max_event_ts, p.last_arrival] for name, p in record.sources.items()]


__all__ = ["PostgresStateStore"]
