"""One contract, three stores: in-memory, SQLite (tmp_path) and PostgreSQL (a fresh schema).

What only some stores have lives beside it: leases across processes (test_leases_across_processes.py), passwords
and privileges (test_postgres_store.py), schema migrations (test_schema_migrations.py).
"""

from __future__ import annotations

import logging
import threading
import uuid

import psycopg
import pytest

from ematix_dagster.errors import CorruptState, LeaseHeld, StateVersionError
from state_store import codec, create_store, loaded_groups, whole_window
from state_store.base import BatchCommit, make_holder
from state_store.memory import InMemoryStateStore
from tests.state_store.contract_stores import FIXTURES, blob, end, groups_of, key, record, same_state

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
    upserts = [(0, end(0), key(1, "a"), blob(3, 2.5, (1, "x"))), (0, end(0), key(2, None), blob(None, None, None)),
               (60_000_000, end(60_000_000), key(1, "a"), blob(1, float("nan"), (9, {"s"}))),
               (-60_000_000, end(-60_000_000), key(), blob(2**70))]
    store.commit(BatchCommit(record=rec, upserts=upserts))
    # a restarted process sees the same
    for s in (store, make_store()):
        state = s.load("clicks-1m")
        assert state.record == rec
        assert list(state.record.sources) == ["views", "clicks"]  # source order survives
        assert list(state.record.offsets) == ["views", "clicks"]
        assert sorted(state.groups) == sorted(upserts)
        assert all(isinstance(k, bytes) and isinstance(b, bytes) for _, _, k, b in state.groups)
    windows = loaded_groups.decode_groups("clicks-1m", state.groups)
    assert windows[60_000_000][(1, "a")][2] == (9, {"s"})
    assert windows[-60_000_000][()] == [2**70]


def test_upserts_overwrite_and_deletes_remove(make_store):
    store = make_store()
    p = "upserts"
    store.commit(BatchCommit(record(p, 0), upserts=[
        (0, end(0), key("a"), blob(1)), (0, end(0), key("b"), blob(2)), (0, end(0), key("c"), blob(3)),
        (60, end(60), key("a"), blob(4)), (60, end(60), key("b"), blob(5)), (120, end(120), key("a"), blob(6))]))
    store.commit(BatchCommit(
        record(p, 1, watermark=99, offsets={"views": "{}"}),
        upserts=[(0, end(0), key("a"), blob(10)), (0, end(0), key("d"), blob(11)),
                 (0, end(0), key("d"), blob(12)),  # last upsert wins
                 (120, end(120), key("b"), blob(13)), (0, end(0), key("c"), blob(14))],
        deletes=[(0, key("b")), (0, key("c")), (0, key("zz")), (999, key("a"))],  # c: updated and deleted
        deleted_windows=[60, 12345]))
    state = store.load(p)
    assert groups_of(state) == {(0, key("a")): blob(10), (0, key("d")): blob(12), (120, key("a")): blob(6),
                                (120, key("b")): blob(13)}
    assert state.record.last_batch_id == 1 and state.record.watermark == 99
    assert state.record.offsets == {"views": "{}"}  # offsets are the batch's, not a merge
    store.commit(BatchCommit(record(p, 2), deleted_windows=[0, 120]))
    assert make_store().load(p).groups == []


def test_deleted_before_removes_every_older_window_of_the_pipeline_only(make_store):
    """Sliding windows evict by event time: one range delete, after the batch's upserts."""
    store = make_store()
    rows = [(t, t, key(k), blob(t)) for t in (-5, 0, 7, 9) for k in ("a", "b")]
    store.commit(BatchCommit(record("slide", 0), upserts=rows))
    store.commit(BatchCommit(record("other", 0), upserts=rows))
    store.commit(BatchCommit(record("slide", 1), upserts=[(12, 12, key("a"), blob(12))], deleted_before=7))
    assert sorted(groups_of(store.load("slide"))) == [(7, key("a")), (7, key("b")), (9, key("a")), (9, key("b")),
                                                       (12, key("a"))]
    assert len(make_store().load("other").groups) == len(rows)
    with pytest.raises(TypeError, match="deleted_before"):
        store.commit(BatchCommit(record("slide", 2), deleted_before="7"))  # type: ignore[arg-type]


