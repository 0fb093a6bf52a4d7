"""State segments (schema step 8) on every store: appended in order within the commit's
transaction, a rebase that replaces segments and rows, a dropped prefix of the oldest ones (in the
same transaction), reset, and a schema-7 store opening at 8 with its rows as they were."""

from __future__ import annotations

import pytest

from state_store import codec, migrations
from state_store.contract import BatchCommit
from tests.state_store.contract_stores import blob, end, key, record, same_state
from tests.state_store.legacy_rows import ROW_KINDS, write_rows
from tests.state_store.old_schemas import store_at_schema


def test_segments_are_appended_in_order_and_loaded_in_the_snapshot(make_store, kind):
    store = make_store()
    p = "segments"
    store.commit(BatchCommit(record(p, 0), segments=[b"s0", b"s1"]))
    if kind in ROW_KINDS:  # rows of a store written at schema 7
        write_rows(store, p, [(0, end(0), key("a"), blob(1))])
    store.commit(BatchCommit(record(p, 1)))  # a commit without segments keeps them
    store.commit(BatchCommit(record(p, 2), segments=[b"s2"]))
    store.commit(BatchCommit(record("other", 0), segments=[b"o0"]))
    for s in (store, make_store()):
        state = s.load(p)
        assert state.segments == [b"s0", b"s1", b"s2"] and state.record.last_batch_id == 2
        assert [g[2] for g in state.groups] == ([key("a")] if kind in ROW_KINDS else [])  # rows stay beside them
        assert s.load(p, groups=False).segments == []  # checks and sensors read no state
        assert s.load("other").segments == [b"o0"]


def test_a_rebase_replaces_every_segment_and_row_of_the_pipeline(make_store, kind):
    store = make_store()
    p = "rebase"
    store.commit(BatchCommit(record(p, 0), segments=[b"d0"]))
    store.commit(BatchCommit(record("other", 0), segments=[b"o0"]))
    if kind in ROW_KINDS:  # rows of a store written at schema 7
        write_rows(store, p, [(0, end(0), key("a"), blob(1), True, b"row"), (9, end(9), key("b"), blob(2))])
        write_rows(store, "other", [(0, end(0), key("a"), blob(1))])
    store.commit(BatchCommit(record(p, 1), segments=[b"base", b"d1"], rebase=True))
    state = store.load(p)
    assert state.segments == [b"base", b"d1"] and state.groups == [] and not state.emitted and not state.written
    other = store.load("other")  # another pipeline keeps its own
    assert other.segments == [b"o0"] and len(other.groups) == (1 if kind in ROW_KINDS else 0)
    store.commit(BatchCommit(record(p, 2), segments=[b"d2"]))
    assert make_store().load(p).segments == [b"base", b"d1", b"d2"]
    store.commit(BatchCommit(record(p, 3), rebase=True))  # a rebase without segments empties the state
    state = store.load(p)
    assert state.segments == [] and state.groups == [] and state.record.last_batch_id == 3


def test_segments_commit_with_the_rest_of_the_batch_or_not_at_all(make_store):
    store = make_store()
    p = "segments-atomic"
    store.commit(BatchCommit(record(p, 0), segments=[b"s0"]))
    expected = store.load(p)

    def boom(_conn):
        raise RuntimeError("target write failed")

    for rebase in (False, True):
        with pytest.raises(RuntimeError, match="target write failed"):
            store.commit(BatchCommit(record(p, 1), segments=[b"s1"], rebase=rebase, in_transaction=[boom]))
        assert same_state(store.load(p), expected) and same_state(make_store().load(p), expected)
    for bad in ([b""], ["text"], [None]):  # refused before anything is written
        with pytest.raises(TypeError, match="segments"):
            store.commit(BatchCommit(record(p, 1), segments=bad))  # type: ignore[arg-type]
    assert same_state(store.load(p), expected)


