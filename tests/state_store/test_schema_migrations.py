"""State-store schema migrations (SQLite, PostgreSQL): recorded versions, steps in order, steps 5, 6, 9 and 10
(step 7: test_pending_rows.py)."""

from __future__ import annotations

import json

import psycopg
import pytest

from ematix_dagster.errors import StateVersionError
from state_store import codec, migrations
from state_store.contract import BatchCommit, make_holder
from tests.state_store.contract_stores import blob, key, record
from tests.state_store.legacy_rows import write_rows
from tests.state_store.old_schemas import store_at_schema

# ---- schema migrations (the stores: conftest.py's ``schema_store``) ------------------------------


def test_schema_versions_are_recorded_and_newer_schemas_refused(schema_store):
    kind, build, connect = schema_store
    store = build()
    store.open()
    store.close()
    store.open()  # a second open applies nothing
    store.close()
    conn = connect()
    rows = conn.execute("SELECT version, description FROM ematix_streaming_schema_version ORDER BY version").fetchall()
    assert [r[0] for r in rows] == [s.version for s in migrations.STEPS] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    conn.execute("INSERT INTO ematix_streaming_schema_version (version, description, applied_at) "
                 "VALUES (99, 'from the future', '2030-01-01')")
    if kind == "sqlite":
        conn.commit()
    conn.close()
    with pytest.raises(StateVersionError, match="schema version 99 is newer than this code"):
        build().open()


def test_schema_steps_apply_in_order_each_in_its_own_transaction(schema_store):
    kind, build, connect = schema_store
    store = build()
    store.open()  # every released step
    store.close()
    n = migrations.SCHEMA_VERSION
    extra = [
        migrations.SchemaStep(n + 1, "a probe table", postgres=("CREATE TABLE {schema}.probe_three (x int)",),
                              sqlite=("CREATE TABLE probe_three (x INTEGER)",)),
        migrations.SchemaStep(n + 2, "a step that fails half way",
                              postgres=("CREATE TABLE {schema}.probe_four (x int)", "SELECT 1/0"),
                              sqlite=("CREATE TABLE probe_four (x INTEGER)", "INSERT INTO no_such_table VALUES (1)")),
    ]
    steps = (*migrations.STEPS, *extra)
    if kind == "postgres":
        conn = psycopg.connect(store._resolve())
        with pytest.raises(psycopg.errors.DivisionByZero):
            migrations.apply_postgres(conn, store.schema, store.description, steps)
        conn.close()
    else:
        conn = __import__("sqlite3").connect(store.path, isolation_level=None)
        with pytest.raises(Exception, match="no_such_table"):
            migrations.apply_sqlite(conn, store.description, steps)
        conn.close()
    check = connect()
    versions = [r[0] for r in check.execute("SELECT version FROM ematix_streaming_schema_version ORDER BY 1")]
    assert versions == list(range(1, n + 2))  # the probe step committed, the failing one rolled back whole
    tables = ("SELECT count(*) FROM sqlite_master WHERE name = %s" if kind == "sqlite" else
              "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = %s")
    tables = tables.replace("%s", "?") if kind == "sqlite" else tables
    assert check.execute(tables, ("probe_three",)).fetchone()[0] == 1
    assert check.execute(tables, ("probe_four",)).fetchone()[0] == 0
    check.close()
    with pytest.raises(StateVersionError, match=f"schema version {n + 1} is newer"):
        build().open()  # this code knows n steps


def test_schema_step_5_adds_a_null_emitted_flag_to_existing_rows(schema_store):
    """Rows written before step 5 (fixed windows, and sessions under drop / dlq) keep NULL: a load
    returns no flag for them, and the engine derives a session's from its end and the watermark."""
    kind, build, connect = schema_store
    conn = connect()
    store_at_schema(kind, conn, 4, "old", [(0, 10, key("a"), blob(1), codec.STATE_VERSION)])
    conn.close()
    store = build()
    store.open()
    try:
        state = store.load("old")
        assert state.groups == [(0, 10, key("a"), blob(1))] and state.emitted == {}
        write_rows(store, "old", [(0, 10, key("a"), blob(2), True)])  # as schema 7 wrote a session's row
        assert store.load("old").emitted == {(0, key("a")): True}
    finally:
        store.close()


