"""Schema step 6 on the three stores: each key's last written row and the interval trigger's timer.

The store contract of ``BatchCommit.written`` / ``RecoveredState.written`` (kept like the emitted
flags of step 5, test_contract.py) and ``PipelineRecord.trigger_fired_at``; the step itself, on a
store at version 5, is in test_schema_migrations.py.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from ematix_dagster.errors import CorruptState
from state_store import migrations, whole_window
from state_store._common import PIPELINE_COLUMNS, record_from_row
from state_store.base import BatchCommit
from tests.state_store.contract_stores import FIXTURES, blob, end, groups_of, key, record

FIRED = 1_700_000_000_500_000  # a batch time, µs


def written(n: int) -> bytes:
    """An engine's written row: opaque bytes to the store (zero bytes and every byte value included)."""
    return bytes([0, n]) + bytes(range(256)) + b"row %d" % n


def test_written_rows_and_the_trigger_timer_commit_and_load_with_the_batch(make_store):
    """An upsert writes its key's written row, NULL without an entry (a load leaves it out); a delete
    removes it with the row; migrate_state keeps it; the timer is part of the pipeline row."""
    store = make_store()
    p = "written"
    v1 = (FIXTURES / "counts.state.bin").read_bytes()  # an older blob: migrate_state rewrites its row
    store.commit(BatchCommit(record(p, 0, trigger_fired_at=FIRED), upserts=[
        (0, 10, key("a"), blob(1)), (20, 30, key("a"), blob(2)), (0, 15, key("b"), v1), (60, end(60), key("f"), blob(3))],
        emitted={(0, key("a")): True, (20, key("a")): False},
        written={(0, key("a")): written(1), (20, key("a")): written(2), (0, key("b")): written(3)}))
    for s in (store, make_store()):  # a restarted process sees the same
        state = s.load(p)
        assert state.written == {(0, key("a")): written(1), (20, key("a")): written(2), (0, key("b")): written(3)}
        assert all(type(row) is bytes for row in state.written.values())
        assert state.emitted == {(0, key("a")): True, (20, key("a")): False}  # the flags are their own column
        assert state.record.trigger_fired_at == FIRED
        assert s.load(p, groups=False).written == {}
    store.commit(BatchCommit(record(p, 1, trigger_fired_at=FIRED + 1),
                             upserts=[(20, 40, key("a"), blob(5)), (60, end(60), key("f"), blob(6)),
                                      (0, 12, key("c"), blob(7))],
                             written={(60, key("f")): written(6)}, deletes=[(0, key("a"))]))
    state = store.load(p)
    # (20, a) upserted without an entry: NULL; (0, a) deleted with its row; (0, b) untouched
    assert state.written == {(0, key("b")): written(3), (60, key("f")): written(6)}
    assert sorted(groups_of(state)) == [(0, key("b")), (0, key("c")), (20, key("a")), (60, key("f"))]
    assert state.record.trigger_fired_at == FIRED + 1
    assert store.migrate_state(p) == 1 and store.load(p).written == state.written
    store.commit(BatchCommit(record(p, 2)))  # the record is rewritten whole: no timer now
    assert store.load(p).record.trigger_fired_at is None and store.load(p).written == state.written


def test_whole_windows_carry_no_written_row_and_group_rows_over_them_do(make_store):
    store = make_store()
    p = "whole-written"
    store.commit(BatchCommit(record(p, 0), upserts=[(0, end(0), key("a"), blob(1))],
                             written={(0, key("a")): written(1)}))
    groups = {key("a"): [10], key("b"): [11]}
    store.commit(BatchCommit(record(p, 1), whole_windows=[(0, end(0), whole_window.encode_window(
        list(groups), list(groups.values())))], upserts=[(0, end(0), key("b"), blob(12))],
        written={(0, key("b")): written(12)}))
    state = store.load(p)  # the whole window replaced (0, a) and its written row; (0, b)'s own row keeps one
    assert groups_of(state) == {(0, key("a")): blob(10), (0, key("b")): blob(12)}
    assert state.written == {(0, key("b")): written(12)}


