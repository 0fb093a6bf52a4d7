"""The stores of the state-store contract tests: ``kind`` (in-memory, SQLite in tmp_path, PostgreSQL in a fresh
schema) and ``make_store``, a factory of store objects that all see the same data; ``schema_store`` for the
schema-migration tests (SQLite and PostgreSQL only).
"""

from __future__ import annotations

import sqlite3
import uuid
from typing import Callable

import psycopg
import pytest
from psycopg import sql

from state_store.contract import StateStore
from state_store.memory import InMemoryStateStore
from state_store.postgres_store import PostgresStateStore
from state_store.sqlite import SqliteStateStore
from tests.state_store.contract_stores import KINDS


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def make_store(kind, request, tmp_path) -> Callable[[], StateStore]:
    """A factory of store objects that all see the same data (a new object = a restarted process)."""
    made: list[StateStore] = []
    if kind == "in_memory":
        name = f"contract-{uuid.uuid4().hex[:8]}"
        build: Callable[[], StateStore] = lambda: InMemoryStateStore(name)  # noqa: E731
    elif kind == "sqlite":
        path = tmp_path / "state" / "state.db"
        build = lambda: SqliteStateStore(path)  # noqa: E731
    else:
        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        build = lambda: PostgresStateStore(dsn, schema)  # noqa: E731

    def make() -> StateStore:
        store = build()
        store.open()
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()
    if kind == "in_memory":
        InMemoryStateStore.forget(name)


@pytest.fixture(params=["sqlite", "postgres"])
def schema_store(request, tmp_path):
    """(kind, a factory of store objects not opened yet, a factory of plain connections: SQLite in tmp_path,
    PostgreSQL in a fresh schema, its search_path set) for the schema-migration tests."""
    if request.param == "sqlite":
        path = tmp_path / "schema.db"
        yield "sqlite", (lambda: SqliteStateStore(path)), (lambda: sqlite3.connect(path))
    else:
        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")

        def conn():
            c = psycopg.connect(dsn, autocommit=True)
            c.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            return c

        yield "postgres", (lambda: PostgresStateStore(dsn, schema)), conn
