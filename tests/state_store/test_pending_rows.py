"""Schema step 7 on the three stores: pending rows, output rows held back by ``WATERMARK_TS()``
(docs/contract/row-pipelines.md).

The store contract of ``BatchCommit.pending_inserts`` / ``pending_released`` / ``pending_released_up_to``, ``load_pending``,
``pending_summary`` and ``reset``'s count; the step itself on a store at version 6 (as
test_schema_migrations.py does for step 6); the event-time index; SQLite's 0600 files; the reset
line of the CLI.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat

import psycopg
import pytest
from psycopg import sql

from ematix_dagster.errors import CorruptState
from state_store import codec, migrations, pending
from state_store.contract import BatchCommit, PendingRow, PendingSummary
from state_store.sqlite import SqliteStateStore
from tests.state_store.contract_stores import blob, groups_of, key, record, segment
from tests.state_store.legacy_rows import insert_rows
from tests.state_store.old_schemas import STATE_COLUMNS

P = "delayed"
ALL = 2**63 - 1  # a bound past every release time


def payload(n: int) -> bytes:
    """An engine's payload: opaque bytes to the store (zero bytes and every byte value included)."""
    return bytes([0, n]) + bytes(range(256)) + b"secret %d" % n


def row(release_us: int, arrival_batch: int, seq: int, event_ts: int | None = 7, n: int = 0) -> PendingRow:
    return PendingRow(release_us, arrival_batch, seq, event_ts, payload(n))


def keys(rows: list[PendingRow]) -> list[tuple[int, int, int]]:
    return [r.key for r in rows]


def test_pending_rows_load_in_release_order_across_commits_and_restarts(make_store):
    """Ties on the release time go by arrival batch, then by position (seq), never by insertion order
    or event time; payloads and NULL event times come back as stored."""
    store = make_store()
    first = [row(300, 0, 0, 1, n=1), row(100, 0, 5, 2, n=2), row(100, 0, 3, None, n=3), row(200, 0, 4, 3, n=4)]
    second = [row(100, 1, 0, 0, n=5), row(50, 1, 1, 9, n=6), row(200, 1, 2, None, n=7)]
    store.commit(BatchCommit(record(P, 0), pending_inserts=first))
    store.commit(BatchCommit(record(P, 1), pending_inserts=second))
    for s in (store, make_store()):  # a restarted process sees the same
        loaded = s.load_pending(P, ALL)
        assert keys(loaded) == [(50, 1, 1), (100, 0, 3), (100, 0, 5), (100, 1, 0), (200, 0, 4), (200, 1, 2),
                                (300, 0, 0)]
        assert loaded == sorted(first + second, key=lambda r: r.key)  # event times and payloads included
        assert all(type(r.payload) is bytes and type(r.seq) is int for r in loaded)
        assert s.load_pending("another", ALL) == []
    assert groups_of(store.load(P)) == {}  # pending rows are not window state


def test_the_release_bound_is_inclusive(make_store):
    store = make_store()
    rows = [row(-5, 0, 0), row(100, 0, 1), row(200, 0, 2), row(200, 0, 3), row(300, 0, 4)]
    store.commit(BatchCommit(record(P, 0), pending_inserts=rows))
    assert keys(store.load_pending(P, 199)) == [(-5, 0, 0), (100, 0, 1)]
    assert keys(store.load_pending(P, 200)) == [(-5, 0, 0), (100, 0, 1), (200, 0, 2), (200, 0, 3)]
    assert keys(store.load_pending(P, -6)) == [] and keys(store.load_pending(P, -5)) == [(-5, 0, 0)]
    assert store.load_pending(P, ALL) == rows and store.load_pending(P, -(2**63)) == []


