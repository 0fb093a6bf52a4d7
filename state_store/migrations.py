"""Schema migrations of the store's tables: ordered steps, each in its own transaction.

Every applied step is a row of ``ematix_streaming_schema_version`` (version, description,
applied_at); the schema's version is the highest row. ``open()`` applies the missing steps in
order, each under a lock (a transaction-level advisory lock on PostgreSQL, ``BEGIN IMMEDIATE`` on
SQLite) and after re-reading the version, so two processes opening the same store at once apply
each step exactly once. A store whose schema is newer than this code is refused with
``StateVersionError``. When the schema is already current nothing is created or locked, so a role
without CREATE privileges can use tables an administrator created (or migrated) for it.

Steps are append-only: a released step is never edited, a change is a new step.
State *blobs* are versioned separately (``state_store.codec.STATE_VERSION``).

Step 3 (``window_end``): a stored window is named by its bounds, ``(pipeline, window_start,
window_end, group_key)`` in meaning, so window kinds whose end is not ``start + duration``
(session windows, docs/contract/windows.md) fit. Layout decision:

* ``window_end`` is a plain, nullable column; the PRIMARY KEY stays ``(pipeline_name,
  window_start, group_key)``. Uniqueness on start and key holds for every planned kind: tumbling,
  hopping and KIP-450 sliding windows have one fixed size, so the start fixes the end; a key's
  session windows never overlap, so no two share a start. A session that grows at its end (or
  absorbs a later one) rewrites its row's end in place with an upsert; one whose start moves
  earlier, or that is merged away, is a delete by (start, key) plus an upsert, as today.
  Keeping the key also avoids rebuilding the table (SQLite cannot alter a WITHOUT ROWID table's
  key or add a NOT NULL column without a default; PostgreSQL would rewrite the table and its
  index under an exclusive lock) on stores that hold millions of rows.
* Nullable because the column is added to existing rows. The step fills it in the same
  transaction from the pipeline row's stored spec: ``window_end = window_start +
  fingerprint_doc["window.duration_ms"] * 1000`` (µs; hopping windows have the duration as their
  size, not the hop). A row whose pipeline has no recorded duration keeps NULL and is filled when
  loaded (``state_store._common.fill_window_ends``), or by the engine from its window kind.
  Stores always write the end from this step on, so new rows are never NULL.

Step 4 drops the pipelines row's ``emitted`` list (window starts already emitted). It was rewritten
whole on every commit, which a kind with 100,000 open windows (sessions) cannot afford; a fixed
window's emission follows from its bounds and the committed watermark (see
``ematix_dagster.streaming.state.fixed``), and a kind whose windows can be emitted and still
change keeps that flag on its own rows.

Step 5 (``emitted``): that flag, a nullable boolean on every state row (SQLite: INTEGER 0/1).
Session windows under ``late_data = "reopen"`` (docs/contract/windows.md) need it: a late row can bridge an
emitted session with one still open, and the merged session counts as emitted although its end
is after the watermark, so a restart cannot derive the flag. Layout decision:

* Every upsert writes the column (``BatchCommit.emitted``, by (window_start, key)): true or false
  for a session, NULL for a fixed window, whose emission follows from its bounds and the committed
  watermark (step 4) and for which a stored flag could only drift from that rule. NULL therefore
  means "the window kind decides", never "unknown": a load returns the non-NULL flags only
  (``RecoveredState.emitted``).
* Nullable and without a default, so the step is a catalog change on both databases (no table
  rewrite, no lock held for longer than the ALTER). Session rows written before the step keep
  NULL: they were written under ``drop`` / ``dlq`` (reopen was refused for sessions then), where a
  session is emitted exactly when its end is before the committed watermark, and the engine
  derives the flag that way for a NULL (``Engine.restore``).
* Not in the key and not indexed: it is read with the row and written with the row.

Step 6 (``written_row``, ``trigger_fired_at``): what emission triggers and retractions need across
a restart (SPEC §10, docs/contract/emission.md: "each key's last written row and its emitted flag
are state, committed with the batch"; the interval trigger has "one timer per pipeline, stored
with the state"). Layout decision:

* ``written_row`` (bytea; SQLite: BLOB) on every state row: the last row written to the target for
  that (window_start, key), its window end and values, an opaque blob the engine encodes (a
  ``retract`` row repeats it exactly). It is kept only where the engine needs it (retractions,
  session windows); NULL means nothing kept. Like ``emitted`` it travels beside the groups, keyed
  by (window_start, key): every upsert writes the column (``BatchCommit.written``, NULL without an
  entry) and a load returns the non-NULL blobs (``RecoveredState.written``), in the same snapshot.
  Whole-window rows never carry one: the engine writes groups one by one when it keeps written
  rows. A delete removes it with its row; ``migrate_state`` (which rewrites older state blobs)
  leaves it as it is.
* ``trigger_fired_at`` (bigint; SQLite: INTEGER) on the pipelines row: the batch time (µs) of the
  interval emit trigger's last firing, NULL before any (only that trigger sets it). One value per
  pipeline, so it lives beside the watermark (``PipelineRecord.trigger_fired_at``) and is written
  with the record on every commit; a load refuses anything but an integer or NULL (CorruptState).
* Both nullable and without a default: catalog-only changes on both databases (no table rewrite,
  no lock held for longer than the ALTER). Rows and pipelines written before the step read as
  "nothing kept" and "never fired": no code kept either before it.

Step 7 (``ematix_streaming_pending``): rows delayed by ``WATERMARK_TS()`` (SPEC §11: "pending rows
live in the state store, one stored row each, indexed by release time, committed with the batch").
Layout decision:

* A table of its own, one row per pending output row: ``release_us``, ``arrival_batch``, ``seq``
  (the row's position in its arrival batch), ``event_ts`` (its ``_event_ts``, µs, NULL allowed) and
  ``payload`` (the row's values, an opaque engine blob). A pending row is no window group.
* PRIMARY KEY ``(pipeline_name, release_us, arrival_batch, seq)``, the release order's prefix
  ((release time, arrival batch, ``_event_ts``, values): within an arrival batch ``seq`` follows
  ``_event_ts`` and the values), so the rows due at W are one range scan read in order, and a
  release deletes by key. SQLite: WITHOUT ROWID and STRICT, like the state table.
* A partial index on ``(pipeline_name, event_ts) WHERE event_ts IS NOT NULL``: the output watermark
  needs the smallest pending ``_event_ts`` after every batch, a scan of every pending row without
  the index, one probe with it (SQLite, 50,000 rows: 6.7 ms -> 0.01 ms; inserting them cost the
  same, releasing half 50 ms instead of 28). Rows without an event time never lower the minimum,
  so they are left out. A new table: the step rewrites and locks nothing.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Sequence

from state_store.errors import StateVersionError
from state_store.names import (
    OFFSETS_TABLE,
    PENDING_EVENT_TS_INDEX,
    PENDING_TABLE,
    PIPELINES_TABLE,
    SCHEMA_VERSION_TABLE,
    STATE_TABLE,
    lease_key,
)


@dataclass(frozen=True)
class SchemaStep:
    version: int
    description: str
    #: psycopg.sql templates: {state} {offsets} {pipelines} {pending} are qualified, {pending_event_ts} is not
    postgres: tuple[str, ...]
    sqlite: tuple[str, ...]


STEPS: tuple[SchemaStep, ...] = (
    SchemaStep(
        1, "state, offsets and pipelines tables",
        postgres=(
            """CREATE TABLE {state} (
                pipeline_name text NOT NULL,
                window_start bigint NOT NULL,
                group_key bytea NOT NULL,
                state_blob bytea NOT NULL,
                state_version integer NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (pipeline_name, window_start, group_key))""",
            """CREATE TABLE {offsets} (
                pipeline_name text NOT NULL,
                source_id text NOT NULL,
                batch_id bigint NOT NULL,
                offset_json text NOT NULL,
                state_version integer NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (pipeline_name, source_id))""",
            """CREATE TABLE {pipelines} (
                pipeline_name text PRIMARY KEY,
                state_version integer,
                query_id text,
                last_batch_id bigint,
                fingerprint text,
                fingerprint_doc jsonb,
                watermark bigint,
                sources jsonb,
                counters jsonb,
                emitted jsonb,
                lease_holder text,
                pending_migration boolean NOT NULL DEFAULT false,
                updated_at timestamptz NOT NULL DEFAULT now())""",
        ),
        sqlite=(
            """CREATE TABLE {state} (
                pipeline_name TEXT NOT NULL,
                window_start INTEGER NOT NULL,
                group_key BLOB NOT NULL,
                state_blob BLOB NOT NULL,
                state_version INTEGER NOT NULL,
                updated_at TEXT NOT NULL,
                PRIMARY KEY (pipeline_name, window_start, group_key)) WITHOUT ROWID, STRICT""",
            """CREATE TABLE {offsets} (
                pipeline_name TEXT NOT NULL,
                source_id TEXT NOT NULL,
                batch_id INTEGER NOT NULL,
                offset_json TEXT NOT NULL,
                state_version INTEGER NOT NULL,
                updated_at TEXT NOT NULL,
                PRIMARY KEY (pipeline_name, source_id)) STRICT""",
            """CREATE TABLE {pipelines} (
                pipeline_name TEXT PRIMARY KEY,
                state_version INTEGER,
                query_id TEXT,
                last_batch_id INTEGER,
                fingerprint TEXT,
                fingerprint_doc TEXT,
                watermark INTEGER,
                sources TEXT,
                counters TEXT,
                emitted TEXT,
                lease_holder TEXT,
                pending_migration INTEGER NOT NULL DEFAULT 0,
                updated_at TEXT NOT NULL) STRICT""",
        ),
    ),
    SchemaStep(
        2, "state pages half empty (fillfactor 50): a rewritten group stays an in-page (HOT) update",
        postgres=("ALTER TABLE {state} SET (fillfactor = 50)",),
        sqlite=(),  # nothing to tune: SQLite rewrites the b-tree cell in place
    ),
    SchemaStep(
        3, "window_end on every state row (nullable, not in the key), filled from the stored window duration",
        postgres=(
            "ALTER TABLE {state} ADD COLUMN window_end bigint",
            """UPDATE {state} AS s
                SET window_end = s.window_start + 1000 * (p.fingerprint_doc ->> 'window.duration_ms')::bigint
                FROM {pipelines} AS p
                WHERE p.pipeline_name = s.pipeline_name AND s.window_end IS NULL
                  AND jsonb_typeof(p.fingerprint_doc -> 'window.duration_ms') = 'number'""",
        ),
        sqlite=(
            "ALTER TABLE {state} ADD COLUMN window_end INTEGER",
            """UPDATE {state} SET window_end = window_start + 1000 * (
                SELECT json_extract(p.fingerprint_doc, '$."window.duration_ms"') FROM {pipelines} AS p
                WHERE p.pipeline_name = {state}.pipeline_name
                  AND CASE WHEN json_valid(p.fingerprint_doc)
                      THEN json_type(p.fingerprint_doc, '$."window.duration_ms"') END = 'integer')
                WHERE window_end IS NULL""",
        ),
    ),
    SchemaStep(
        4, "no emitted list on the pipelines row: emission follows from each window's bounds and the watermark",
        postgres=("ALTER TABLE {pipelines} DROP COLUMN emitted",),
        sqlite=("ALTER TABLE {pipelines} DROP COLUMN emitted",),
    ),
    SchemaStep(
        5, "emitted flag on every state row (nullable): whether a session was written to the target",
        postgres=("ALTER TABLE {state} ADD COLUMN emitted boolean",),
        sqlite=("ALTER TABLE {state} ADD COLUMN emitted INTEGER",),
    ),
    SchemaStep(
        6, "written rows and the interval trigger's timer: last row written per state row, last firing per pipeline",
        postgres=("ALTER TABLE {state} ADD COLUMN written_row bytea",
                  "ALTER TABLE {pipelines} ADD COLUMN trigger_fired_at bigint"),
        sqlite=("ALTER TABLE {state} ADD COLUMN written_row BLOB",
                "ALTER TABLE {pipelines} ADD COLUMN trigger_fired_at INTEGER"),
    ),
    SchemaStep(
        7, "pending rows (WATERMARK_TS()): one row each, keyed in release order, indexed by event time",
        postgres=(
            """CREATE TABLE {pending} (
                pipeline_name text NOT NULL,
                release_us bigint NOT NULL,
                arrival_batch bigint NOT NULL,
                seq integer NOT NULL,
                event_ts bigint,
                payload bytea NOT NULL,
                PRIMARY KEY (pipeline_name, release_us, arrival_batch, seq))""",
            "CREATE INDEX {pending_event_ts} ON {pending} (pipeline_name, event_ts) WHERE event_ts IS NOT NULL",
        ),
        sqlite=(
            """CREATE TABLE {pending} (
                pipeline_name TEXT NOT NULL,
                release_us INTEGER NOT NULL,
                arrival_batch INTEGER NOT NULL,
                seq INTEGER NOT NULL,
                event_ts INTEGER,
                payload BLOB NOT NULL,
                PRIMARY KEY (pipeline_name, release_us, arrival_batch, seq)) WITHOUT ROWID, STRICT""",
            "CREATE INDEX {pending_event_ts} ON {pending} (pipeline_name, event_ts) WHERE event_ts IS NOT NULL",
        ),
    ),
)

SCHEMA_VERSION = STEPS[-1].version


def _newer(found: int, code: int, store: str) -> StateVersionError:
    return StateVersionError(
        f"{store}: schema version {found} is newer than this code ({code}); upgrade ematix-dagster")


def _check_steps(steps: Sequence[SchemaStep]) -> None:
    if [s.version for s in steps] != list(range(1, len(steps) + 1)):
        raise ValueError("schema steps must be numbered 1, 2, ... in order")


# ---- PostgreSQL --------------------------------------------------------------------------------


def postgres_names(schema: str) -> dict:
    from psycopg import sql

    return {
        "schema": sql.Identifier(schema),
        "state": sql.Identifier(schema, STATE_TABLE),
        "offsets": sql.Identifier(schema, OFFSETS_TABLE),
        "pipelines": sql.Identifier(schema, PIPELINES_TABLE),
        "schema_version": sql.Identifier(schema, SCHEMA_VERSION_TABLE),
        "pending": sql.Identifier(schema, PENDING_TABLE),
        "pending_event_ts": sql.Identifier(PENDING_EVENT_TS_INDEX),
    }


def postgres_version(conn, schema: str) -> int:
    """The schema's version, 0 when the version table does not exist (read-only)."""
    from psycopg import sql

    names = postgres_names(schema)
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                          (sql.Identifier(schema, SCHEMA_VERSION_TABLE).as_string(conn),)).fetchone()[0]
    if not exists:
        return 0
    row = conn.execute(sql.SQL("SELECT max(version) FROM {schema_version}").format(**names)).fetchone()
    return row[0] or 0


