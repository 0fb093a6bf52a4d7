"""Pending rows (schema step 7, ``WATERMARK_TS()``): a commit's checks, and the SQL of both databases.

A pending row is an output row held back until the watermark reaches its release time
(``state_store.contract.PendingRow``), keyed by ``(release_us, arrival_batch, seq)``, the release
order (``state_store.migrations``, step 7). Decisions shared by the three stores:

* A commit inserts ``BatchCommit.pending_inserts``, then deletes ``BatchCommit.pending_released``
  by key and every row with ``release_us <= BatchCommit.pending_released_up_to``, in the batch's
  transaction, before the ``in_transaction`` callbacks.
* Re-inserting a stored row is a no-op when the row is identical (same event time and payload:
  ``ON CONFLICT DO NOTHING``, then a check), because a replayed batch recomputes the rows it
  computed before and commits them again. The same key with another event time or payload means
  the replay did not recompute the same rows (a transform that is not deterministic, or state of
  other code): ``CorruptState``, and nothing of the commit is written.
* Releasing a key that is not stored is a no-op, like deleting a group that is not stored: a
  replayed batch releases rows its first commit already deleted.
* A key inserted twice, or released twice, in one commit, and a key both inserted and released
  (a row released in the batch it arrived in is written out, never stored; so is an insert the
  range release would delete) are refused with a ``TypeError`` before anything is written, like
  ``check_batch``'s other checks.
* Nothing here logs, prints or puts into an error message a payload: pending rows are not public
  yet. Messages name a row by its key only.
"""

from __future__ import annotations

import sqlite3
from operator import attrgetter, itemgetter
from typing import Any, Sequence

import psycopg
from psycopg import sql

from state_store.contract import BatchCommit, PendingRow, PendingSummary
from state_store.errors import RESTORE_OR_RESET, CorruptState
from state_store.migrations import sqlite_names

_INT64 = (-(2**63), 2**63 - 1)
#: each field's type and range: bigint columns, and ``seq`` an integer (int4) from 0
_FIELDS = {"release_us": _INT64, "arrival_batch": (0, _INT64[1]), "seq": (0, 2**31 - 1), "event_ts": _INT64}
_KEY_FIELDS = ("release_us", "arrival_batch", "seq")


# ---- checks --------------------------------------------------------------------------------------


def _field_problem(row: Any) -> str | None:
    """What is wrong with one pending insert (never showing its payload), None when nothing is."""
    if type(row) is not PendingRow:
        return f"a pending insert must be a PendingRow, got a {type(row).__name__}"
    for name, (low, high) in _FIELDS.items():
        value = getattr(row, name)
        if value is None and name == "event_ts":
            continue
        if type(value) is not int or not low <= value <= high:
            return (f"pending row {_key_text(row)}: {name} must be an int from {low} to {high}"
                    f"{' or None' if name == 'event_ts' else ''}, got {value!r:.40}")
    if type(row.payload) is not bytes:
        return f"pending row {_key_text(row)}: payload must be bytes, got a {type(row.payload).__name__}"
    return None


def _key_text(row: Any) -> str:
    parts = (getattr(row, name, None) for name in _KEY_FIELDS)
    return "(" + ", ".join(f"{name}={value!r:.40}" for name, value in zip(_KEY_FIELDS, parts)) + ")"


def _fields_plain(rows: list) -> bool:
    """Whether every insert is a well-typed PendingRow in range, checked column by column at C speed."""
    if set(map(type, rows)) != {PendingRow}:
        return False
    for name, (low, high) in _FIELDS.items():
        values = list(map(attrgetter(name), rows))
        if name == "event_ts":
            values = [v for v in values if v is not None]
            if not values:
                continue
        if set(map(type, values)) != {int} or min(values) < low or max(values) > high:
            return False
    return set(map(type, map(attrgetter("payload"), rows))) == {bytes}


def _keys_plain(keys: list) -> bool:
    """Whether every released key is a tuple of three ints in range, checked column by column at C speed."""
    if set(map(type, keys)) != {tuple} or set(map(len, keys)) != {3}:
        return False
    for i, name in enumerate(_KEY_FIELDS):
        values = list(map(itemgetter(i), keys))
        low, high = _FIELDS[name]
        if set(map(type, values)) != {int} or min(values) < low or max(values) > high:
            return False
    return True