def test_each_commit_stores_the_output_watermark_its_pending_rows_give(make_store):
    """Schema step 11: the record's output watermark, computed by the store in the commit's transaction: the
    releasing watermark (``release_watermark`` under ``[emit]``, else ``watermark``) kept back to the smallest
    event time left pending after the batch (rows without one never keep it back); None while W is."""
    store = make_store()
    commits = [  # (watermark, release_watermark, inserted, released keys)
        (None, None, [row(900, 0, 0, 40)], []),
        (100, None, [row(900, 1, 0, 60), row(900, 1, 1, None)], []),
        (150, None, [], [(900, 0, 0)]),
        (150, 50, [], []),
        (300, 250, [], [(900, 1, 0)]),
    ]
    held: dict[tuple[int, int, int], int | None] = {}
    for batch_id, (watermark, release, inserted, released) in enumerate(commits):
        committed = record(P, batch_id, watermark=watermark, release_watermark=release, output_watermark=-1)
        store.commit(BatchCommit(committed, pending_inserts=inserted, pending_released=released))
        held.update({r.key: r.event_ts for r in inserted})
        for done in released:
            del held[done]
        releasing = release if release is not None else watermark
        times = [ts for ts in held.values() if ts is not None]
        want = None if releasing is None else min([releasing, *times])
        assert [s.load(P).record.output_watermark for s in (store, make_store())] == [want, want], batch_id
        assert committed.output_watermark == want  # the committed record says what the store wrote


def test_load_pending_with_a_limit_returns_the_first_rows_due(make_store):
    store = make_store()
    rows = [row(10 * i, 0, i) for i in range(5)]
    store.commit(BatchCommit(record(P, 0), pending_inserts=rows[::-1]))
    assert store.load_pending(P, ALL, limit=2) == rows[:2]
    assert store.load_pending(P, 25, limit=10) == rows[:3]
    assert store.load_pending(P, 25, limit=3) == rows[:3] and store.load_pending(P, 0, limit=3) == rows[:1]
    assert store.load_pending(P, ALL, limit=0) == []
    for bound, limit in ((ALL, -1), (ALL, 1.5), (ALL, True), ("100", None), (2**63, None), (1.0, None)):
        with pytest.raises(TypeError, match="limit|up_to_release_us"):
            store.load_pending(P, bound, limit=limit)


def test_released_rows_leave_with_the_commit_that_releases_them(make_store):
    """Releasing deletes by key in the batch's transaction; a key that is not stored (a replay of a
    batch whose first commit released it) is no error."""
    store = make_store()
    a, b, c, d = row(100, 0, 0, n=1), row(100, 0, 1, n=2), row(200, 0, 2, n=3), row(150, 1, 0, n=4)
    store.commit(BatchCommit(record(P, 0), pending_inserts=[a, b, c]))
    store.commit(BatchCommit(record(P, 1), pending_inserts=[d], pending_released=[a.key, c.key, (999, 9, 9)]))
    for s in (store, make_store()):
        assert s.load_pending(P, ALL) == [b, d]
    store.commit(BatchCommit(record(P, 2), pending_released=[a.key, c.key]))  # the same release again
    assert store.load_pending(P, ALL) == [b, d]


def test_a_commit_that_fails_leaves_the_pending_rows_as_they_were(make_store):
    """Inserts and releases are part of the batch's one transaction: a failing in_transaction
    callback (the target's write) undoes them with everything else."""
    store = make_store()
    a, b = row(100, 0, 0, 5, n=1), row(200, 0, 1, 6, n=2)
    store.commit(BatchCommit(record(P, 0), segments=[segment(0, k=1)], pending_inserts=[a, b]))
    before = store.pending_summary(P)

    def target_fails(conn) -> None:
        raise RuntimeError("the target write failed")

    with pytest.raises(RuntimeError, match="target write failed"):
        store.commit(BatchCommit(record(P, 1), segments=[segment(0, k=2)],
                                 pending_inserts=[row(50, 1, 0, 1, n=3)], pending_released=[a.key],
                                 in_transaction=[target_fails]))
    for s in (store, make_store()):
        assert s.load_pending(P, ALL) == [a, b] and s.pending_summary(P) == before
        state = s.load(P)
        assert state.record.last_batch_id == 0 and state.segments == [segment(0, k=1)]