def test_emitted_flags_are_written_with_every_upsert_and_loaded_in_the_same_snapshot(make_store):
    """Schema step 5: a session's flag is stored with its row; an upsert without one (fixed
    windows) stores NULL, which a load leaves out; deletes and migrate_state keep rows and flags in step."""
    store = make_store()
    p = "flags"
    v1 = (FIXTURES / "counts.state.bin").read_bytes()  # an older blob: migrate_state rewrites its row
    store.commit(BatchCommit(record(p, 0), upserts=[
        (0, 10, key("a"), blob(1)), (20, 30, key("a"), blob(2)), (0, 15, key("b"), v1),
        (60, end(60), key("f"), blob(3))],
        emitted={(0, key("a")): True, (20, key("a")): False, (0, key("b")): True}))
    for s in (store, make_store()):
        assert s.load(p).emitted == {(0, key("a")): True, (20, key("a")): False, (0, key("b")): True}
        assert s.load(p, groups=False).emitted == {}
    store.commit(BatchCommit(record(p, 1), upserts=[(20, 40, key("a"), blob(5)), (60, end(60), key("f"), blob(6)),
                                                    (0, 12, key("c"), blob(7))],
                             emitted={(20, key("a")): True}, deletes=[(0, key("a"))]))
    state = store.load(p)
    assert state.emitted == {(20, key("a")): True, (0, key("b")): True}  # (0, c) written without a flag: NULL
    assert sorted((s, e) for s, e, _, _ in state.groups) == [(0, 12), (0, 15), (20, 40), (60, end(60))]
    assert store.migrate_state(p) == 1 and store.load(p).emitted == state.emitted
    with pytest.raises(TypeError, match="emitted flag"):  # a flag must belong to an upsert of the batch
        store.commit(BatchCommit(record(p, 2), emitted={(0, key("zz")): True}))
    with pytest.raises(TypeError, match="emitted flag"):
        store.commit(BatchCommit(record(p, 2), upserts=[(0, 9, key("a"), blob(1))], emitted={(0, key("a")): 1}))
    assert store.load(p).record.last_batch_id == 1


def test_a_failing_commit_leaves_the_previous_state(make_store, kind):
    store = make_store()
    p = "atomic"
    before = BatchCommit(record(p, 4), upserts=[(0, end(0), key(i), blob(i)) for i in range(50)])
    store.commit(before)
    expected = store.load(p)

    def boom(conn):
        if kind == "postgres":
            conn.execute("CREATE TABLE atomic_probe (x int)")  # written in the transaction, then rolled back
        elif kind == "sqlite":
            conn.execute("CREATE TABLE atomic_probe (x INTEGER)")
        raise RuntimeError("target write failed")

    failing = BatchCommit(record(p, 5, watermark=1), upserts=[(0, end(0), key(i), blob(-i)) for i in range(100)],
                          deletes=[(0, key(1))], deleted_windows=[0], in_transaction=[lambda c: None, boom])
    with pytest.raises(RuntimeError, match="target write failed"):
        store.commit(failing)
    assert same_state(store.load(p), expected)
    assert same_state(make_store().load(p), expected)
    # malformed input is refused before anything is written
    bad = BatchCommit(record(p, 5), upserts=[(0, end(0), key(i), blob(-i)) for i in range(10)]
                      + [(0, end(0), key("x"), None)])
    with pytest.raises(TypeError):
        store.commit(bad)  # type: ignore[arg-type]
    assert same_state(store.load(p), expected)
    if kind != "in_memory":  # a failure after the state rows went in: the pipeline row cannot be written
        late = BatchCommit(record(p, 5, fingerprint_doc={"not json": {1, 2}}),
                           upserts=[(0, end(0), key(i), blob(-i)) for i in range(100)], deleted_windows=[0])
        with pytest.raises(Exception):  # noqa: B017 - each store's own error: the commit must not happen
            store.commit(late)
        assert same_state(store.load(p), expected)
    if kind == "postgres":
        with store._connection() as conn:  # the callback's DDL was rolled back with the state
            assert conn.execute("SELECT to_regclass('atomic_probe')").fetchone()[0] is None
    elif kind == "sqlite":
        assert store._db().execute("SELECT count(*) FROM sqlite_master WHERE name = 'atomic_probe'").fetchone()[0] == 0
    # the store still works after the failures
    store.commit(BatchCommit(record(p, 5), upserts=[(0, end(0), key(1), blob(100))]))
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
    store.commit(BatchCommit(record("p1", 3), upserts=[(0, end(0), key("a"), blob(1)),
                                                       (60, end(60), key("a"), blob(2))]))
    store.commit(BatchCommit(record("p2", 9, query_id="other"), upserts=[(0, end(0), key("a"), blob(3))]))
    store.commit(BatchCommit(record("p2", 10, query_id="other"), deleted_windows=[60], deletes=[(0, key("b"))]))
    one, two = store.load("p1"), store.load("p2")
    assert groups_of(one) == {(0, key("a")): blob(1), (60, key("a")): blob(2)}
    assert groups_of(two) == {(0, key("a")): blob(3)}
    assert (one.record.last_batch_id, two.record.last_batch_id, two.record.query_id) == (3, 10, "other")
    store.reset("p1")
    assert store.load("p1").record is None and store.load("p1").groups == []
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
    a.commit(BatchCommit(record("leased", 0), upserts=[(0, end(0), key(1), blob(1))]))
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