def check_pending(batch: BatchCommit) -> None:
    """The pending lists of a commit (``state_store._common.check_batch`` calls it); see the module's rules."""
    rows, released = batch.pending_inserts, batch.pending_released
    if type(rows) is not list or type(released) is not list:
        raise TypeError("BatchCommit.pending_inserts and pending_released must be lists")
    if rows and not _fields_plain(rows):
        problem = next(p for p in map(_field_problem, rows) if p is not None)
        raise TypeError(problem)
    if released and not _keys_plain(released):
        for key in released:
            if (type(key) is not tuple or len(key) != 3 or any(type(v) is not int for v in key)
                    or not all(_FIELDS[name][0] <= v <= _FIELDS[name][1] for name, v in zip(_KEY_FIELDS, key))):
                raise TypeError("a released pending row must be named by its key (int release_us, int "
                                f"arrival_batch, int seq) in range, got {key!r:.120}")
    inserted = set(map(attrgetter(*_KEY_FIELDS), rows))
    if len(inserted) != len(rows):
        raise TypeError(f"pending row {_key_text(_first_repeat(rows, attrgetter('key')))} is inserted twice in "
                        "one commit")
    if len(set(released)) != len(released):
        release_us, arrival_batch, seq = _first_repeat(released, lambda key: key)
        raise TypeError(f"pending row (release_us={release_us}, arrival_batch={arrival_batch}, seq={seq}) is "
                        "released twice in one commit")
    up_to = batch.pending_released_up_to
    if up_to is not None:
        if type(up_to) is not int or not _INT64[0] <= up_to <= _INT64[1]:
            raise TypeError(f"pending_released_up_to must be None or an int (µs) in the bigint range, got {up_to!r:.40}")
        if rows and min(map(attrgetter("release_us"), rows)) <= up_to:
            early = min(row.key for row in rows if row.release_us <= up_to)
            release_us, arrival_batch, seq = early
            raise TypeError(f"pending row (release_us={release_us}, arrival_batch={arrival_batch}, seq={seq}) is "
                            f"inserted by a commit that releases every row up to {up_to}: a row released in the "
                            "batch it arrived in is written out, never stored")
    both = inserted.intersection(released)
    if both:
        release_us, arrival_batch, seq = min(both)
        raise TypeError(f"pending row (release_us={release_us}, arrival_batch={arrival_batch}, seq={seq}) is both "
                        "inserted and released in one commit: a row released in the batch it arrived in is "
                        "written out, never stored")


def _first_repeat(items: Sequence[Any], key_of: Any) -> Any:
    seen = set()
    for item in items:
        key = key_of(item)
        if key in seen:
            return item
        seen.add(key)
    raise AssertionError("no repeated key")


def check_load(up_to_release_us: Any, limit: Any) -> None:
    """``load_pending``'s arguments: an int bound in the bigint range; None or an int limit from 0."""
    if type(up_to_release_us) is not int or not _INT64[0] <= up_to_release_us <= _INT64[1]:
        raise TypeError(f"up_to_release_us must be an int (µs) in the bigint range, got {up_to_release_us!r:.40}")
    if limit is not None and (type(limit) is not int or limit < 0):
        raise TypeError(f"limit must be None or an int from 0, got {limit!r:.40}")


def conflict(pipeline: str, store: str, key: tuple[int, int, int]) -> CorruptState:
    """A re-inserted key whose stored row differs (the payloads are not shown)."""
    release_us, arrival_batch, seq = key
    return CorruptState(
        f"pipeline {pipeline!r} in {store}: pending row (release_us={release_us}, arrival_batch={arrival_batch}, "
        f"seq={seq}) is stored already with another event time or payload, so a replayed batch did not recompute "
        "the rows it computed before (a transform that is not deterministic, or state written by other code); "
        "nothing of the batch was written", way_out=RESTORE_OR_RESET)


# ---- statements both databases run (%s placeholders: SQLite's become ?) ---------------------------

_COLUMNS = "release_us, arrival_batch, seq, event_ts, payload"
#: the rows due, in release order; LIMIT NULL (PostgreSQL) and LIMIT -1 (SQLite) mean no limit
_LOAD = (f"SELECT {_COLUMNS} FROM {{pending}} WHERE pipeline_name = %s AND release_us <= %s "
         "ORDER BY release_us, arrival_batch, seq LIMIT %s")
