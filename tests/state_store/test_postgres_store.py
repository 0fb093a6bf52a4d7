"""What only the PostgreSQL state store has: errors that never show the password, missing privileges, a lost
lease connection."""

from __future__ import annotations

import logging
import time
import traceback
import uuid

import psycopg
import pytest
from psycopg import sql

from ematix_dagster.errors import StoreAccessDenied, StorePermissionError, StoreUnavailable
from state_store.contract import BatchCommit, make_holder
from state_store.postgres_store import PostgresStateStore
from tests.state_store.contract_stores import record, segment

# ---- PostgreSQL only -------------------------------------------------------------------------

SECRET = "s3cr3t-Pa55word-do-not-print"


def _no_secret(exc: BaseException, caplog=None) -> str:
    text = "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)
    assert SECRET not in text
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)
    if caplog is not None:
        assert SECRET not in caplog.text
    return str(exc)


def test_postgres_unreachable_is_store_unavailable_without_the_password(caplog):
    url = f"postgresql://ematix_user:{SECRET}@127.0.0.1:1/statedb"
    store = PostgresStateStore(url, "ops", connect_timeout=3)
    assert SECRET not in store.description and SECRET not in repr(store)
    assert store.description == "PostgreSQL state store postgresql://ematix_user@127.0.0.1:1/statedb (schema ops)"
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(StoreUnavailable) as err:
            store.open()
    text = _no_secret(err.value, caplog)
    assert "127.0.0.1:1/statedb" in text and "schema ops" in text
    assert err.value.terminal is False
    with pytest.raises(StoreUnavailable) as err:
        store.load("pipeline-x")  # opens on demand; the pipeline is named
    assert "pipeline 'pipeline-x'" in _no_secret(err.value)
    # the same through a key=value DSN (${NAME} never reaches a store: PipelineSpec.resolved expands it)
    kv = PostgresStateStore(f"host=127.0.0.1 port=1 dbname=statedb user=u password={SECRET}", connect_timeout=3)
    assert SECRET not in kv.description
    with pytest.raises(StoreUnavailable) as err:
        kv.open()
    _no_secret(err.value)
    broken = PostgresStateStore(f"host=127.0.0.1 password={SECRET} dbname")  # does not parse
    assert SECRET not in broken.description
    with pytest.raises(Exception) as err:
        broken.open()
    _no_secret(err.value)


def test_postgres_missing_database_and_wrong_credentials(pg_dsn):
    base = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    missing = f"postgresql://{base['user']}:{SECRET}@{base['host']}:{base['port']}/ematix_no_such_db"
    # Refused logins are terminal: the same settings are refused again until someone acts.
    with pytest.raises(StoreAccessDenied) as err:
        PostgresStateStore(missing, connect_timeout=5).open()
    assert "ematix_no_such_db" in _no_secret(err.value)
    assert err.value.terminal
    nobody = f"postgresql://ematix_no_such_role_{uuid.uuid4().hex[:6]}:{SECRET}@{base['host']}:{base['port']}/test"
    with pytest.raises(StoreAccessDenied) as err:
        PostgresStateStore(nobody, connect_timeout=5).open()
    _no_secret(err.value)


@pytest.fixture
def limited_role(pg_dsn):
    name = f"ematix_limited_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))  # no CREATE on the database
    base = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    yield name, f"postgresql://{name}@{base['host']}:{base['port']}/{base['dbname']}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_postgres_missing_privileges(pg_dsn, pg_schema, limited_role):
    role, url = limited_role
    fresh = f"ematix_priv_{uuid.uuid4().hex[:8]}"
    with pytest.raises(StorePermissionError) as err:  # may not create the schema
        PostgresStateStore(url, fresh).open()
    assert fresh in str(err.value) and "permission denied" in str(err.value)
    # an administrator created the tables: a role with read access only can open and load...
    admin = PostgresStateStore(pg_dsn, pg_schema)
    admin.open()
    admin.commit(BatchCommit(record("shared", 1), segments=[segment(0, a=1)]))
    admin.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(pg_schema), sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(
            sql.Identifier(pg_schema), sql.Identifier(role)))
    reader = PostgresStateStore(url, pg_schema)
    try:
        reader.open()
        assert reader.load("shared").record.last_batch_id == 1
        with pytest.raises(StorePermissionError) as err:  # ...but not write
            reader.commit(BatchCommit(record("shared", 2)))
        assert "pipeline 'shared'" in str(err.value) and pg_schema in str(err.value)
        assert admin.kind == "postgres"
    finally:
        reader.close()


def test_postgres_lost_lease_connection_fails_the_commit(pg_dsn, pg_schema):
    store = PostgresStateStore(pg_dsn, pg_schema)
    store.open()
    try:
        store.acquire_lease("fenced", make_holder("fenced-run"))
        store.commit(BatchCommit(record("fenced", 0)))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (store._lease_pid,))
            # pg_terminate_backend only signals the backend: wait until it is gone (and its lock with it).
            deadline = time.monotonic() + 30
            while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (store._lease_pid,)).fetchone():
                assert time.monotonic() < deadline, "the lease connection's backend did not exit"
                time.sleep(0.05)
        with pytest.raises(StoreUnavailable, match="lease was lost"):
            store.commit(BatchCommit(record("fenced", 1)))
        assert store.load("fenced").record.last_batch_id == 0
    finally:
        store.close()
    fresh = PostgresStateStore(pg_dsn, pg_schema)
    try:
        fresh.acquire_lease("fenced", make_holder("next-run"))
        fresh.commit(BatchCommit(record("fenced", 1)))
    finally:
        fresh.close()