def test_reset(make_store):
    store = make_store()
    store.commit(BatchCommit(record("gone", 1), upserts=[(0, end(0), key(1), blob(1))]))
    store.commit(BatchCommit(record("kept", 1), upserts=[(0, end(0), key(1), blob(1))]))
    store.reset("gone")
    store.reset("never-existed")
    assert store.load("gone").record is None and store.load("gone").groups == []
    assert store.load("kept").record is not None
    store.commit(BatchCommit(record("gone", 0), upserts=[(0, end(0), key(2), blob(2))]))  # starts over cleanly
    assert groups_of(store.load("gone")) == {(0, key(2)): blob(2)}


def test_corrupt_and_newer_blobs_name_the_pipeline(make_store):
    store = make_store()
    store.commit(BatchCommit(record("broken", 1), upserts=[(0, end(0), key(1), b"\x00not state")]))
    with pytest.raises(CorruptState, match="pipeline 'broken'.*window 0"):
        store.load("broken")
    store.commit(BatchCommit(record("broken", 2),
                             upserts=[(0, end(0), key(1), bytes([codec.STATE_VERSION]) + b"\xc1")]))
    state = store.load("broken")  # the version byte is fine; the body is decoded by the caller
    with pytest.raises(CorruptState, match="pipeline 'broken'"):
        loaded_groups.decode_groups("broken", state.groups, store.description)
    store.commit(BatchCommit(record("broken", 3), upserts=[(0, end(0), key(1), b"\x01\xc1")]))  # old version, bad body
    with pytest.raises(CorruptState, match="pipeline 'broken'"):
        store.load("broken")
    store.commit(BatchCommit(record("broken", 4),
                             upserts=[(0, end(0), key(1), bytes([codec.STATE_VERSION + 1, 0x90]))]))
    with pytest.raises(StateVersionError, match="pipeline 'broken'.*newer than this code"):
        store.load("broken")
    store.commit(BatchCommit(record("newer", 1, state_version=codec.STATE_VERSION + 1)))
    with pytest.raises(StateVersionError, match="pipeline 'newer'.*newer than this code"):
        store.load("newer")


def test_older_blobs_are_migrated_on_load_and_by_migrate_state(make_store):
    store = make_store()
    v1 = {name: (FIXTURES / f"{name}.state.bin").read_bytes() for name in ("counts", "first_last", "exact_sets")}
    upserts = [(i * 60, end(i * 60), key(name), b) for i, (name, b) in enumerate(v1.items())]
    upserts += [(999, end(999), key("new"), blob(1))]
    store.commit(BatchCommit(record("old", 1), upserts=upserts))
    for _ in range(2):  # lazily: the rows stay at version 1 until rewritten
        state = store.load("old")
        assert state.migrated == 3
        assert all(b[0] == codec.STATE_VERSION for _, _, _, b in state.groups)
    windows = loaded_groups.decode_groups("old", state.groups)
    assert windows[0][("counts",)] == [5, 0, None]
    assert windows[120][("exact_sets",)][0] == {"a", "b", ""}
    holder = make_holder("migration job")
    other = make_store()
    other.acquire_lease("old", holder)
    with pytest.raises(LeaseHeld):
        store.migrate_state("old")
    assert other.migrate_state("old") == 3
    other.release_lease("old")
    again = store.load("old")
    assert again.migrated == 0 and groups_of(again) == groups_of(state)
    assert store.migrate_state("old") == 0