#: the smallest event time, the event-time index's first entry (step 7; the committed output
#: watermark's input)
_OLDEST = "SELECT event_ts FROM {pending} WHERE pipeline_name = %s AND event_ts IS NOT NULL ORDER BY event_ts LIMIT 1"
#: one statement, so one snapshot: count and bytes scan the pipeline's key range (length() reads a
#: blob's size, not its bytes), the next release is the key's first entry, then :data:`_OLDEST`
_SUMMARY = ("SELECT count(*), coalesce(sum(length(payload)), 0), "
            "(SELECT release_us FROM {pending} WHERE pipeline_name = %s ORDER BY release_us LIMIT 1), "
            "(" + _OLDEST + ") FROM {pending} WHERE pipeline_name = %s")
_DISCARD = "DELETE FROM {pending} WHERE pipeline_name = %s"
_RELEASE_UP_TO = "DELETE FROM {pending} WHERE pipeline_name = %s AND release_us <= %s"


def _rows(fetched: Any) -> list[PendingRow]:
    """Both drivers return a bytea / BLOB as ``bytes``: the fetched tuples are the rows."""
    return list(map(PendingRow._make, fetched))


# ---- SQLite --------------------------------------------------------------------------------------


def _sqlite(text: str) -> str:
    return text.replace("%s", "?").format(**sqlite_names())


_KEY_MATCH = "pipeline_name = ? AND release_us = ? AND arrival_batch = ? AND seq = ?"
_SQ_INSERT = _sqlite(f"INSERT INTO {{pending}} (pipeline_name, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) "
                     "ON CONFLICT (pipeline_name, release_us, arrival_batch, seq) DO NOTHING")
_SQ_STORED = _sqlite(f"SELECT event_ts, payload FROM {{pending}} WHERE {_KEY_MATCH}")
_SQ_RELEASE = _sqlite(f"DELETE FROM {{pending}} WHERE {_KEY_MATCH}")
_SQ_LOAD, _SQ_SUMMARY, _SQ_OLDEST, _SQ_DISCARD, _SQ_RELEASE_UP_TO = map(
    _sqlite, (_LOAD, _SUMMARY, _OLDEST, _DISCARD, _RELEASE_UP_TO))


def sqlite_commit(conn: sqlite3.Connection, batch: BatchCommit, store: str) -> None:
    """The batch's pending inserts and releases, inside the caller's transaction."""
    pipeline, rows = batch.record.pipeline, batch.pending_inserts
    if rows:
        added = conn.executemany(_SQ_INSERT, ((pipeline, r.release_us, r.arrival_batch, r.seq, r.event_ts, r.payload)
                                              for r in rows)).rowcount
        if added < len(rows):  # some were stored already (a replay): each must be the same row
            for r in rows:
                if conn.execute(_SQ_STORED, (pipeline, *r.key)).fetchone() != (r.event_ts, r.payload):
                    raise conflict(pipeline, store, r.key)
    if batch.pending_released:
        conn.executemany(_SQ_RELEASE, ((pipeline, *key) for key in batch.pending_released))
    if batch.pending_released_up_to is not None:
        conn.execute(_SQ_RELEASE_UP_TO, (pipeline, batch.pending_released_up_to))


def sqlite_oldest(conn: sqlite3.Connection, pipeline: str) -> int | None:
    """The smallest event time among the pipeline's pending rows (None: none has one), in the caller's snapshot."""
    row = conn.execute(_SQ_OLDEST, (pipeline,)).fetchone()
    return None if row is None else row[0]


def sqlite_load(conn: sqlite3.Connection, pipeline: str, up_to_release_us: int, limit: int | None
                ) -> list[PendingRow]:
    return _rows(conn.execute(_SQ_LOAD, (pipeline, up_to_release_us, -1 if limit is None else limit)))


def sqlite_summary(conn: sqlite3.Connection, pipeline: str) -> PendingSummary:
    return PendingSummary(*conn.execute(_SQ_SUMMARY, (pipeline,) * 3).fetchone())


def sqlite_discard(conn: sqlite3.Connection, pipeline: str) -> int:
    """Delete the pipeline's pending rows (``reset``, in its transaction); how many there were."""
    return conn.execute(_SQ_DISCARD, (pipeline,)).rowcount


# ---- PostgreSQL ----------------------------------------------------------------------------------