def test_schema_step_6_adds_null_written_rows_and_trigger_timer_in_place(schema_store):
    """A store at schema version 5 opens at 6 (and on, at 7) with its rows as they were: no written row kept, the
    interval trigger never fired. Both columns are catalog-only additions (PostgreSQL rewrites
    neither table), after which they round-trip; a schema newer than the code is still refused."""
    kind, build, connect = schema_store
    conn = connect()
    flag = 1 if kind == "sqlite" else True
    store_at_schema(kind, conn, 5, "v5", [(0, 10, key("a"), blob(1), codec.STATE_VERSION, flag),
                                          (60, 70, key("b"), blob(2), codec.STATE_VERSION, None)], extra=("emitted",))
    files = _FILENODES if kind == "postgres" else None
    before = conn.execute(files).fetchone() if files else None
    conn.close()
    store = build()
    store.open()
    try:
        check = connect()
        assert check.execute("SELECT max(version) FROM ematix_streaming_schema_version").fetchone()[0] == migrations.SCHEMA_VERSION
        assert check.execute("SELECT written_row FROM ematix_streaming_state").fetchall() == [(None,), (None,)]
        assert check.execute("SELECT trigger_fired_at FROM ematix_streaming_pipelines").fetchall() == [(None,)]
        if files:
            assert check.execute(files).fetchone() == before  # no table rewrite
        check.close()
        state = store.load("v5")
        assert sorted(state.groups) == [(0, 10, key("a"), blob(1)), (60, 70, key("b"), blob(2))]
        assert state.emitted == {(0, key("a")): True} and state.written == {}
        assert state.record.trigger_fired_at is None and state.record.watermark == 77
        store.commit(BatchCommit(record("v5", 4, trigger_fired_at=5_000_000)))
        write_rows(store, "v5", [(60, 70, key("b"), blob(3), None, b"\x00row")])  # as schema 7 wrote one
        again = store.load("v5")
        assert again.written == {(60, key("b")): b"\x00row"} and again.record.trigger_fired_at == 5_000_000
    finally:
        store.close()
    conn = connect()
    conn.execute("INSERT INTO ematix_streaming_schema_version (version, description, applied_at) "
                 "VALUES (%d, 'the next step', '2030-01-01')" % (migrations.SCHEMA_VERSION + 1))
    if kind == "sqlite":
        conn.commit()
    conn.close()
    with pytest.raises(StateVersionError, match=rf"schema version {migrations.SCHEMA_VERSION + 1} is newer than this code \({migrations.SCHEMA_VERSION}\)"):
        build().open()


_FILENODES = ("SELECT pg_relation_filenode('ematix_streaming_state'), "
              "pg_relation_filenode('ematix_streaming_pipelines')")


def test_step_9_moves_the_release_watermark_and_the_last_batch_rows_out_of_the_counters(schema_store):
    """Schema step 9: WATERMARK_TS() of ``[emit] sql`` and the last batch's row count were counters
    (``emit_release_watermark``, ``last_batch_rows_written``); they become the record's own fields,
    with their values, and leave the counters, which keep the rest. A record without them, or with
    no counters at all, gets neither."""
    kind, build, connect = schema_store
    conn = connect()
    store_at_schema(kind, conn, 8, "v8", [])
    counters = {"rows_consumed:a": 5, "emit_release_watermark": 123_000_000, "last_batch_rows_written": 7}
    param = "?" if kind == "sqlite" else "%s"
    for pipeline, stored in (("v8", json.dumps(counters)), ("plain", json.dumps({"rows_consumed:a": 2})),
                             ("empty", None)):
        if pipeline != "v8":
            conn.execute("INSERT INTO ematix_streaming_pipelines (pipeline_name, state_version, updated_at) "
                         f"VALUES ({param}, {param}, {param})", (pipeline, codec.STATE_VERSION, "now"))
        cast = "" if kind == "sqlite" else "::jsonb"
        conn.execute(f"UPDATE ematix_streaming_pipelines SET counters = {param}{cast} WHERE pipeline_name = {param}",
                     (stored, pipeline))
    if kind == "sqlite":
        conn.commit()
    conn.close()
    store = build()
    store.open()
    try:
        moved, plain, empty = (store.load(name).record for name in ("v8", "plain", "empty"))
        assert moved is not None and plain is not None and empty is not None
        assert (moved.release_watermark, moved.last_batch_rows, moved.counters) == (123_000_000, 7, {"rows_consumed:a": 5})
        assert (plain.release_watermark, plain.last_batch_rows, plain.counters) == (None, None, {"rows_consumed:a": 2})
        assert (empty.release_watermark, empty.last_batch_rows, empty.counters) == (None, None, {})
        store.commit(BatchCommit(record("v8", 4, release_watermark=5, last_batch_rows=0)))
        again = store.load("v8").record
        assert again is not None and (again.release_watermark, again.last_batch_rows) == (5, 0)
    finally:
        store.close()


