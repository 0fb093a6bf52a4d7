"""Durable window state: in-memory, SQLite (the embedded default) and PostgreSQL stores.

A store keeps, per pipeline, the window state as segments (schema step 8: ordered blobs of many
groups' changes as columns, ``state_store.segments``), the source offsets of the last committed
micro-batch, the pending rows of ``WATERMARK_TS()`` and one pipeline row (batch id, query id,
fingerprint, watermarks, counters, lease holder). A micro-batch commits all of it in one
transaction (``StateStore.commit``), so after a crash the store is at batch N or N-1, never in
between. ``state_store.codec`` encodes keys and accumulators (versioned, no pickle).

Stores written at schema 7 or older also hold state rows, one per (window start, group key)
holding the window's end and the encoded accumulators (or one per whole window). Commits never
write rows; stores read them on load, rewrite their older-version blobs (``migrate_state``) and
delete them (``reset``, and a rebase, the engine's migration from rows to segments).

Decisions shared by the three stores:

* Within a commit, a rebase's deletes apply first, then the segments are appended in order. The
  record's offsets replace the pipeline's previous offsets. ``in_transaction`` callbacks run last,
  inside the transaction, with the connection (psycopg ``Connection`` / ``sqlite3.Connection`` /
  ``None`` in memory); an exception in one rolls everything back; a callback must not commit itself.
* ``load`` reads the record, offsets, state rows and segments in one snapshot and returns rows as
  ``(window_start, window_end, key bytes, blob bytes)``, one per group (decode them with
  ``loaded_groups.decode_groups``; the caller checks the ends against its window kind). Blobs of an
  older state version are migrated in memory on load and are *not* written back (a load needs no
  lease, and the ``state`` command only reads); ``RecoveredState.migrated`` counts them. They turn
  current all at once with ``migrate_state`` (the migration job), or when the engine's first
  commit after loading rows rebases them into a segment. A blob whose version byte is invalid
  (CorruptState) or newer than the code (StateVersionError) fails the load, naming the pipeline; a
  body that does not decode fails in ``loaded_groups.decode_groups``.
* Leases: one writer per pipeline. The holder text is the caller's (``make_holder(label)`` gives
  ``host=<host> pid=<pid> run=<label> since=<UTC>``); ``LeaseHeld`` carries it in its message and
  in ``.holder``. A store object that writes (commit / reset / migrate_state) without holding the
  lease takes it for the duration of that write, so it never writes while another run holds it.
  ``acquire_lease`` by the current holder only updates the text; ``close`` releases every lease.
* A lock outlives a run that was given up while its process lives on, so each acquisition also
  raises the pipeline's lease epoch (schema step 10) and the holder's writes check it in their own
  transaction: a replacement run may take the lease over (``acquire_lease(..., take_over=...)``),
  which raises the epoch at once, and the old holder's next commit rolls back whole with
  ``LeaseLost`` (a ``LeaseHeld``) instead of writing after it; ``reset`` keeps the epoch.
* A stored row's ``emitted`` flag (schema step 5, sessions; NULL for a fixed window) and its last
  written row (``written_row``, schema step 6, NULL when none was kept, never on a whole-window
  row) are loaded in the same snapshot as the rows: ``RecoveredState.emitted`` and
  ``RecoveredState.written`` hold the non-NULL ones, and ``migrate_state`` leaves them as they
  are. The pipeline row carries the interval trigger's last firing,
  ``PipelineRecord.trigger_fired_at`` (µs, None before any).
* Pending rows (schema step 7, ``WATERMARK_TS()``): ``BatchCommit.pending_inserts``,
  ``pending_released`` (by key) and ``pending_released_up_to`` (by release time) commit with the
  batch; ``load_pending`` reads only the rows due, in release order, and ``pending_summary`` their
  count, bytes, next release and smallest event time, never their values; ``reset`` deletes them
  too and returns how many it discarded (``state_store.pending`` has the rules). SQLite files the
  store creates are mode 0600 (``state_store.private_files``).
* A row in the pipelines table whose ``state_version`` is NULL is a lease marker written by
  ``acquire_lease`` before the first commit: ``load`` reports such a pipeline as never committed.

>>> from state_store import create_store
>>> create_store("in_memory").kind
'in_memory'
"""

from __future__ import annotations

from state_store.contract import (
    BatchCommit,
    PendingRow,
    PendingSummary,
    PipelineRecord,
    RecoveredState,
    SourceProgress,
    StateStore,
    make_holder,
)


def create_store(kind: str, *, path: str | None = None, url: str | None = None, schema: str | None = None,
                 name: str = "default") -> StateStore:
    """The store for a ``[state_store]`` block (not opened yet): ``in_memory`` | ``sqlite`` | ``postgres``."""
    if kind == "in_memory":
        from state_store.memory import InMemoryStateStore

        return InMemoryStateStore(name)
    if kind == "sqlite":
        from state_store.sqlite import SqliteStateStore

        if not path:
            raise ValueError("a sqlite state store needs a path")
        return SqliteStateStore(path)
    if kind == "postgres":
        from state_store.postgres_store import PostgresStateStore

        if not url:
            raise ValueError("a postgres state store needs a url")
        return PostgresStateStore(url, schema or "ematix")
    raise ValueError(f"unknown state store kind {kind!r} (use in_memory, sqlite or postgres)")


__all__ = ["BatchCommit", "PendingRow", "PendingSummary", "PipelineRecord", "RecoveredState", "SourceProgress",
           "StateStore", "create_store", "make_holder"]