def test_replaying_a_batch_inserts_nothing_twice(make_store):
    """A replayed batch recomputes the same rows: their re-insert is a no-op, and its rows that are not
    stored yet are inserted."""
    store = make_store()
    a, b, c = row(100, 0, 0, n=1), row(200, 0, 1, None, n=2), row(300, 0, 2, n=3)
    batch = BatchCommit(record(P, 0), pending_inserts=[a, b])
    store.commit(batch)
    store.commit(batch)
    assert store.load_pending(P, ALL) == [a, b] and store.pending_summary(P).rows == 2
    store.commit(BatchCommit(record(P, 0), pending_inserts=[c, b, a]))
    assert store.load_pending(P, ALL) == [a, b, c] and store.pending_summary(P).rows == 3


@pytest.mark.parametrize("change", [
    dict(payload=b"another payload"), dict(payload=payload(1)[:-1]), dict(event_ts=8), dict(event_ts=None)])
def test_a_key_stored_with_another_row_fails_the_commit_and_writes_nothing(make_store, change):
    store = make_store()
    a, b = row(100, 0, 0, 7, n=1), row(200, 0, 1, 7, n=2)
    store.commit(BatchCommit(record(P, 0), pending_inserts=[a, b]))
    with pytest.raises(CorruptState) as info:
        store.commit(BatchCommit(record(P, 1), segments=[segment(0, k=1)],
                                 pending_inserts=[row(50, 1, 0, n=3), b._replace(**change)], pending_released=[a.key]))
    text = str(info.value)
    assert f"pipeline {P!r}" in text and store.description in text
    assert "(release_us=200, arrival_batch=0, seq=1)" in text and "reset" in text
    assert "secret" not in text and "another payload" not in text  # payloads are not public
    for s in (store, make_store()):
        assert s.load_pending(P, ALL) == [a, b]
        assert s.load(P).record.last_batch_id == 0 and s.load(P).segments == []


def test_the_summary_counts_rows_and_bytes_and_names_the_next_release_and_smallest_event_time(make_store):
    store = make_store()
    assert store.pending_summary(P) == PendingSummary(rows=0, payload_bytes=0, next_release_us=None,
                                                      min_event_ts=None)
    early = row(100, 0, 0, None, n=1)  # first to leave, no event time
    oldest = row(300, 0, 1, 50, n=2)  # the smallest event time leaves last
    mid = row(200, 0, 2, 70, n=3)
    store.commit(BatchCommit(record(P, 0), pending_inserts=[oldest, early, mid]))
    store.commit(BatchCommit(record("another", 0), pending_inserts=[row(1, 0, 0, -40, n=4)]))
    size = sum(len(r.payload) for r in (early, oldest, mid))
    for s in (store, make_store()):
        assert s.pending_summary(P) == PendingSummary(rows=3, payload_bytes=size, next_release_us=100,
                                                      min_event_ts=50)
    store.commit(BatchCommit(record(P, 1), pending_released=[early.key, oldest.key]))
    assert store.pending_summary(P) == PendingSummary(1, len(mid.payload), 200, 70)
    store.commit(BatchCommit(record(P, 2), pending_inserts=[row(400, 2, 0, None, n=5)], pending_released=[mid.key]))
    assert store.pending_summary(P) == PendingSummary(1, len(payload(5)), 400, None)  # no event time among them
    assert store.pending_summary("another") == PendingSummary(1, len(payload(4)), 1, -40)


def test_reset_discards_the_pending_rows_and_says_how_many(make_store):
    store = make_store()
    store.commit(BatchCommit(record(P, 0), pending_inserts=[row(100, 0, i) for i in range(3)]))
    store.commit(BatchCommit(record("kept", 0), pending_inserts=[row(100, 0, 0), row(100, 0, 1)]))
    assert store.reset(P) == 3
    for s in (store, make_store()):
        assert s.load_pending(P, ALL) == [] and s.pending_summary(P) == PendingSummary(0, 0, None, None)
        assert s.load(P).record is None
        assert keys(s.load_pending("kept", ALL)) == [(100, 0, 0), (100, 0, 1)]  # another pipeline's stay
    assert store.reset(P) == 0 and store.reset("never-existed") == 0
    store.acquire_lease("kept", "me")  # the lease holder resets too
    assert store.reset("kept") == 2 and store.lease_holder("kept") == "me"


