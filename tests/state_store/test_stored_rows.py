"""State rows of a store written at schema 7 or older, on SQLite and PostgreSQL: loaded one tuple per group
(whole-window rows expanded, group rows overlaying them), with their emitted flags, brought forward on
load and rewritten by ``migrate_state``, refused when corrupt. Commits no longer write rows (they append
segments), so the rows are written as that code wrote them (``legacy_rows``)."""

from __future__ import annotations

import pytest

from ematix_dagster.errors import CorruptState, LeaseHeld, StateVersionError
from state_store import codec, loaded_groups, whole_window
from state_store.contract import BatchCommit, make_holder
from tests.state_store.contract_stores import FIXTURES, blob, end, groups_of, key, record
from tests.state_store.legacy_rows import ROW_KINDS, write_rows

pytestmark = pytest.mark.parametrize("kind", ROW_KINDS)


def test_stored_rows_load_as_groups(make_store):
    store = make_store()
    rows = [(0, end(0), key(1, "a"), blob(3, 2.5, (1, "x"))), (0, end(0), key(2, None), blob(None, None, None)),
            (60_000_000, end(60_000_000), key(1, "a"), blob(1, float("nan"), (9, {"s"}))),
            (-60_000_000, end(-60_000_000), key(), blob(2**70))]
    store.commit(BatchCommit(record("clicks-1m", 7)))
    write_rows(store, "clicks-1m", rows)
    for s in (store, make_store()):  # a restarted process sees the same
        state = s.load("clicks-1m")
        assert sorted(state.groups) == sorted(rows) and state.migrated == 0
        assert all(isinstance(k, bytes) and isinstance(b, bytes) for _, _, k, b in state.groups)
        assert s.load("clicks-1m", groups=False).groups == []
    windows = loaded_groups.decode_groups("clicks-1m", state.groups)
    assert windows[60_000_000][(1, "a")][2] == (9, {"s"})
    assert windows[-60_000_000][()] == [2**70]


def test_emitted_flags_are_loaded_in_the_same_snapshot_and_kept_by_migrate_state(make_store):
    """Schema step 5: a session's flag is stored with its row; a NULL one (fixed windows) is left out
    of a load, and migrate_state keeps rows and flags in step."""
    store = make_store()
    p = "flags"
    v1 = (FIXTURES / "counts.state.bin").read_bytes()  # an older blob: migrate_state rewrites its row
    store.commit(BatchCommit(record(p, 0)))
    write_rows(store, p, [(0, 10, key("a"), blob(1), True), (20, 30, key("a"), blob(2), False),
                          (0, 15, key("b"), v1, True), (60, end(60), key("f"), blob(3))])
    flags = {(0, key("a")): True, (20, key("a")): False, (0, key("b")): True}
    for s in (store, make_store()):
        assert s.load(p).emitted == flags
        assert s.load(p, groups=False).emitted == {}
    assert store.migrate_state(p) == 1
    state = store.load(p)
    assert state.emitted == flags and state.migrated == 0
    assert sorted((s, e) for s, e, _, _ in state.groups) == [(0, 10), (0, 15), (20, 30), (60, end(60))]


def test_corrupt_and_newer_blobs_name_the_pipeline(make_store):
    store = make_store()
    store.commit(BatchCommit(record("broken", 1)))
    write_rows(store, "broken", [(0, end(0), key(1), b"\x00not state")])
    with pytest.raises(CorruptState, match="pipeline 'broken'.*window 0"):
        store.load("broken")
    write_rows(store, "broken", [(0, end(0), key(1), bytes([codec.STATE_VERSION]) + b"\xc1")])
    state = store.load("broken")  # the version byte is fine; the body is decoded by the caller
    with pytest.raises(CorruptState, match="pipeline 'broken'"):
        loaded_groups.decode_groups("broken", state.groups, store.description)
    write_rows(store, "broken", [(0, end(0), key(1), b"\x01\xc1")])  # old version, bad body
    with pytest.raises(CorruptState, match="pipeline 'broken'"):
        store.load("broken")
    write_rows(store, "broken", [(0, end(0), key(1), bytes([codec.STATE_VERSION + 1, 0x90]))])
    with pytest.raises(StateVersionError, match="pipeline 'broken'.*newer than this code"):
        store.load("broken")


def test_older_blobs_are_migrated_on_load_and_by_migrate_state(make_store):
    store = make_store()
    v1 = {name: (FIXTURES / f"{name}.state.bin").read_bytes() for name in ("counts", "first_last", "exact_sets")}
    rows = [(i * 60, end(i * 60), key(name), b) for i, (name, b) in enumerate(v1.items())]
    store.commit(BatchCommit(record("old", 1)))
    write_rows(store, "old", [*rows, (999, end(999), key("new"), blob(1))])
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


def whole(start: int, groups: dict[bytes, bytes], version: int = codec.STATE_VERSION) -> tuple[int, int, bytes, bytes]:
    """A whole-window row: every group of the window in one blob, under ``whole_window.WINDOW_KEY``."""
    return start, end(start), whole_window.WINDOW_KEY, whole_window.window_blob(version, list(groups),
                                                                                list(groups.values()))


def test_whole_window_rows_expand_and_group_rows_overlay_them(make_store):
    """A window stored whole is one row; a group's own row wins over its entry, and loads always give
    one tuple per group."""
    store = make_store()
    p = "whole"
    store.commit(BatchCommit(record(p, 0)))
    store.commit(BatchCommit(record("neighbour", 0)))
    write_rows(store, "neighbour", [(0, end(0), key("a"), blob(3))])
    write_rows(store, p, [whole(0, {key("a"): blob(10), key("b"): blob(11), key("d"): blob(12)}),
                          (0, end(0), key("a"), blob(20)), (0, end(0), key("e"), blob(21)),
                          (60, end(60), key("a"), blob(2)),
                          whole(120, {key("z"): blob(None, (1, "x"), {"s"})})])
    state = make_store().load(p)
    assert sorted(state.groups) == sorted([(0, end(0), key("a"), blob(20)), (0, end(0), key("b"), blob(11)),
                                           (0, end(0), key("d"), blob(12)), (0, end(0), key("e"), blob(21)),
                                           (60, end(60), key("a"), blob(2)),
                                           (120, end(120), key("z"), blob(None, (1, "x"), {"s"}))])
    assert groups_of(store.load("neighbour")) == {(0, key("a")): blob(3)}
    write_rows(store, p, [(0, end(0), whole_window.WINDOW_KEY, bytes([codec.STATE_VERSION]) + b"\x92\xc1")])
    with pytest.raises(CorruptState, match="pipeline 'whole'.*window 0: whole-window blob is corrupt"):
        store.load(p)


def test_whole_window_rows_of_an_older_version_are_migrated_whole(make_store):
    store = make_store()
    v1 = {key(name): (FIXTURES / f"{name}.state.bin").read_bytes() for name in ("counts", "first_last", "exact_sets")}
    store.commit(BatchCommit(record("old-whole", 1)))
    write_rows(store, "old-whole", [whole(0, v1, version=1), (60, end(60), key("new"), blob(1))])
    state = store.load("old-whole")
    assert state.migrated == 3
    windows = loaded_groups.decode_groups("old-whole", state.groups)
    assert windows[0][("counts",)] == [5, 0, None] and windows[0][("exact_sets",)][0] == {"a", "b", ""}
    assert store.migrate_state("old-whole") == 3
    again = store.load("old-whole")
    assert again.migrated == 0 and groups_of(again) == groups_of(state)
    assert store.migrate_state("old-whole") == 0
