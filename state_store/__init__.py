"""Durable window state: in-memory, SQLite (the embedded default) and PostgreSQL stores.

A store keeps, per pipeline, the window state (one row per (window start, group key) holding the
encoded accumulators), the source offsets of the last committed micro-batch and one pipeline row
(batch id, query id, fingerprint, watermarks, counters, lease holder). A micro-batch commits all
of it in one transaction (``StateStore.commit``), so after a crash the store is at batch N or
N-1, never in between. ``state_store.codec`` encodes keys and accumulators (versioned, no pickle).

>>> from state_store import create_store
>>> create_store("in_memory").kind
'in_memory'
"""

from __future__ import annotations

from state_store.base import (BatchCommit, PipelineRecord, RecoveredState, SourceProgress, StateStore,
                              make_holder)


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


__all__ = ["BatchCommit", "PipelineRecord", "RecoveredState", "SourceProgress", "StateStore", "create_store",
           "make_holder"]