GOOD = row(100, 0, 0)


@pytest.mark.parametrize("batch,match", [
    (dict(pending_inserts=[(100, 0, 0, None, b"x")]), "must be a PendingRow, got a tuple"),
    (dict(pending_inserts=[PendingRow(True, 0, 0, None, b"x")]), "release_us must be an int"),
    (dict(pending_inserts=[PendingRow(2**63, 0, 0, None, b"x")]), "release_us must be an int"),
    (dict(pending_inserts=[PendingRow(100, -1, 0, None, b"x")]), "arrival_batch must be an int from 0"),
    (dict(pending_inserts=[PendingRow(100, 0, 2**31, None, b"x")]), "seq must be an int from 0 to 2147483647"),
    (dict(pending_inserts=[PendingRow(100, 0, -1, None, b"x")]), "seq must be an int from 0"),
    (dict(pending_inserts=[PendingRow(100, 0, 0, 1.5, b"x")]), "event_ts must be an int .* or None"),
    (dict(pending_inserts=[PendingRow(100, 0, 0, None, "secret text")]), "payload must be bytes, got a str"),
    (dict(pending_inserts=[GOOD, PendingRow(100, 0, 1, None, bytearray(b"x"))]), "payload must be bytes"),
    (dict(pending_inserts=(GOOD,)), "must be lists"),
    (dict(pending_inserts=[GOOD, GOOD._replace(payload=b"y")]), r"\(release_us=100, arrival_batch=0, seq=0\) is "
                                                                 "inserted twice"),
    (dict(pending_released=[(1, 0, 0), (2, 0, 0), (1, 0, 0)]), "released twice"),
    (dict(pending_released=[[1, 0, 0]]), "named by its key"),
    (dict(pending_released=[(1, 0)]), "named by its key"),
    (dict(pending_released=[(1, 0, "0")]), "named by its key"),
    (dict(pending_released=[(1, 0, 2**31)]), "named by its key"),
    (dict(pending_inserts=[GOOD], pending_released=[GOOD.key]), "both inserted and released in one commit: a row "
                                                                "released in the batch it arrived in"),
    (dict(pending_inserts=[GOOD], pending_released_up_to=100), r"\(release_us=100, arrival_batch=0, seq=0\) is "
                                                               "inserted by a commit that releases every row up to 100"),
    (dict(pending_released_up_to="100"), "pending_released_up_to must be None or an int"),
    (dict(pending_released_up_to=2**63), "pending_released_up_to must be None or an int"),
])
def test_malformed_pending_lists_are_refused_before_anything_is_written(make_store, batch, match):
    store = make_store()
    stored = row(5, 0, 9, n=1)
    store.commit(BatchCommit(record(P, 0), pending_inserts=[stored]))
    with pytest.raises(TypeError, match=match) as info:
        store.commit(BatchCommit(record(P, 1), segments=[segment(0, k=1)], **batch))
    assert "secret" not in str(info.value)
    assert store.load_pending(P, ALL) == [stored] and store.load(P).record.last_batch_id == 0


# ---- schema step 7 -------------------------------------------------------------------------------


def _columns(kind: str, conn, table: str) -> tuple[list[str], list[str]]:
    """(column names in order, primary-key columns in key order) of a table, from the catalog."""
    if kind == "sqlite":
        info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
        return [c[1] for c in info], [c[1] for c in sorted(info, key=lambda c: c[5]) if c[5]]
    names = [r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                        "current_schema() AND table_name = %s ORDER BY ordinal_position", (table,))]
    key_columns = [r[0] for r in conn.execute(
        "SELECT k.column_name FROM information_schema.table_constraints c JOIN information_schema.key_column_usage k "
        "USING (constraint_schema, constraint_name) WHERE c.table_schema = current_schema() AND c.table_name = %s "
        "AND c.constraint_type = 'PRIMARY KEY' ORDER BY k.ordinal_position", (table,))]
    return names, key_columns