def test_a_dropped_prefix_deletes_the_oldest_segments_and_the_rest_stay_in_order(make_store):
    store = make_store()
    p = "prefix"
    store.commit(BatchCommit(record(p, 0), segments=[b"s0", b"s1", b"s2"]))
    store.commit(BatchCommit(record(p, 1), segments=[b"s3"]))
    store.commit(BatchCommit(record("other", 0), segments=[b"o0", b"o1"]))
    store.commit(BatchCommit(record(p, 2), segments=[b"s4"], dropped_segments=2))  # the drop first, then the append
    for s in (store, make_store()):
        assert s.load(p).segments == [b"s2", b"s3", b"s4"] and s.load("other").segments == [b"o0", b"o1"]
    store.commit(BatchCommit(record(p, 3), dropped_segments=1))  # a drop with nothing appended
    assert store.load(p).segments == [b"s3", b"s4"] and store.load(p).record.last_batch_id == 3
    store.commit(BatchCommit(record(p, 4), segments=[b"s5", b"s6"]))  # numbered after the largest seq left
    assert make_store().load(p).segments == [b"s3", b"s4", b"s5", b"s6"]
    store.commit(BatchCommit(record(p, 5), segments=[b"s7"], dropped_segments=9))  # more than stored: all of them
    store.commit(BatchCommit(record(p, 6), segments=[b"s8"], dropped_segments=0))
    assert make_store().load(p).segments == [b"s7", b"s8"] and store.load("other").segments == [b"o0", b"o1"]
    for bad in (-1, True, 1.0, "1"):  # refused before anything is written, as is a drop beside a rebase
        with pytest.raises(TypeError, match="dropped_segments"):
            store.commit(BatchCommit(record(p, 7), segments=[b"s9"], dropped_segments=bad))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dropped_segments"):
        store.commit(BatchCommit(record(p, 7), segments=[b"s9"], rebase=True, dropped_segments=1))
    assert make_store().load(p).segments == [b"s7", b"s8"] and store.load(p).record.last_batch_id == 6


def test_a_dropped_prefix_commits_with_the_rest_of_the_batch_or_not_at_all(make_store):
    store = make_store()
    p = "prefix-atomic"
    store.commit(BatchCommit(record(p, 0), segments=[b"s0", b"s1"]))
    expected = store.load(p)

    def boom(_conn):
        raise RuntimeError("target write failed")

    for appended in ([], [b"s2"]):
        with pytest.raises(RuntimeError, match="target write failed"):
            store.commit(BatchCommit(record(p, 1), segments=appended, dropped_segments=1, in_transaction=[boom]))
        assert same_state(store.load(p), expected) and same_state(make_store().load(p), expected)
    assert make_store().load(p).segments == [b"s0", b"s1"]


def test_reset_deletes_the_segments(make_store):
    store = make_store()
    store.commit(BatchCommit(record("gone", 0), segments=[b"s0"]))
    store.reset("gone")
    assert store.load("gone").record is None
    store.commit(BatchCommit(record("gone", 0)))
    assert store.load("gone").segments == []


def test_a_schema_7_store_opens_at_8_with_its_rows(schema_store):
    kind, build, connect = schema_store
    conn = connect()
    rows = [(0, 10, key("a"), blob(1), codec.STATE_VERSION), (60, 70, key("b"), blob(2), codec.STATE_VERSION)]
    store_at_schema(kind, conn, 7, "v7", rows)
    conn.close()
    store = build()
    store.open()
    try:
        check = connect()
        assert check.execute("SELECT max(version) FROM ematix_streaming_schema_version").fetchone()[0] == migrations.SCHEMA_VERSION
        assert check.execute("SELECT count(*) FROM ematix_streaming_segments").fetchone()[0] == 0
        check.close()
        state = store.load("v7")
        assert sorted(state.groups) == [r[:4] for r in rows] and state.segments == []
        store.commit(BatchCommit(record("v7", 4), segments=[b"base"], rebase=True))  # the engine's migration
        state = store.load("v7")
        assert state.groups == [] and state.segments == [b"base"] and state.record.last_batch_id == 4
    finally:
        store.close()