#: the batch's rows as columns (arrays), so a batch is one statement whatever its size: the integers
#: as array literals (``_int_array``), the payloads sent binary (%b)
_UNNEST = ("unnest(%s::bigint[], %s::bigint[], %s::integer[], %s::bigint[], %b::bytea[]) "
           "AS d(release_us, arrival_batch, seq, event_ts, payload)")
_PG_INSERT = (f"INSERT INTO {{pending}} (pipeline_name, {_COLUMNS}) SELECT %s, {_COLUMNS} FROM {_UNNEST} "
              "ON CONFLICT (pipeline_name, release_us, arrival_batch, seq) DO NOTHING")
#: after the insert: a key of the batch stored with another row (its own rows match themselves)
_PG_CONFLICT = (f"SELECT d.release_us, d.arrival_batch, d.seq FROM {_UNNEST} JOIN {{pending}} AS p "
                "ON p.pipeline_name = %s AND p.release_us = d.release_us AND p.arrival_batch = d.arrival_batch "
                "AND p.seq = d.seq WHERE p.payload <> d.payload OR p.event_ts IS DISTINCT FROM d.event_ts "
                "ORDER BY 1, 2, 3 LIMIT 1")
_PG_RELEASE = ("DELETE FROM {pending} AS p USING unnest(%b::bigint[], %b::bigint[], %b::integer[]) "
               "AS d(release_us, arrival_batch, seq) WHERE p.pipeline_name = %s AND p.release_us = d.release_us "
               "AND p.arrival_batch = d.arrival_batch AND p.seq = d.seq")


def _int_array(values: list[int | None]) -> str:
    """An array literal of checked integers: joined at C speed, where psycopg's array dumper
    handles one element at a time in Python."""
    if None in values:
        return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"
    return "{" + ",".join(map(str, values)) + "}"


def pg_commit(conn: psycopg.Connection, names: dict, batch: BatchCommit, store: str) -> None:
    """The batch's pending inserts and releases, inside the caller's transaction."""
    pipeline, rows = batch.record.pipeline, batch.pending_inserts
    if rows:
        columns: list[Any] = [_int_array(list(map(attrgetter(name), rows))) for name in (*_KEY_FIELDS, "event_ts")]
        columns.append(list(map(attrgetter("payload"), rows)))
        added = conn.execute(sql.SQL(_PG_INSERT).format(**names), (pipeline, *columns)).rowcount
        if added < len(rows):  # some were stored already (a replay): each must be the same row
            bad = conn.execute(sql.SQL(_PG_CONFLICT).format(**names), (*columns, pipeline)).fetchone()
            if bad is not None:
                raise conflict(pipeline, store, bad)
    if batch.pending_released:
        keys = [list(column) for column in zip(*batch.pending_released)]
        conn.execute(sql.SQL(_PG_RELEASE).format(**names), (*keys, pipeline))
    if batch.pending_released_up_to is not None:
        conn.execute(sql.SQL(_RELEASE_UP_TO).format(**names), (pipeline, batch.pending_released_up_to))


def pg_oldest(conn: psycopg.Connection, names: dict, pipeline: str) -> int | None:
    """:func:`sqlite_oldest` of a PostgreSQL store."""
    row = conn.execute(sql.SQL(_OLDEST).format(**names), (pipeline,)).fetchone()
    return None if row is None else row[0]


def pg_load(conn: psycopg.Connection, names: dict, pipeline: str, up_to_release_us: int, limit: int | None
            ) -> list[PendingRow]:
    cur = conn.cursor(binary=True)
    return _rows(cur.execute(sql.SQL(_LOAD).format(**names), (pipeline, up_to_release_us, limit)).fetchall())


def pg_summary(conn: psycopg.Connection, names: dict, pipeline: str) -> PendingSummary:
    row = conn.execute(sql.SQL(_SUMMARY).format(**names), (pipeline,) * 3).fetchone()
    assert row is not None  # an aggregate returns one row
    return PendingSummary(*row)


def pg_discard(conn: psycopg.Connection, names: dict, pipeline: str) -> int:
    """Delete the pipeline's pending rows (``reset``, in its transaction); how many there were."""
    return conn.execute(sql.SQL(_DISCARD).format(**names), (pipeline,)).rowcount


__all__ = ["check_load", "check_pending", "conflict", "pg_commit", "pg_discard", "pg_load", "pg_oldest", "pg_summary",
           "sqlite_commit", "sqlite_discard", "sqlite_load", "sqlite_oldest", "sqlite_summary"]
