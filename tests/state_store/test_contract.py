"""One contract, three stores: in-memory, SQLite (tmp_path) and PostgreSQL (a fresh schema).

What only some stores have lives beside it: leases across processes (test_leases_across_processes.py), passwords
and privileges (test_postgres_store.py), schema migrations (test_schema_migrations.py), state rows of stores
written at schema 7 (test_stored_rows.py).
"""

from __future__ import annotations

import logging
import threading
import uuid

import psycopg
import pytest

from ematix_dagster.errors import LeaseHeld, StateVersionError
from state_store import codec, create_store
from state_store.contract import BatchCommit, make_holder
from state_store.memory import InMemoryStateStore
from tests.state_store.contract_stores import blob, end, key, record, same_state, segment
from tests.state_store.legacy_rows import ROW_KINDS, write_rows

# ---- the contract ----------------------------------------------------------------------------


def test_empty_load(make_store):
    store = make_store()
    state = store.load("never-ran")
    assert state.record is None and state.groups == [] and state.migrated == 0
    assert store.lease_holder("never-ran") is None
    assert store.durable is (store.kind != "in_memory")
    assert store.description and repr(store).endswith(f"{store.description}>")


def test_commit_then_load_round_trips(make_store):
    store = make_store()
    rec = record("clicks-1m", 7, pending_migration=True)
    segments = [segment(0, a=3, b=2**62), segment(-60_000_000, a=1)]
    store.commit(BatchCommit(record=rec, segments=segments))
    # a restarted process sees the same
    for s in (store, make_store()):
        state = s.load("clicks-1m")
        assert state.record == rec
        assert list(state.record.sources) == ["views", "clicks"]  # source order survives
        assert list(state.record.offsets) == ["views", "clicks"]
        assert state.segments == segments and all(type(b) is bytes for b in state.segments)
        assert state.groups == [] and state.migrated == 0  # commits write no state rows


def test_a_commit_replaces_the_record_and_the_offsets(make_store):
    store = make_store()
    p = "replaced"
    store.commit(BatchCommit(record(p, 0), segments=[segment(0, a=1)]))
    store.commit(BatchCommit(record(p, 1, watermark=99, offsets={"views": "{}"}), segments=[segment(0, a=2)]))
    state = make_store().load(p)
    assert state.record.last_batch_id == 1 and state.record.watermark == 99
    assert state.record.offsets == {"views": "{}"}  # offsets are the batch's, not a merge
    assert state.segments == [segment(0, a=1), segment(0, a=2)]


def test_a_failing_commit_leaves_the_previous_state(make_store, kind):
    store = make_store()
    p = "atomic"
    before = BatchCommit(record(p, 4), segments=[segment(0, **{f"k{i}": i for i in range(50)})])
    store.commit(before)
    expected = store.load(p)

    def boom(conn):
        if kind == "postgres":
            conn.execute("CREATE TABLE atomic_probe (x int)")  # written in the transaction, then rolled back
        elif kind == "sqlite":
            conn.execute("CREATE TABLE atomic_probe (x INTEGER)")
        raise RuntimeError("target write failed")

    failing = BatchCommit(record(p, 5, watermark=1), segments=[segment(0, **{f"k{i}": -i for i in range(100)})],
                          rebase=True, in_transaction=[lambda c: None, boom])
    with pytest.raises(RuntimeError, match="target write failed"):
        store.commit(failing)
    assert same_state(store.load(p), expected)
    assert same_state(make_store().load(p), expected)
    # malformed input is refused before anything is written
    bad = BatchCommit(record(p, 5), segments=[segment(0, a=1), None])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        store.commit(bad)
    assert same_state(store.load(p), expected)
    if kind != "in_memory":  # a failure after the segments went in: the pipeline row cannot be written
        late = BatchCommit(record(p, 5, fingerprint_doc={"not json": {1, 2}}), segments=[segment(0, a=1)], rebase=True)
        with pytest.raises(Exception):  # noqa: B017 - each store's own error: the commit must not happen
            store.commit(late)
        assert same_state(store.load(p), expected)
    if kind == "postgres":
        with store._connection() as conn:  # the callback's DDL was rolled back with the state
            assert conn.execute("SELECT to_regclass('atomic_probe')").fetchone()[0] is None
    elif kind == "sqlite":
        assert store._db().execute("SELECT count(*) FROM sqlite_master WHERE name = 'atomic_probe'").fetchone()[0] == 0
    # the store still works after the failures
    store.commit(BatchCommit(record(p, 5), segments=[segment(0, a=100)]))
    assert store.load(p).record.last_batch_id == 5


def test_in_transaction_callbacks_commit_with_the_state(make_store, kind):
    store = make_store()
    seen = []

    def write(conn):
        seen.append(conn)
        if kind == "postgres":
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS callback_probe (x int)")
        elif kind == "sqlite":
            conn.execute("CREATE TABLE callback_probe (x INTEGER)")

    store.commit(BatchCommit(record("cb", 0), in_transaction=[write]))
    assert len(seen) == 1
    if kind == "postgres":
        assert isinstance(seen[0], psycopg.Connection)
    elif kind == "sqlite":
        assert store._db().execute("SELECT count(*) FROM sqlite_master WHERE name = 'callback_probe'").fetchone()[0] == 1
    else:
        assert seen == [None]