def apply_postgres(conn, schema: str, store: str, steps: Sequence[SchemaStep] = STEPS) -> int:
    """Bring the schema to ``steps[-1].version``; ``conn`` is a non-autocommit psycopg connection."""
    from psycopg import sql

    _check_steps(steps)
    target = steps[-1].version
    names = postgres_names(schema)
    lock = lease_key(schema, "\0schema-migrations")
    with conn.transaction():
        current = postgres_version(conn, schema)
    if current > target:
        raise _newer(current, target, store)
    if current == target:
        return current
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
        has_schema = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        if not has_schema:
            conn.execute(sql.SQL("CREATE SCHEMA {schema}").format(**names))
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {schema_version} (version integer PRIMARY KEY, "
            "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())").format(**names))
    for step in steps:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
            current = postgres_version(conn, schema)
            if current > target:
                raise _newer(current, target, store)
            if step.version <= current:
                continue
            for statement in step.postgres:
                conn.execute(sql.SQL(statement).format(**names))
            conn.execute(sql.SQL("INSERT INTO {schema_version} (version, description) VALUES (%s, %s)").format(**names),
                         (step.version, step.description))
    return target


# ---- SQLite ------------------------------------------------------------------------------------


def sqlite_names() -> dict[str, str]:
    return {"state": f'"{STATE_TABLE}"', "offsets": f'"{OFFSETS_TABLE}"', "pipelines": f'"{PIPELINES_TABLE}"',
            "schema_version": f'"{SCHEMA_VERSION_TABLE}"', "pending": f'"{PENDING_TABLE}"',
            "pending_event_ts": f'"{PENDING_EVENT_TS_INDEX}"'}


