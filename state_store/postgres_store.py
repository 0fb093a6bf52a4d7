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
* A live process keeps its advisory lock however long it was given up for, so the lease also
  has an epoch on the pipeline row (schema step 10), raised by every acquisition and by a
  take-over while the old holder still has the lock. The first statement of each write
  transaction of the holder locks that row (``SELECT lease_epoch ... FOR UPDATE``): a take-over's
  UPDATE then waits for a commit in flight (which lands, and the taker sees it) or lands first (and
  the commit, its ``in_transaction`` writes included, rolls back with ``LeaseLost``). A take-over
  writes its holder text to the row at once, so the fenced run's refusal names it.
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
    LeaseRow,
    LeaseSteps,
    bring_forward,
    bring_forward_stored,
    check_batch,
    check_fence,
    check_record_version,
    expand_windows,
    fill_window_ends,
    lease_held,
    not_committed,
    record_from_row,
    renew_lease,
    take_lease,
    where,
)
from state_store.contract import (
    BatchCommit,
    PendingRow,
    PendingSummary,
    PipelineRecord,
    RecoveredState,
    StateStore,
    TakeOver,
    output_watermark,
)
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
        self._epochs: dict[str, int] = {}  # pipeline -> the lease epoch this object holds it at
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

    def acquire_lease(self, pipeline: str, holder: str, take_over: TakeOver | None = None, *,
                      take_over_wait_s: float = 60.0) -> None:
        self._guard("acquiring the lease", pipeline, lambda: self._acquire(pipeline, holder, take_over, take_over_wait_s))

    def _acquire(self, pipeline: str, holder: str, take_over: TakeOver | None, wait_s: float) -> None:
        self._ensure_open()
        steps = self._lease_steps(pipeline, holder)
        with self._lock:
            if pipeline in self._leases:
                renew_lease(pipeline, self.description, steps, self._lock_parts(pipeline)[0], self._epochs[pipeline])
                self._leases[pipeline] = holder
                return
        # each step locks on its own: a take-over's wait must not stop every other use of this object
        _, epoch = take_lease(pipeline, self.description, steps, take_over, wait_s)
        with self._lock:
            self._leases[pipeline], self._epochs[pipeline] = holder, epoch

    def _lease_steps(self, pipeline: str, holder: str) -> LeaseSteps[int]:
        key = self._lock_parts(pipeline)[0]
        return LeaseSteps(try_lock=lambda: self._try_lock(pipeline, key), unlock=self._unlock,
                          fence=lambda: self._fence(pipeline, holder),
                          claim=lambda _key, epoch: self._claim(pipeline, holder, epoch))

    def _try_lock(self, pipeline: str, key: int) -> tuple[int | None, str | None]:
        with self._lock:
            conn = self._lease_connection()
            if cast(tuple, conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone())[0]:  # one row
                return key, None
        with self._connection() as other:
            return None, self._holder(other, pipeline)[1]

    def _unlock(self, key: int) -> None:
        with self._lock:
            self._lease_connection().execute("SELECT pg_advisory_unlock(%s)", (key,))

    def _fence(self, pipeline: str, holder: str) -> int:
        with self._connection() as conn:
            return cast(tuple, conn.execute(sql.SQL(
                "INSERT INTO {pipelines} AS p (pipeline_name, lease_holder, lease_epoch) VALUES (%s, %s, 1) "
                "ON CONFLICT (pipeline_name) DO UPDATE SET lease_holder = EXCLUDED.lease_holder, "
                "lease_epoch = p.lease_epoch + 1, updated_at = now() RETURNING p.lease_epoch").format(**self._names),
                (pipeline, holder)).fetchone())[0]

    def _claim(self, pipeline: str, holder: str, epoch: int) -> LeaseRow:
        with self._connection() as conn:
            claimed = conn.execute(sql.SQL(
                "UPDATE {pipelines} SET lease_holder = %s, updated_at = now() "
                "WHERE pipeline_name = %s AND lease_epoch = %s").format(**self._names), (holder, pipeline, epoch))
            return None if claimed.rowcount else self._lease_row(conn, pipeline)

    def _lease_row(self, conn: psycopg.Connection, pipeline: str, for_update: bool = False) -> LeaseRow:
        """The stored (epoch, holder text) of the pipeline; ``for_update`` locks its row till the transaction ends."""
        return conn.execute(sql.SQL("SELECT lease_epoch, lease_holder FROM {pipelines} WHERE pipeline_name = %s{lock}")
                            .format(lock=sql.SQL(" FOR UPDATE" if for_update else ""), **self._names),
                            (pipeline,)).fetchone()

    def release_lease(self, pipeline: str) -> None:
        with self._lock:
            self._guard("releasing the lease", pipeline, lambda: self._release(pipeline))

    def _release(self, pipeline: str) -> None:
        holder = self._leases.pop(pipeline, None)
        self._epochs.pop(pipeline, None)
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

    def lease_epoch(self, pipeline: str) -> int | None:
        return self._epochs.get(pipeline)

    def _check_writer(self, conn: psycopg.Connection, pipeline: str, undone: str, batch: int | None = None) -> None:
        """First in a write transaction: make sure no other run holds the pipeline's lease, nor took it over.

        The fence comes first: its row lock is what a take-over's UPDATE serializes with.
        """
        key, hi, lo = self._lock_parts(pipeline)
        if pipeline in self._leases:
            check_fence(pipeline, self.description, self._epochs[pipeline],
                        self._lease_row(conn, pipeline, for_update=True), undone, batch)
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
            self._check_writer(conn, pipeline, not_committed(batch), record.last_batch_id)
            segment_rows.pg_drop(conn, n, batch)
            segment_rows.pg_append(conn, n, batch)
            pending.pg_commit(conn, n, batch, self.description)
            record.output_watermark = output_watermark(record.releasing_watermark, pending.pg_oldest(conn, n, pipeline))
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
                      record.last_batch_rows, record.output_watermark)
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
            self._check_writer(conn, pipeline, "the reset was not done")
            stored = self._lease_row(conn, pipeline)
            epoch = self._epochs.get(pipeline, stored[0] if stored else 0)
            for table in ("state", "offsets", "pipelines"):
                conn.execute(sql.SQL("DELETE FROM {t} WHERE pipeline_name = %s").format(t=self._names[table]),
                             (pipeline,))
            discarded = pending.pg_discard(conn, self._names, pipeline)
            segment_rows.pg_discard(conn, self._names, pipeline)
            if pipeline in self._leases or epoch:  # keep showing who holds the lease; an epoch never goes back
                conn.execute(sql.SQL("INSERT INTO {pipelines} (pipeline_name, lease_holder, lease_epoch) "
                                     "VALUES (%s, %s, %s)").format(**self._names),
                             (pipeline, self._leases.get(pipeline), epoch))
            return discarded

    def migrate_state(self, pipeline: str) -> int:
        return self._guard("migrating state", pipeline, lambda: self._migrate_state(pipeline))

    def _migrate_state(self, pipeline: str) -> int:
        with self._connection() as conn, conn.transaction():
            self._check_writer(conn, pipeline, "the migration was not done")
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
                    self._epochs.pop(pipeline, None)
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