def test_pipelines_stay_separate(make_store):
    store = make_store()
    store.commit(BatchCommit(record("p1", 3), segments=[segment(0, a=1), segment(60, a=2)]))
    store.commit(BatchCommit(record("p2", 9, query_id="other"), segments=[segment(0, a=3)]))
    store.commit(BatchCommit(record("p2", 10, query_id="other"), segments=[segment(0, b=4)], rebase=True))
    one, two = store.load("p1"), store.load("p2")
    assert one.segments == [segment(0, a=1), segment(60, a=2)] and two.segments == [segment(0, b=4)]
    assert (one.record.last_batch_id, two.record.last_batch_id, two.record.query_id) == (3, 10, "other")
    store.reset("p1")
    assert store.load("p1").record is None and store.load("p1").segments == []
    assert same_state(store.load("p2"), two)


def test_lease_within_one_process(make_store):
    a, b = make_store(), make_store()
    holder = make_holder("run-a")
    a.acquire_lease("leased", holder)
    a.acquire_lease("leased", holder)  # idempotent for its holder
    assert a.lease_holder("leased") == holder and b.lease_holder("leased") == holder
    with pytest.raises(LeaseHeld) as err:
        b.acquire_lease("leased", make_holder("run-b"))
    assert holder in str(err.value) and "leased" in str(err.value)
    assert err.value.holder == holder
    # a non-holder can neither commit, reset nor migrate the pipeline
    for action in (lambda: b.commit(BatchCommit(record("leased", 0))), lambda: b.reset("leased"),
                   lambda: b.migrate_state("leased")):
        with pytest.raises(LeaseHeld, match="run-a"):
            action()
    a.commit(BatchCommit(record("leased", 0), segments=[segment(0, a=1)]))
    assert b.load("leased").record.last_batch_id == 0  # reading needs no lease
    assert b.lease_holder("other-pipeline") is None
    b.acquire_lease("other-pipeline", make_holder("run-b"))  # leases are per pipeline
    a.release_lease("leased")
    assert a.lease_holder("leased") is None and b.lease_holder("leased") is None
    b.acquire_lease("leased", make_holder("run-b"))
    assert "run=run-b" in a.lease_holder("leased")
    b.close()  # closing frees every lease it held
    assert a.lease_holder("leased") is None and a.lease_holder("other-pipeline") is None
    a.acquire_lease("leased", holder)
    a.reset("leased")  # the holder may reset; the lease stays
    assert a.load("leased").record is None
    assert make_store().lease_holder("leased") == holder


def test_reset(make_store, kind):
    store = make_store()
    store.commit(BatchCommit(record("gone", 1), segments=[segment(0, a=1)]))
    store.commit(BatchCommit(record("kept", 1), segments=[segment(0, a=1)]))
    if kind in ROW_KINDS:  # rows of a store written at schema 7 go too
        write_rows(store, "gone", [(0, end(0), key(1), blob(1))])
    store.reset("gone")
    store.reset("never-existed")
    gone = store.load("gone")
    assert gone.record is None and gone.groups == [] and gone.segments == []
    assert store.load("kept").segments == [segment(0, a=1)]
    store.commit(BatchCommit(record("gone", 0), segments=[segment(0, b=2)]))  # starts over cleanly
    gone = store.load("gone")
    assert gone.segments == [segment(0, b=2)] and gone.groups == []


def test_a_record_of_a_newer_state_version_is_refused_naming_the_pipeline(make_store):
    store = make_store()
    store.commit(BatchCommit(record("newer", 1, state_version=codec.STATE_VERSION + 1)))
    with pytest.raises(StateVersionError, match="pipeline 'newer'.*newer than this code"):
        store.load("newer")


def test_state_survives_a_new_store_object_and_threads(make_store):
    store = make_store()
    errors: list[BaseException] = []

    def commit_in_thread():
        try:  # Spark calls foreachBatch from a py4j thread, not the one that opened the store
            store.commit(BatchCommit(record("threaded", 1), segments=[segment(0, t=1)]))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=commit_in_thread)
    thread.start()
    thread.join()
    assert not errors
    assert make_store().load("threaded").segments == [segment(0, t=1)]


def test_in_memory_store_warns_loudly(caplog):
    name = f"warn-{uuid.uuid4().hex[:6]}"
    with caplog.at_level(logging.WARNING):
        store = create_store("in_memory", name=name)
        store.open()
    try:
        assert not store.durable
        assert any("NOTHING survives a restart" in r.getMessage() and r.levelno >= logging.WARNING
                   for r in caplog.records)
    finally:
        store.close()
        InMemoryStateStore.forget(name)