def sqlite_version(conn: sqlite3.Connection) -> int:
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                          (SCHEMA_VERSION_TABLE,)).fetchone()
    if not exists:
        return 0
    return conn.execute(f'SELECT max(version) FROM "{SCHEMA_VERSION_TABLE}"').fetchone()[0] or 0


def apply_sqlite(conn: sqlite3.Connection, store: str, steps: Sequence[SchemaStep] = STEPS) -> int:
    """Bring the schema to ``steps[-1].version``; ``conn`` is in autocommit mode (isolation_level None)."""
    _check_steps(steps)
    target = steps[-1].version
    names = sqlite_names()
    current = sqlite_version(conn)
    if current > target:
        raise _newer(current, target, store)
    if current == target:
        return current
    _sqlite_tx(conn, [f'CREATE TABLE IF NOT EXISTS {names["schema_version"]} (version INTEGER PRIMARY KEY, '
                      "description TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT"])
    for step in steps:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = sqlite_version(conn)
            if current > target:
                raise _newer(current, target, store)
            if step.version > current:
                for statement in step.sqlite:
                    conn.execute(statement.format(**names))
                conn.execute(f'INSERT INTO {names["schema_version"]} (version, description, applied_at) '
                             "VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))", (step.version, step.description))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return target


def _sqlite_tx(conn: sqlite3.Connection, statements: list[str]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in statements:
            conn.execute(statement)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