def whole(start: int, groups: dict[bytes, list]) -> tuple[int, int, bytes]:
    return start, end(start), whole_window.encode_window(list(groups), list(groups.values()))


def test_whole_windows_replace_their_window_and_group_rows_overlay_them(make_store):
    """A window written whole is one row; later group upserts win over its entries, the next whole
    write replaces both, and loads always give one tuple per group."""
    store = make_store()
    p = "whole"
    store.commit(BatchCommit(record(p, 0), upserts=[(0, end(0), key(k), blob(1)) for k in "abc"]
                             + [(60, end(60), key("a"), blob(2))]))
    store.commit(BatchCommit(record("neighbour", 0), upserts=[(0, end(0), key("a"), blob(3))]))
    store.commit(BatchCommit(record(p, 1), whole_windows=[whole(0, {key("a"): [10], key("b"): [11], key("d"): [12]})]))
    assert groups_of(store.load(p)) == {(0, key("a")): blob(10), (0, key("b")): blob(11), (0, key("d")): blob(12),
                                        (60, key("a")): blob(2)}
    store.commit(BatchCommit(record(p, 2), upserts=[(0, end(0), key("a"), blob(20)), (0, end(0), key("e"), blob(21))]))
    state = make_store().load(p)
    assert sorted(state.groups) == sorted([(0, end(0), key("a"), blob(20)), (0, end(0), key("b"), blob(11)),
                                           (0, end(0), key("d"), blob(12)), (0, end(0), key("e"), blob(21)),
                                           (60, end(60), key("a"), blob(2))])
    store.commit(BatchCommit(record(p, 3), whole_windows=[whole(0, {key("a"): [30], key("b"): [31]}),
                                                          whole(120, {key("z"): [None, (1, "x"), {"s"}]})]))
    assert groups_of(store.load(p)) == {(0, key("a")): blob(30), (0, key("b")): blob(31), (60, key("a")): blob(2),
                                        (120, key("z")): blob(None, (1, "x"), {"s"})}
    store.commit(BatchCommit(record(p, 4), deleted_windows=[0, 120]))
    assert groups_of(store.load(p)) == {(60, key("a")): blob(2)}
    assert groups_of(store.load("neighbour")) == {(0, key("a")): blob(3)}
    with pytest.raises(ValueError, match="whole-window row"):
        store.commit(BatchCommit(record(p, 5), upserts=[(0, end(0), whole_window.WINDOW_KEY, blob(1))]))
    with pytest.raises(TypeError, match="a whole window must be"):
        store.commit(BatchCommit(record(p, 5), whole_windows=[(0, end(0), "not bytes")]))  # type: ignore[list-item]
    store.commit(BatchCommit(record(p, 5), whole_windows=[(0, end(0), bytes([codec.STATE_VERSION]) + b"\x92\xc1")]))
    with pytest.raises(CorruptState, match="pipeline 'whole'.*window 0: whole-window blob is corrupt"):
        store.load(p)


def test_whole_window_rows_of_an_older_version_are_migrated_whole(make_store):
    store = make_store()
    v1 = {key(name): (FIXTURES / f"{name}.state.bin").read_bytes() for name in ("counts", "first_last", "exact_sets")}
    stale = whole_window.window_blob(1, list(v1), list(v1.values()))
    store.commit(BatchCommit(record("old-whole", 1), whole_windows=[(0, end(0), stale)],
                             upserts=[(60, end(60), key("new"), blob(1))]))
    state = store.load("old-whole")
    assert state.migrated == 3
    windows = loaded_groups.decode_groups("old-whole", state.groups)
    assert windows[0][("counts",)] == [5, 0, None] and windows[0][("exact_sets",)][0] == {"a", "b", ""}
    assert store.migrate_state("old-whole") == 3
    again = store.load("old-whole")
    assert again.migrated == 0 and groups_of(again) == groups_of(state)
    assert store.migrate_state("old-whole") == 0


def test_state_survives_a_new_store_object_and_threads(make_store):
    store = make_store()
    errors: list[BaseException] = []

    def commit_in_thread():
        try:  # Spark calls foreachBatch from a py4j thread, not the one that opened the store
            store.commit(BatchCommit(record("threaded", 1), upserts=[(0, end(0), key("t"), blob(1))]))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=commit_in_thread)
    thread.start()
    thread.join()
    assert not errors
    assert groups_of(make_store().load("threaded")) == {(0, key("t")): blob(1)}


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