def test_step_10_adds_a_lease_epoch_of_0_in_place_that_the_next_acquisition_raises(schema_store):
    """Schema step 10: a pipeline row of schema 9 reads as "never acquired under a fence" (epoch 0), a
    catalog-only change (PostgreSQL rewrites no table); its holder's first acquisition takes epoch 1 and
    commits as before, with the record as it was."""
    kind, build, connect = schema_store
    conn = connect()
    store_at_schema(kind, conn, 9, "v9", [])
    before = conn.execute(_FILENODES).fetchone() if kind == "postgres" else None
    conn.close()
    store = build()
    store.open()
    try:
        check = connect()
        assert check.execute("SELECT pipeline_name, lease_epoch FROM ematix_streaming_pipelines").fetchall() == [("v9", 0)]
        if before:
            assert check.execute(_FILENODES).fetchone() == before  # no table rewrite
        check.close()
        assert store.load("v9").record.last_batch_id == 3
        store.acquire_lease("v9", make_holder("after-migration"))
        assert store.lease_epoch("v9") == 1
        store.commit(BatchCommit(record("v9", 4)))
        assert store.load("v9").record.last_batch_id == 4
    finally:
        store.close()
    check = connect()
    assert check.execute("SELECT lease_epoch, lease_holder FROM ematix_streaming_pipelines").fetchall() == [(1, None)]
    check.close()


def test_step_11_fills_the_output_watermark_from_the_watermarks_and_the_oldest_pending_row(schema_store):
    """Schema step 11: each pipeline row of schema 10 gets the output watermark its next commit would
    write: the releasing watermark (``release_watermark`` when set, else ``watermark``) kept back to the
    oldest pending event time; NULL while both watermarks are. Later commits keep it current."""
    kind, build, connect = schema_store
    conn = connect()
    store_at_schema(kind, conn, 10, "plain", [])  # watermark 77, nothing pending
    param = "?" if kind == "sqlite" else "%s"
    for pipeline, watermark, release in (("held", 500, None), ("emit", 900, 400), ("never", None, None)):
        conn.execute("INSERT INTO ematix_streaming_pipelines (pipeline_name, state_version, last_batch_id, watermark, "
                     f"release_watermark, updated_at) VALUES ({param}, {param}, 0, {param}, {param}, {param})",
                     (pipeline, codec.STATE_VERSION, watermark, release, "now"))
    for pipeline, event_ts in (("held", 300), ("held", None), ("held", 350), ("emit", 450), ("never", 5)):
        conn.execute("INSERT INTO ematix_streaming_pending (pipeline_name, release_us, arrival_batch, seq, event_ts, "
                     f"payload) VALUES ({param}, 1000, 0, {param}, {param}, {param})",
                     (pipeline, event_ts or 0, event_ts, b"x"))
    if kind == "sqlite":
        conn.commit()
    conn.close()
    store = build()
    store.open()
    try:
        loaded = {name: store.load(name).record for name in ("plain", "held", "emit", "never")}
        # min(W, 300); min(WATERMARK_TS() 400, 450); W 77 with nothing pending; no watermark yet
        assert {name: r.output_watermark for name, r in loaded.items()} == {
            "plain": 77, "held": 300, "emit": 400, "never": None}
        store.commit(BatchCommit(record("held", 1, watermark=200, output_watermark=10**9),
                                 pending_released=[(1000, 0, 300)]))
        assert store.load("held").record.output_watermark == 200  # the store's value, not the caller's
        store.commit(BatchCommit(record("held", 2, watermark=600), pending_released=[(1000, 0, 0)]))
        assert store.load("held").record.output_watermark == 350
    finally:
        store.close()


def test_the_schema_8_emit_fixture_opens_with_the_output_watermark_its_rows_give(tmp_path):
    """The store ``tests/fixtures/state_v8/emit`` (written by schema 8's code, rows held by ``[emit] sql``)
    migrates to the current schema with the output watermark computed from its own tables, read
    here with plain SQL: min(WATERMARK_TS() of its last batch, the smallest pending window end)."""
    import shutil
    import sqlite3
    from pathlib import Path

    from state_store.sqlite import SqliteStateStore

    fixture = Path(__file__).parents[1] / "fixtures" / "state_v8" / "emit" / "state.db"
    db = tmp_path / "state.db"
    shutil.copy(fixture, db)
    with sqlite3.connect(fixture) as conn:
        counters, = conn.execute("SELECT counters FROM ematix_streaming_pipelines WHERE pipeline_name = 'v8_emit'"
                                 ).fetchone()
        oldest, = conn.execute("SELECT min(event_ts) FROM ematix_streaming_pending WHERE pipeline_name = 'v8_emit'"
                               ).fetchone()
    conn.close()
    release = json.loads(counters)["emit_release_watermark"]
    assert oldest is not None and release is not None
    store = SqliteStateStore(db)
    store.open()
    try:
        stored = store.load("v8_emit", groups=False).record
        assert stored is not None and stored.release_watermark == release
        assert stored.output_watermark == min(release, oldest)
    finally:
        store.close()
