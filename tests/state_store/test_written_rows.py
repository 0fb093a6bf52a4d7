"""Schema step 6: each key's last written row and the interval trigger's timer.

The timer (``PipelineRecord.trigger_fired_at``) on the three stores; the written rows a store of
schema 6 or 7 holds (``RecoveredState.written``, loaded like the emitted flags of step 5,
test_stored_rows.py) on SQLite and PostgreSQL, since commits write no rows any more; the step
itself, on a store at version 5, is in test_schema_migrations.py.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from ematix_dagster.errors import CorruptState
from state_store import codec, migrations, whole_window
from state_store._common import PIPELINE_COLUMNS, record_from_row
from state_store.contract import BatchCommit
from tests.state_store.contract_stores import FIXTURES, blob, end, groups_of, key, record, segment
from tests.state_store.legacy_rows import ROW_KINDS, write_rows

FIRED = 1_700_000_000_500_000  # a batch time, µs


def written(n: int) -> bytes:
    """An engine's written row: opaque bytes to the store (zero bytes and every byte value included)."""
    return bytes([0, n]) + bytes(range(256)) + b"row %d" % n


def test_the_trigger_timer_commits_and_loads_with_the_record(make_store):
    store = make_store()
    p = "timer"
    store.commit(BatchCommit(record(p, 0, trigger_fired_at=FIRED)))
    for s in (store, make_store()):  # a restarted process sees the same
        assert s.load(p).record.trigger_fired_at == FIRED
    store.commit(BatchCommit(record(p, 1, trigger_fired_at=FIRED + 1)))
    assert store.load(p).record.trigger_fired_at == FIRED + 1
    store.commit(BatchCommit(record(p, 2)))  # the record is rewritten whole: no timer now
    assert store.load(p).record.trigger_fired_at is None


@pytest.mark.parametrize("kind", ROW_KINDS)
def test_stored_written_rows_load_beside_their_groups_and_migrate_state_keeps_them(make_store):
    """A row's written row loads by (window_start, key), a NULL one left out, in the same snapshot
    as the flags (their own column); migrate_state keeps it."""
    store = make_store()
    p = "written"
    v1 = (FIXTURES / "counts.state.bin").read_bytes()  # an older blob: migrate_state rewrites its row
    store.commit(BatchCommit(record(p, 0)))
    write_rows(store, p, [(0, 10, key("a"), blob(1), True, written(1)), (20, 30, key("a"), blob(2), False, written(2)),
                          (0, 15, key("b"), v1, None, written(3)), (60, end(60), key("f"), blob(3))])
    rows = {(0, key("a")): written(1), (20, key("a")): written(2), (0, key("b")): written(3)}
    for s in (store, make_store()):  # a restarted process sees the same
        state = s.load(p)
        assert state.written == rows and all(type(row) is bytes for row in state.written.values())
        assert state.emitted == {(0, key("a")): True, (20, key("a")): False}
        assert s.load(p, groups=False).written == {}
    assert store.migrate_state(p) == 1 and store.load(p).written == rows


@pytest.mark.parametrize("kind", ROW_KINDS)
def test_whole_window_rows_carry_no_written_row_and_group_rows_over_them_do(make_store):
    store = make_store()
    p = "whole-written"
    store.commit(BatchCommit(record(p, 0)))
    groups = {key("a"): blob(10), key("b"): blob(11)}
    write_rows(store, p, [(0, end(0), whole_window.WINDOW_KEY, whole_window.window_blob(
        codec.STATE_VERSION, list(groups), list(groups.values()))), (0, end(0), key("b"), blob(12), None, written(12))])
    state = store.load(p)  # (0, a) from the whole window, without a written row; (0, b)'s own row keeps one
    assert groups_of(state) == {(0, key("a")): blob(10), (0, key("b")): blob(12)}
    assert state.written == {(0, key("b")): written(12)}


def test_reset_forgets_written_rows_and_the_timer(make_store, kind):
    store = make_store()
    p = "reset-written"
    store.commit(BatchCommit(record(p, 0, trigger_fired_at=FIRED)))
    if kind in ROW_KINDS:
        write_rows(store, p, [(0, end(0), key("a"), blob(1), None, written(1))])
    store.reset(p)
    assert store.load(p).record is None
    store.commit(BatchCommit(record(p, 0)))
    state = store.load(p)
    assert state.written == {} and state.groups == [] and state.record.trigger_fired_at is None


@pytest.mark.parametrize("fired", ["1700000000", True, 1.5])
def test_a_malformed_trigger_timer_is_refused_before_anything_is_written(make_store, fired):
    store = make_store()
    p = "refused"
    store.commit(BatchCommit(record(p, 0, trigger_fired_at=FIRED), segments=[segment(0, a=0)]))
    with pytest.raises(TypeError, match="trigger_fired_at"):
        store.commit(BatchCommit(record(p, 1, trigger_fired_at=fired), segments=[segment(0, a=1)]))
    state = store.load(p)
    assert state.record.last_batch_id == 0 and state.record.trigger_fired_at == FIRED
    assert state.segments == [segment(0, a=0)]


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
    from state_store.postgres_store import PostgresStateStore

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
