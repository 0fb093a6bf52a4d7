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
The steps and the layout decision of each are ``state_store.schema_steps``.
"""

from __future__ import annotations

import sqlite3
from typing import Sequence

from state_store.errors import StateVersionError
from state_store.names import (
    OFFSETS_TABLE,
    PENDING_EVENT_TS_INDEX,
    PENDING_TABLE,
    PIPELINES_TABLE,
    SCHEMA_VERSION_TABLE,
    SEGMENTS_TABLE,
    STATE_TABLE,
    lease_key,
)
from state_store.schema_steps import SCHEMA_VERSION, STEPS, SchemaStep

__all__ = ["SCHEMA_VERSION", "STEPS", "SchemaStep", "apply_postgres", "apply_sqlite", "postgres_names",
           "postgres_version", "sqlite_names", "sqlite_version"]



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
        "segments": sql.Identifier(schema, SEGMENTS_TABLE),
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
            "pending_event_ts": f'"{PENDING_EVENT_TS_INDEX}"', "segments": f'"{SEGMENTS_TABLE}"'}


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
