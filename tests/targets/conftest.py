"""The local PostgreSQL of the writer tests: ``dsn`` (one per session) and ``schema`` (a fresh one per test)."""

from __future__ import annotations

import pytest

from tests.pg import drop_schema, ensure_postgres, fresh_schema


@pytest.fixture(scope="session")
def dsn() -> str:
    return ensure_postgres()


@pytest.fixture
def schema(dsn, request):
    name = fresh_schema(dsn, "tgt_" + request.node.name[:20])
    yield name
    drop_schema(dsn, name)
