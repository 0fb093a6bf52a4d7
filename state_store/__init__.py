"""Durable window state: in-memory, SQLite (the embedded default) and PostgreSQL stores.

A store keeps, per pipeline, the window state (one row per (window start, group key) holding the
window's end and the encoded accumulators), the source offsets of the last committed micro-batch
and one pipeline row (batch id, query id, fingerprint, watermarks, counters, lease holder). A
micro-batch commits all of it in one transaction (``StateStore.commit``), so after a crash the
store is at batch N or N-1, never in between. ``state_store.codec`` encodes keys and
accumulators (versioned, no pickle).

Decisions shared by the three stores:

* Within a commit, upserts apply first, then deletes by key, then whole deleted windows: a group
  both updated and deleted in one batch ends deleted; the last upsert of a key wins. The record's
  offsets replace the pipeline's previous offsets. ``in_transaction`` callbacks run last, inside
  the transaction, with the connection (psycopg ``Connection`` / ``sqlite3.Connection`` / ``None``
  in memory); an exception in one rolls everything back; a callback must not commit itself.
* ``load`` reads the record, offsets and groups in one snapshot and returns groups as
  ``(window_start, window_end, key bytes, blob bytes)`` (decode them with
  ``loaded_groups.decode_groups``; the caller checks the ends against its window kind). Blobs of an older state version are
  migrated in memory on load and are *not* written back (a load needs no lease, and the
  ``state`` command only reads); ``RecoveredState.migrated`` counts them. They turn current as
  soon as a commit rewrites them, or all at once with ``migrate_state`` (the migration job). A
  blob whose version byte is invalid (CorruptState) or newer than the code (StateVersionError)
  fails the load, naming the pipeline; a body that does not decode fails in
  ``loaded_groups.decode_groups``.
* Leases: one writer per pipeline. The holder text is the caller's (``make_holder(label)`` gives
  ``host=<host> pid=<pid> run=<label> since=<UTC>``); ``LeaseHeld`` carries it in its message and
  in ``.holder``. A store object that writes (commit / reset / migrate_state) without holding the
  lease takes it for the duration of that write, so it never writes while another run holds it.
  ``acquire_lease`` by the current holder only updates the text; ``close`` releases every lease.
* Every upsert writes the row's ``emitted`` flag (schema step 5) from ``BatchCommit.emitted``:
  true/false for a session window, NULL (no entry) for a fixed window; ``load`` returns the
  non-NULL flags in ``RecoveredState.emitted``, read in the same snapshot as the groups, and
  ``migrate_state`` keeps them.
* Likewise every upsert writes the row's last written row (``written_row``, schema step 6) from
  ``BatchCommit.written``: an opaque engine blob, NULL without an entry (so an upsert that drops it
  forgets it, and a delete removes it with its row); ``load`` returns the non-NULL ones in
  ``RecoveredState.written``. Whole-window rows never carry one. The pipeline row carries the
  interval trigger's last firing, ``PipelineRecord.trigger_fired_at`` (µs, None before any).
* Pending rows (schema step 7, ``WATERMARK_TS()``): ``BatchCommit.pending_inserts``,
  ``pending_released`` (by key) and ``pending_released_up_to`` (by release time) commit with the batch; ``load_pending`` reads only the rows due, in release
  order, and ``pending_summary`` their count, bytes, next release and smallest event time, never
  their values; ``reset`` deletes them too and returns how many it discarded
  (``state_store.pending`` has the rules). SQLite files the store creates are mode 0600
  (``state_store.private_files``).
* A row in the pipelines table whose ``state_version`` is NULL is a lease marker written by
  ``acquire_lease`` before the first commit: ``load`` reports such a pipeline as never committed.

>>> from state_store import create_store
>>> create_store("in_memory").kind
'in_memory'
"""

from __future__ import annotations

from state_store.base import (
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
        from state_store.postgres import PostgresStateStore

        if not url:
            raise ValueError("a postgres state store needs a url")
        return PostgresStateStore(url, schema or "ematix")
    raise ValueError(f"unknown state store kind {kind!r} (use in_memory, sqlite or postgres)")


__all__ = ["BatchCommit", "PendingRow", "PendingSummary", "PipelineRecord", "RecoveredState", "SourceProgress",
           "StateStore", "create_store", "make_holder"]
