"""The stores of the state-store contract tests: ``kind`` (in-memory, SQLite in tmp_path, PostgreSQL in a fresh
schema) and ``make_store``, a factory of store objects that all see the same data.
"""

from __future__ import annotations

import uuid
from typing import Callable

import pytest

from state_store.base import StateStore
from state_store.memory import InMemoryStateStore
from state_store.postgres import PostgresStateStore
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