def test_schema_step_7_adds_the_pending_table_and_keeps_everything(schema_store):
    """A store at schema version 6 opens at 7 with its groups, flags, written rows, offsets and record
    as they were (PostgreSQL rewrites none of its tables) and an empty pending table keyed in
    release order, after which pending rows round-trip."""
    kind, build, connect = schema_store
    conn = connect()
    rows = [(0, 10, key("a"), blob(1), codec.STATE_VERSION, 1, b"\x00written"),
            (60, 70, key("b"), blob(2), codec.STATE_VERSION, None, None)]
    columns = (*STATE_COLUMNS, "emitted", "written_row")
    pipelines = ("INSERT INTO ematix_streaming_pipelines (pipeline_name, state_version, last_batch_id, watermark, "
                 "trigger_fired_at, updated_at) VALUES ('v6', %s, 3, 77, 5000, 'now')")
    offsets = ("INSERT INTO ematix_streaming_offsets (pipeline_name, source_id, batch_id, offset_json, state_version, "
               "updated_at) VALUES ('v6', 'clicks', 3, '{\"logOffset\": 3}', %s, 'now')")
    if kind == "sqlite":
        conn.isolation_level = None
        migrations.apply_sqlite(conn, "v6", migrations.STEPS[:6])
        insert_rows(kind, conn, migrations.sqlite_names(), "v6", columns, rows)
        conn.execute(pipelines.replace("%s", "?"), (codec.STATE_VERSION,))
        conn.execute(offsets.replace("%s", "?"), (codec.STATE_VERSION,))
        before = None
    else:
        schema = conn.execute("SELECT current_schema()").fetchone()[0]
        with psycopg.connect(conn.info.dsn) as tx:
            migrations.apply_postgres(tx, schema, "v6", migrations.STEPS[:6])
        insert_rows(kind, conn, migrations.postgres_names(schema), "v6", columns,
                    [(*r[:5], None if r[5] is None else bool(r[5]), r[6]) for r in rows])
        conn.execute(pipelines, (codec.STATE_VERSION,))
        conn.execute(offsets, (codec.STATE_VERSION,))
        before = conn.execute(_FILENODES).fetchone()
    conn.close()
    store = build()
    store.open()
    try:
        check = connect()
        versions = check.execute("SELECT version, description FROM ematix_streaming_schema_version "
                                 "ORDER BY version").fetchall()
        assert [v for v, _ in versions][:7] == [1, 2, 3, 4, 5, 6, 7] and "pending rows" in versions[6][1]
        names, key_columns = _columns(kind, check, "ematix_streaming_pending")
        assert names == ["pipeline_name", "release_us", "arrival_batch", "seq", "event_ts", "payload"]
        assert key_columns == ["pipeline_name", "release_us", "arrival_batch", "seq"]
        assert check.execute("SELECT count(*) FROM ematix_streaming_pending").fetchone()[0] == 0
        if kind == "sqlite":
            ddl = check.execute("SELECT sql FROM sqlite_master WHERE name = 'ematix_streaming_pending'").fetchone()[0]
            assert "WITHOUT ROWID, STRICT" in ddl
        else:
            assert check.execute(_FILENODES).fetchone() == before  # no table rewritten
        check.close()
        loaded = store.load("v6")
        assert sorted(loaded.groups) == [(0, 10, key("a"), blob(1)), (60, 70, key("b"), blob(2))]
        assert loaded.emitted == {(0, key("a")): True} and loaded.written == {(0, key("a")): b"\x00written"}
        assert (loaded.record.last_batch_id, loaded.record.watermark, loaded.record.trigger_fired_at) == (3, 77, 5000)
        assert loaded.record.offsets == {"clicks": '{"logOffset": 3}'}
        assert store.pending_summary("v6") == PendingSummary(0, 0, None, None)
        store.commit(BatchCommit(record("v6", 4), pending_inserts=[row(100, 4, 0, n=1)]))
        assert store.load_pending("v6", 100) == [row(100, 4, 0, n=1)]
    finally:
        store.close()


_FILENODES = ("SELECT pg_relation_filenode('ematix_streaming_state'), pg_relation_filenode('ematix_streaming_offsets'), "
              "pg_relation_filenode('ematix_streaming_pipelines')")