def test_reset_forgets_written_rows_and_the_timer(make_store):
    store = make_store()
    p = "reset-written"
    store.commit(BatchCommit(record(p, 0, trigger_fired_at=FIRED), upserts=[(0, end(0), key("a"), blob(1))],
                             written={(0, key("a")): written(1)}))
    store.reset(p)
    assert store.load(p).record is None
    store.commit(BatchCommit(record(p, 0)))
    state = store.load(p)
    assert state.written == {} and state.groups == [] and state.record.trigger_fired_at is None


@pytest.mark.parametrize("batch,match", [
    (dict(written={(0, key("zz")): b"x"}), "written row"),  # not an upsert of the batch
    (dict(upserts=[(0, 9, key("a"), blob(1))], written={(0, key("a")): "row"}), "written row"),
    (dict(upserts=[(0, 9, key("a"), blob(1))], written={(0, key("a")): bytearray(b"row")}), "written row"),
    (dict(whole_windows=[(0, 9, whole_window.encode_window([key("a")], [[1]]))],
          written={(0, whole_window.WINDOW_KEY): b"x"}), "written row"),  # whole windows never carry one
    (dict(trigger_fired_at="1700000000"), "trigger_fired_at"),
    (dict(trigger_fired_at=True), "trigger_fired_at"),
    (dict(trigger_fired_at=1.5), "trigger_fired_at"),
])
def test_malformed_written_rows_and_timers_are_refused_before_anything_is_written(make_store, batch, match):
    store = make_store()
    p = "refused"
    store.commit(BatchCommit(record(p, 0, trigger_fired_at=FIRED), upserts=[(0, 9, key("a"), blob(0))],
                             written={(0, key("a")): b"kept"}))
    batch = dict(batch)  # the parameter is shared by the three stores
    fired = {"trigger_fired_at": batch.pop("trigger_fired_at")} if "trigger_fired_at" in batch else {}
    with pytest.raises(TypeError, match=match):
        store.commit(BatchCommit(record(p, 1, **fired), **batch))
    state = store.load(p)
    assert state.record.last_batch_id == 0 and state.record.trigger_fired_at == FIRED
    assert state.written == {(0, key("a")): b"kept"} and groups_of(state) == {(0, key("a")): blob(0)}


@pytest.mark.parametrize("value", ["soon", 1.5, True, b"\x01"])
def test_a_trigger_timer_that_is_not_an_integer_is_corrupt_state(value):
    row = [None] * len(PIPELINE_COLUMNS)
    row[0], row[PIPELINE_COLUMNS.index("trigger_fired_at")] = 2, value
    with pytest.raises(CorruptState, match=r"pipeline 'p' in SQLite state store x\.db: column 'trigger_fired_at' "
                                           r"of the pipelines table \(ematix_streaming_pipelines\) is corrupt") as info:
        record_from_row("p", tuple(row), {}, "SQLite state store x.db")
    assert repr(value)[:20] in str(info.value)
    row[PIPELINE_COLUMNS.index("trigger_fired_at")] = None
    assert record_from_row("p", tuple(row), {}, "s").trigger_fired_at is None


def test_a_trigger_timer_damaged_in_postgres_fails_the_load(pg_dsn, pg_schema):
    """Damaged with plain SQL (the column retyped to text): the load names pipeline, store and column."""
    from state_store.postgres import PostgresStateStore

    store = PostgresStateStore(pg_dsn, pg_schema)
    try:
        store.commit(BatchCommit(record("damaged", 0, trigger_fired_at=FIRED)))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            names = migrations.postgres_names(pg_schema)
            conn.execute(sql.SQL("ALTER TABLE {pipelines} ALTER COLUMN trigger_fired_at TYPE text").format(**names))
            conn.execute(sql.SQL("UPDATE {pipelines} SET trigger_fired_at = 'soon'").format(**names))
        with pytest.raises(CorruptState) as info:
            store.load("damaged", groups=False)
        text = str(info.value)
        assert "pipeline 'damaged'" in text and store.description in text and "column 'trigger_fired_at'" in text
        assert "'soon'" in text
    finally:
        store.close()
