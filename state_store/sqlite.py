"""The embedded default store: one SQLite file (stdlib ``sqlite3``, WAL mode).

* Tables mirror the PostgreSQL ones (``state_store.migrations``), STRICT-typed.
* One transaction per commit (``BEGIN IMMEDIATE``), ``synchronous = FULL`` so a commit that
  returned survives a power cut (the exactly-once bookkeeping needs the store to never fall behind
  Spark's own commit log).
* Lease: an exclusive ``fcntl.flock`` on ``<path>.<pipeline>.lock`` held for the run. The lock
  file holds the holder text while the lease is held (it is truncated on release; a crashed
  holder's lock is freed by the kernel, its stale text is ignored because the lock is free). The
  text is also written to the pipeline row (``lease_holder``), for people reading the tables. A
  store object that writes without holding the lease takes the lock for the duration of the
  write, so a commit/reset/migration never runs while another process holds the lease.
* A flock cannot be taken from a live process, so the lease also has an epoch on the pipeline
  row (schema step 10), raised by every acquisition and by a take-over while the old holder still
  has the lock. The holder's writes read it inside their ``BEGIN IMMEDIATE`` transaction: SQLite
  has one writer at a time, so a take-over's raise lands wholly before such a write (which is then
  refused) or after it. A take-over writes its holder text to the row at once (the fenced run's
  refusal names it) and to the lock file once it has the lock.
* Lock files are never deleted (deleting a lock file another process may be opening is a race).
* Files the store creates (the database, its -wal and -shm, lock files) are mode 0600; an existing
  file keeps its mode (``state_store.private_files``). Pending rows: ``state_store.pending``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, cast

from state_store import codec, migrations, pending, segment_rows
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
    file_safe,
    fill_window_ends,
    lease_held,
    not_committed,
    record_from_row,
    renew_lease,
    sources_to_json,
    take_lease,
    where,
)
from state_store.contract import (
    BatchCommit,
    PendingRow,
    PendingSummary,
    RecoveredState,
    StateStore,
    TakeOver,
    output_watermark,
)
from state_store.errors import CorruptState, StorePermissionError, StoreUnavailable
from state_store.loaded_groups import gc_paused
from state_store.private_files import PRIVATE, create_private, warn_if_shared

_NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
_HOLDER_WAIT_S = 1.0  # a lock that is held but has no holder text yet is re-checked for this long

_N = migrations.sqlite_names()
_GROUPS = f"SELECT window_start, window_end, group_key, state_blob FROM {_N['state']} WHERE pipeline_name = ?"
#: the non-NULL emitted flags (sessions; a fixed window's is NULL), beside the groups in the same snapshot
_FLAGS = (f"SELECT window_start, group_key, emitted FROM {_N['state']} "
          "WHERE pipeline_name = ? AND emitted IS NOT NULL")
#: the kept last written rows (schema step 6), likewise
_WRITTEN = (f"SELECT window_start, group_key, written_row FROM {_N['state']} "
            "WHERE pipeline_name = ? AND written_row IS NOT NULL")
#: ``migrate_state``'s rewrite of one row's blob, its flag and written row left as they are
_REWRITE = (f"UPDATE {_N['state']} SET state_blob = ?, state_version = ?, updated_at = ? "
            "WHERE pipeline_name = ? AND window_start = ? AND group_key = ?")
_PIPELINE_COLUMNS = ", ".join(PIPELINE_COLUMNS)
#: the pipeline row of a commit: its name, ``PIPELINE_COLUMNS`` in order, updated_at
_PIPELINE_UPSERT = (f"INSERT INTO {_N['pipelines']} (pipeline_name, {_PIPELINE_COLUMNS}, updated_at) "
                    f"VALUES ({', '.join('?' * (len(PIPELINE_COLUMNS) + 2))}) "
                    "ON CONFLICT (pipeline_name) DO UPDATE SET "
                    + ", ".join(f"{c} = excluded.{c}" for c in PIPELINE_COLUMNS) + ", updated_at = excluded.updated_at")
#: a lease's fence: the epoch raised by one (the first is 1), the holder's text written beside it
_FENCE = (f"INSERT INTO {_N['pipelines']} (pipeline_name, lease_holder, lease_epoch, updated_at) "
          f"VALUES (?, ?, 1, {_NOW}) ON CONFLICT (pipeline_name) DO UPDATE SET lease_holder = excluded.lease_holder, "
          "lease_epoch = lease_epoch + 1, updated_at = excluded.updated_at RETURNING lease_epoch")
_LEASE_ROW = f"SELECT lease_epoch, lease_holder FROM {_N['pipelines']} WHERE pipeline_name = ?"


class SqliteStateStore(StateStore):
    kind = "sqlite"
    durable = True

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        self._leases: dict[str, tuple[int, str]] = {}  # pipeline -> (lock file descriptor, holder)
        self._epochs: dict[str, int] = {}  # pipeline -> the lease epoch this object holds it at

    @property
    def description(self) -> str:
        return f"SQLite state store {self.path}"

    # ---- connection ------------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            if self._conn is not None:
                return
            with self._errors("opening the store"):
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if not create_private(self.path):
                    warn_if_shared(self.path, self.description)
                conn = sqlite3.connect(str(self.path), timeout=self.timeout, isolation_level=None,
                                       check_same_thread=False)
                try:
                    conn.execute("PRAGMA journal_mode = WAL").fetchone()
                    conn.execute("PRAGMA synchronous = FULL")
                    migrations.apply_sqlite(conn, self.description)
                except BaseException:
                    conn.close()
                    raise
            self._conn = conn

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self.open()
        assert self._conn is not None
        return self._conn

    @contextmanager
    def _errors(self, action: str, pipeline: str | None = None) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            text = str(exc)
            what = f"{action} failed for {where(pipeline, self.description)}: {text}"
            if any(s in text for s in ("readonly", "unable to open", "permission", "not authorized")):
                raise StorePermissionError(what + " (check that the file and its directory are writable)") from exc
            raise StoreUnavailable(what) from exc
        except PermissionError as exc:
            raise StorePermissionError(f"{action} failed for {where(pipeline, self.description)}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            if type(exc) is sqlite3.DatabaseError:  # "file is not a database", "malformed"
                raise CorruptState(f"{action} failed for {where(pipeline, self.description)}: {exc}") from exc
            raise

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # ---- lease -----------------------------------------------------------------------------------

    def lock_path(self, pipeline: str) -> Path:
        return Path(f"{self.path}.{file_safe(pipeline)}.lock")

    def _try_lock(self, pipeline: str, create: bool = True) -> tuple[int | None, str | None]:
        """(fd, None) when this call now holds the lock; (None, holder text or None) when it does not.

        A lock held by another process whose holder text is still empty is re-checked briefly
        (the holder writes its text right after locking; a concurrent ``lease_holder`` probe
        holds it only for an instant).
        """
        path = self.lock_path(pipeline)
        deadline = time.monotonic() + _HOLDER_WAIT_S
        while True:
            try:
                fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), PRIVATE)
            except FileNotFoundError:
                return None, None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd, None
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
                os.close(fd)
                if text or time.monotonic() > deadline:
                    return None, text or None
                time.sleep(0.02)

    @staticmethod
    def _unlock(fd: int, clear: bool = False) -> None:
        try:
            if clear:
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def acquire_lease(self, pipeline: str, holder: str, take_over: TakeOver | None = None, *,
                      take_over_wait_s: float = 60.0) -> None:
        with self._errors("acquiring the lease", pipeline):
            self._db()
            steps = self._lease_steps(pipeline, holder)
            with self._lock:
                if pipeline in self._leases:
                    fd = self._leases[pipeline][0]
                    renew_lease(pipeline, self.description, steps, fd, self._epochs[pipeline])
                    self._leases[pipeline] = (fd, holder)
                    return
            # each step locks on its own: a take-over's wait must not stop every other use of this object
            fd, epoch = take_lease(pipeline, self.description, steps, take_over, take_over_wait_s)
            with self._lock:
                self._leases[pipeline], self._epochs[pipeline] = (fd, holder), epoch

    def _lease_steps(self, pipeline: str, holder: str) -> LeaseSteps[int]:
        return LeaseSteps(try_lock=lambda: self._try_lock(pipeline), unlock=lambda fd: self._unlock(fd, clear=True),
                          fence=lambda: self._fence(pipeline, holder),
                          claim=lambda fd, epoch: self._claim(fd, pipeline, holder, epoch))

    def _fence(self, pipeline: str, holder: str) -> int:
        with self._lock, self._transaction() as conn:
            return cast(int, conn.execute(_FENCE, (pipeline, holder)).fetchone()[0])

    def _claim(self, fd: int, pipeline: str, holder: str, epoch: int) -> LeaseRow:
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode("utf-8"), 0)
        with self._lock, self._transaction() as conn:
            claimed = conn.execute(f"UPDATE {_N['pipelines']} SET lease_holder = ?, updated_at = {_NOW} "
                                   "WHERE pipeline_name = ? AND lease_epoch = ?", (holder, pipeline, epoch)).rowcount
            return None if claimed else conn.execute(_LEASE_ROW, (pipeline,)).fetchone()

    def release_lease(self, pipeline: str) -> None:
        with self._lock:
            lease = self._leases.pop(pipeline, None)
            self._epochs.pop(pipeline, None)
            if lease is None:
                return
            try:
                if self._conn is not None:  # a taker's text stays
                    with self._errors("releasing the lease", pipeline), self._transaction() as conn:
                        conn.execute(f"UPDATE {_N['pipelines']} SET lease_holder = NULL "
                                     "WHERE pipeline_name = ? AND lease_holder = ?", (pipeline, lease[1]))
            finally:
                self._unlock(lease[0], clear=True)

    def lease_holder(self, pipeline: str) -> str | None:
        with self._lock:
            if pipeline in self._leases:
                return self._leases[pipeline][1]
            fd, other = self._try_lock(pipeline, create=False)
            if fd is not None:
                self._unlock(fd)
                return None
            if other is None and not self.lock_path(pipeline).exists():
                return None
            return other or "another process (holder text not written yet)"

    def lease_epoch(self, pipeline: str) -> int | None:
        return self._epochs.get(pipeline)

    def _check_fence(self, conn: sqlite3.Connection, pipeline: str, undone: str, batch: int | None = None) -> None:
        """First thing in a write transaction of the holder (see the module's docstring)."""
        if pipeline in self._epochs:
            check_fence(pipeline, self.description, self._epochs[pipeline],
                        conn.execute(_LEASE_ROW, (pipeline,)).fetchone(), undone, batch)

    @contextmanager
    def _writer(self, pipeline: str) -> Iterator[None]:
        """Hold the pipeline's lock while writing: ours for the run, or taken just for this write."""
        if pipeline in self._leases:
            yield
            return
        fd, other = self._try_lock(pipeline)
        if fd is None:
            raise lease_held(pipeline, self.description, other)
        try:
            yield
        finally:
            self._unlock(fd)

    # ---- data ------------------------------------------------------------------------------------

    def load(self, pipeline: str, groups: bool = True) -> RecoveredState:
        with self._lock, self._errors("loading state", pipeline):
            conn = self._db()
            conn.execute("BEGIN")  # one read snapshot for the record, the offsets and the groups
            try:
                row = conn.execute(f"SELECT {_PIPELINE_COLUMNS} FROM {_N['pipelines']} WHERE pipeline_name = ?",
                                   (pipeline,)).fetchone()
                if row is None or row[0] is None:  # no row, or only a lease marker: never committed
                    return RecoveredState(record=None)
                offsets = dict(conn.execute(f"SELECT source_id, offset_json FROM {_N['offsets']} "
                                            "WHERE pipeline_name = ?", (pipeline,)).fetchall())
                rows, flags, written, segments = [], {}, {}, []
                if groups:
                    with gc_paused():
                        rows = conn.execute(_GROUPS, (pipeline,)).fetchall()
                    flags = {(start, key): bool(flag) for start, key, flag in conn.execute(_FLAGS, (pipeline,))}
                    written = {(start, key): kept for start, key, kept in conn.execute(_WRITTEN, (pipeline,))}
                    segments = segment_rows.sqlite_load(conn, pipeline)
            finally:
                conn.execute("COMMIT")
        record = record_from_row(pipeline, row, offsets, self.description)
        check_record_version(record, self.description)
        rows = expand_windows(pipeline, self.description, rows)
        rows, migrated = bring_forward(pipeline, self.description, fill_window_ends(rows, record))
        return RecoveredState(record=record, groups=rows, migrated=migrated, emitted=flags, written=written,
                              segments=segments)

    def commit(self, batch: BatchCommit) -> None:
        check_batch(batch)
        record = batch.record
        pipeline = record.pipeline
        with self._lock, self._errors("committing a batch", pipeline), self._writer(pipeline):
            with self._transaction() as conn:
                self._check_fence(conn, pipeline, not_committed(batch), record.last_batch_id)
                now = conn.execute(f"SELECT {_NOW}").fetchone()[0]
                segment_rows.sqlite_drop(conn, batch)
                segment_rows.sqlite_append(conn, batch)
                pending.sqlite_commit(conn, batch, self.description)
                record.output_watermark = output_watermark(record.releasing_watermark,
                                                           pending.sqlite_oldest(conn, pipeline))
                conn.execute(f"DELETE FROM {_N['offsets']} WHERE pipeline_name = ?", (pipeline,))
                if record.offsets:
                    conn.executemany(
                        f"INSERT INTO {_N['offsets']} (pipeline_name, source_id, batch_id, offset_json, state_version, "
                        "updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                        [(pipeline, source, record.last_batch_id if record.last_batch_id is not None else -1,
                          offset, record.state_version, now) for source, offset in record.offsets.items()])
                holder = self._leases.get(pipeline, (None, None))[1]
                conn.execute(
                    _PIPELINE_UPSERT,
                    (pipeline, record.state_version, record.query_id, record.last_batch_id, record.fingerprint,
                     json.dumps(record.fingerprint_doc), record.watermark, sources_to_json(record.sources),
                     json.dumps(record.counters), holder,
                     int(bool(record.pending_migration)), record.trigger_fired_at, record.release_watermark,
                     record.last_batch_rows, record.output_watermark, now))
                for callback in batch.in_transaction:
                    callback(conn)

    def load_pending(self, pipeline: str, up_to_release_us: int, limit: int | None = None) -> list[PendingRow]:
        pending.check_load(up_to_release_us, limit)
        with self._lock, self._errors("loading pending rows", pipeline):
            return pending.sqlite_load(self._db(), pipeline, up_to_release_us, limit)

    def pending_summary(self, pipeline: str) -> PendingSummary:
        with self._lock, self._errors("summing up pending rows", pipeline):
            return pending.sqlite_summary(self._db(), pipeline)

    def reset(self, pipeline: str) -> int:
        with self._lock, self._errors("resetting state", pipeline), self._writer(pipeline):
            with self._transaction() as conn:
                self._check_fence(conn, pipeline, "the reset was not done")
                stored = conn.execute(_LEASE_ROW, (pipeline,)).fetchone()
                epoch = self._epochs.get(pipeline, stored[0] if stored else 0)
                for table in ("state", "offsets", "pipelines"):
                    conn.execute(f"DELETE FROM {_N[table]} WHERE pipeline_name = ?", (pipeline,))
                discarded = pending.sqlite_discard(conn, pipeline)
                segment_rows.sqlite_discard(conn, pipeline)
                if pipeline in self._leases or epoch:  # keep showing who holds the lease; an epoch never goes back
                    holder = self._leases[pipeline][1] if pipeline in self._leases else None
                    conn.execute(f"INSERT INTO {_N['pipelines']} (pipeline_name, lease_holder, lease_epoch, "
                                 f"updated_at) VALUES (?, ?, ?, {_NOW})", (pipeline, holder, epoch))
                return discarded

    def migrate_state(self, pipeline: str) -> int:
        with self._lock, self._errors("migrating state", pipeline), self._writer(pipeline):
            with self._transaction() as conn:
                self._check_fence(conn, pipeline, "the migration was not done")
                rows = conn.execute(_GROUPS + " AND state_version <> ?", (pipeline, codec.STATE_VERSION)).fetchall()
                rows, migrated = bring_forward_stored(pipeline, self.description, rows)
                now = conn.execute(f"SELECT {_NOW}").fetchone()[0]
                conn.executemany(_REWRITE, [(blob, blob[0], now, pipeline, start, key) for start, _, key, blob in rows])
                return migrated

    def close(self) -> None:
        with self._lock:
            for pipeline in list(self._leases):
                try:
                    self.release_lease(pipeline)
                except Exception:  # noqa: BLE001 - closing must free every lock even when the DB fails
                    pass
            if self._conn is not None:
                self._conn.close()
                self._conn = None


__all__ = ["SqliteStateStore"]