def test_the_smallest_event_time_is_an_index_probe(schema_store):
    """The summary's event-time subquery reads the partial (pipeline_name, event_ts) index, its release
    subquery the primary key: neither scans the pending rows (the output watermark asks every batch)."""
    kind, build, connect = schema_store
    store = build()
    store.open()
    try:
        store.commit(BatchCommit(record(P, 0), pending_inserts=[
            row(i, 0, i, None if i % 3 else 10_000 - i, n=i % 200) for i in range(3000)]))
        assert store.pending_summary(P).min_event_ts == 10_000 - 2997
        conn = connect()
        if kind == "sqlite":
            plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + pending._SQ_SUMMARY, (P,) * 3))
        else:
            conn.execute("ANALYZE ematix_streaming_pending")
            names = migrations.postgres_names(conn.execute("SELECT current_schema()").fetchone()[0])
            plan = " | ".join(r[0] for r in conn.execute(
                sql.SQL("EXPLAIN " + pending._SUMMARY).format(**names), (P,) * 3))
        conn.close()
        assert "ematix_streaming_pending_event_ts" in plan, plan
    finally:
        store.close()


# ---- SQLite's files ------------------------------------------------------------------------------


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_sqlite_files_the_store_creates_are_private(tmp_path):
    """The database, its -wal and -shm and the lock files are 0600 even under umask 0 (SQLite alone
    would create 0644 files)."""
    path = tmp_path / "state" / "state.db"
    old = os.umask(0)
    store = SqliteStateStore(path)
    try:
        store.acquire_lease(P, "me")
        store.commit(BatchCommit(record(P, 0), pending_inserts=[row(100, 0, 0)]))
        files = [path, path.with_name("state.db-wal"), path.with_name("state.db-shm"), store.lock_path(P)]
        assert {str(f): _mode(f) for f in files} == {str(f): 0o600 for f in files}
    finally:
        store.close()
        os.umask(old)


def test_an_existing_sqlite_file_keeps_its_mode_with_a_warning(tmp_path, caplog):
    shared, private = tmp_path / "shared.db", tmp_path / "private.db"
    for path, mode in ((shared, 0o640), (private, 0o600)):
        sqlite3.connect(path).close()
        os.chmod(path, mode)
    with caplog.at_level(logging.WARNING, logger="state_store.private_files"):
        for path in (shared, private):
            store = SqliteStateStore(path)
            try:
                store.commit(BatchCommit(record(P, 0), pending_inserts=[row(100, 0, 0)]))
            finally:
                store.close()
    assert _mode(shared) == 0o640 and _mode(private) == 0o600
    messages = [r.getMessage() for r in caplog.records if r.name == "state_store.private_files"]
    assert len(messages) == 1 and str(shared) in messages[0] and "0640" in messages[0]
    assert f"chmod 600 {shared}" in messages[0] and "secret" not in messages[0]


# ---- the CLI -------------------------------------------------------------------------------------


def test_the_reset_command_says_how_many_pending_rows_it_discards(tmp_path, capsys):
    from ematix_dagster.cli import main
    from tests.pipeline_toml import windowed_pipeline_toml

    (tmp_path / "in").mkdir()
    toml = tmp_path / "pipeline.toml"
    toml.write_text(windowed_pipeline_toml("cli-reset", tmp_path))
    store = SqliteStateStore(tmp_path / "state.db")
    try:
        store.commit(BatchCommit(record("cli-reset", 0), pending_inserts=[row(100, 0, i) for i in range(3)]))
    finally:
        store.close()
    assert main(["reset", str(toml), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "discarded 3 pending rows (held back by WATERMARK_TS(), never written to the target)" in out
    assert "secret" not in out
    assert main(["reset", str(toml), "--yes"]) == 0
    assert "discarded 0 pending rows" in capsys.readouterr().out
    store = SqliteStateStore(tmp_path / "state.db")
    try:
        assert store.pending_summary("cli-reset").rows == 0
    finally:
        store.close()
