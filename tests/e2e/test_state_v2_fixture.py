"""Committed state at schema version 2 still loads, migrates and continues exactly.

``tests/fixtures/state_v2/`` was written by ``make_fixtures.py`` with the code before the schema
step that added ``window_end``: version-2 blobs, and a real pipeline stopped half way (its SQLite
store file at schema version 2, its Spark checkpoint, its target so far). Opening a copy of that
store runs the migration; the pipeline then resumes over the rest of the input and its whole
target must equal the pandas oracle's, so a migration that lost, shifted or re-keyed a window
fails here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ematix_dagster.spec import load_pipeline_str
from state_store import migrations
from tests.e2e.lateness_helpers import at, row
from tests.pipeline_toml import windowed_pipeline_toml

FIXTURES = Path(__file__).parent.parent / "fixtures" / "state_v2"
# The committed run was made from spec() and minute_rows() below: changing them breaks the fixture.
FIRST_RUN_MINUTES = 3  # input files (= micro-batches) the committed run consumed
MINUTES = 6
DURATION_MS, HOP_MS = 120_000, 60_000  # hopping: window_end must come from the duration, not the hop


def spec(root: Path):
    return load_pipeline_str(windowed_pipeline_toml("v2_fixture", root, window_kind="hopping", duration_ms=DURATION_MS,
                                                    hop_ms=HOP_MS, lateness_ms=30_000))


def minute_rows(minute: int) -> list[dict[str, Any]]:
    """Deterministic rows of one input file: three keys, and one row back in the previous minute."""
    out = []
    for i in range(5):
        second = (13 * i + 7 * minute) % 60
        out.append(row(100 * minute + i, f"k{(i + minute) % 3}", i * minute - 2, at(minute, second), page=f"p{i % 3}"))
    out.append(row(100 * minute + 9, "k0", 7, at(minute, 0) if minute == 0 else at(minute - 1, 45), page="late"))
    return out


def write_minute(files, minute: int):
    from tests.e2e.lateness_helpers import SCHEMA

    files.count = minute
    return files.write(minute_rows(minute), schema=SCHEMA)


# ---- the version-2 blobs ---------------------------------------------------------------------------


def test_v2_blobs_decode_to_the_fixture_values_and_reencode_to_the_same_bytes():
    from state_store import codec
    from tests.state_store.test_codec import same, typed_value

    v1 = FIXTURES.parent / "state_v1"
    expected = json.loads((v1 / "expected.json").read_text())
    assert codec.STATE_VERSION == 2, "a new state version: keep these fixtures, add state_v3 ones"
    for case, doc in expected.items():
        key_bytes = (FIXTURES / "blobs" / f"{case}.key.bin").read_bytes()
        blob = (FIXTURES / "blobs" / f"{case}.state.bin").read_bytes()
        assert blob[0] == 2, f"{case} must stay a committed version-2 blob"
        assert key_bytes == (v1 / f"{case}.key.bin").read_bytes(), case  # the key format never changes
        assert same(codec.decode_key(key_bytes), tuple(typed_value(v) for v in doc["key"])), case
        got, want = codec.decode_state(blob), [typed_value(v) for v in doc["state"]]
        assert len(got) == len(want), case
        for g, w in zip(got, want):
            assert (type(g) is set and g == w) if isinstance(w, set) else same(g, w), (case, g, w)
        assert codec.encode_state(got) == blob, case  # continuing re-encodes the very same bytes
        assert codec.migrate((v1 / f"{case}.state.bin").read_bytes(), 1) == blob, case  # v1 -> v2 is this encoding


# ---- the SQLite store file at schema version 2, and its run --------------------------------------


def _install(root: Path) -> None:
    """The committed run's store, checkpoint and target, as if the run had happened in ``root``."""
    src = FIXTURES / "pipeline"
    shutil.copyfile(src / "state.db", root / "state.db")
    shutil.copytree(src / "out", root / "out")
    shutil.copytree(src / "cp", root / "cp")
    for path in (root / "cp").rglob("*"):
        if path.is_file():
            path.write_bytes(path.read_bytes().replace(b"@ROOT@", str(root).encode()))


def test_sqlite_store_at_schema_2_migrates_and_the_run_continues_exactly(spark, tmp_path, batch_files):
    import sqlite3

    from ematix_dagster.operations import check, summary
    from state_store.sqlite import SqliteStateStore
    from tests import oracle
    from tests.e2e.lateness_helpers import Feed, compare_output, oracle_params, run

    _install(tmp_path)
    db = tmp_path / "state.db"
    with sqlite3.connect(db) as conn:  # the committed file really is the old layout
        assert conn.execute("SELECT max(version) FROM ematix_streaming_schema_version").fetchone()[0] == 2
        columns = [r[1] for r in conn.execute("PRAGMA table_info(ematix_streaming_state)")]
        assert "window_end" not in columns
        before = sorted(conn.execute("SELECT window_start, group_key, state_blob FROM ematix_streaming_state"))
    conn.close()
    assert before, "the fixture holds open windows"

    store = SqliteStateStore(db)
    store.open()  # schema step 3 runs here
    try:
        groups = store.load("v2_fixture").groups
    finally:
        store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max(version) FROM ematix_streaming_schema_version").fetchone()[0] == migrations.SCHEMA_VERSION
        after = sorted(conn.execute(
            "SELECT window_start, window_end, group_key, state_blob FROM ematix_streaming_state"))
    conn.close()
    size = DURATION_MS * 1_000  # the stored spec's duration, not its hop
    assert [(s, k, b) for s, _, k, b in after] == before  # nothing lost, moved or rewritten
    assert all(e == s + size for s, e, _, _ in after)
    assert sorted(groups) == after

    spec_ = spec(tmp_path)
    files, feed = batch_files("in"), Feed()
    for minute in range(MINUTES):  # the committed run read the first files; the rest is new input
        assert files.count == minute
        feed.parquet("a", files, minute_rows(minute))
    assert check(spec_).healthy
    result, _ = run(spec_, spark)
    assert [r.batch_id for r in result.reports] == list(range(FIRST_RUN_MINUTES, MINUTES))

    expected = oracle.run(feed.batches(spec_.run.checkpoint_location, ["a"]), oracle_params(spec_))
    got = compare_output(spec_, expected, old_batches=FIRST_RUN_MINUTES)  # the committed run's rows included
    assert set(got) >= {1, 2} and max(got) >= FIRST_RUN_MINUTES
    state = summary(spec_)
    assert state["last_batch_id"] == MINUTES - 1 and state["open_windows"] == expected.windows_left_open
    assert state["counters"]["rows_consumed:a"] == sum(len(minute_rows(m)) for m in range(MINUTES))
    with sqlite3.connect(db) as conn:  # rows written after the migration carry their end too
        assert conn.execute("SELECT count(*) FROM ematix_streaming_state WHERE window_end IS NULL "
                            "OR window_end <> window_start + ?", (size,)).fetchone()[0] == 0
    conn.close()


# ---- the schema step on both databases, by hand ----------------------------------------------------


OLD_STEPS = 2  # the schema before window_end (steps are append-only: these are the released statements)


def _old_store(kind: str, tmp_path: Path, request):
    """A store at schema version 2 holding rows of three pipelines, written with plain SQL."""

    docs = {"tumbling": {"window.kind": "tumbling", "window.duration_ms": 60_000},
            "hopping": {"window.kind": "hopping", "window.duration_ms": 300_000, "window.hop_ms": 60_000},
            "no-duration": {}}
    rows = [(p, start, f"{p}-{start}".encode(), b"\x02\x90") for p in docs for start in (0, 60_000_000, -120_000_000)]
    if kind == "sqlite":
        import sqlite3

        from state_store.sqlite import SqliteStateStore

        path = tmp_path / "old.db"
        conn = sqlite3.connect(path, isolation_level=None)
        migrations.apply_sqlite(conn, "old", migrations.STEPS[:OLD_STEPS])
        for p, doc in docs.items():
            conn.execute("INSERT INTO ematix_streaming_pipelines (pipeline_name, state_version, last_batch_id, "
                         "fingerprint_doc, updated_at) VALUES (?, 2, 4, ?, 'now')", (p, json.dumps(doc)))
        conn.executemany("INSERT INTO ematix_streaming_state (pipeline_name, window_start, group_key, state_blob, "
                         "state_version, updated_at) VALUES (?, ?, ?, ?, 2, 'now')", rows)
        conn.close()

        def query(text: str):
            with sqlite3.connect(path) as c:
                out = c.execute(text).fetchall()
            c.close()
            return out

        return (lambda: SqliteStateStore(path)), query
    import psycopg
    from psycopg import sql
    from psycopg.types.json import Jsonb

    from state_store.postgres_store import PostgresStateStore

    dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
    with psycopg.connect(dsn) as conn:
        migrations.apply_postgres(conn, schema, "old", migrations.STEPS[:OLD_STEPS])
        names = migrations.postgres_names(schema)
        with conn.transaction():
            for p, doc in docs.items():
                conn.execute(sql.SQL("INSERT INTO {pipelines} (pipeline_name, state_version, last_batch_id, "
                                     "fingerprint_doc) VALUES (%s, 2, 4, %s)").format(**names), (p, Jsonb(doc)))
            with conn.cursor() as cur:
                cur.executemany(sql.SQL("INSERT INTO {state} (pipeline_name, window_start, group_key, state_blob, "
                                        "state_version) VALUES (%s, %s, %s, %s, 2)").format(**names), rows)

    def query(text: str):
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in c.execute(text).fetchall()]

    return (lambda: PostgresStateStore(dsn, schema)), query


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_schema_steps_fill_window_end_and_drop_the_emitted_list(kind, tmp_path, request):
    from state_store.contract import BatchCommit, PipelineRecord

    build, query = _old_store(kind, tmp_path, request)
    assert query("SELECT max(version) FROM ematix_streaming_schema_version") == [(OLD_STEPS,)]
    store = build()
    store.open()
    try:
        assert query("SELECT max(version) FROM ematix_streaming_schema_version") == [(migrations.SCHEMA_VERSION,)]
        columns = {c for (c,) in query(
            "SELECT name FROM pragma_table_info('ematix_streaming_pipelines')" if kind == "sqlite" else
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = 'ematix_streaming_pipelines'")}
        assert "emitted" not in columns and "watermark" in columns  # step 4
        ends = {(p, s): e for p, s, e in query(
            "SELECT pipeline_name, window_start, window_end FROM ematix_streaming_state")}
        assert len(ends) == 9
        for (p, start), end in ends.items():
            size = {"tumbling": 60_000_000, "hopping": 300_000_000, "no-duration": None}[p]  # hopping: the duration
            assert end == (None if size is None else start + size), (p, start)
        for p in ("tumbling", "hopping"):
            assert sorted((s, e) for s, e, _, _ in store.load(p).groups) == sorted(
                (s, e) for (q, s), e in ends.items() if q == p)
        # a row the step could not fill is filled on load once the pipeline's record names its duration
        assert {e for _, e, _, _ in store.load("no-duration").groups} == {None}
        store.commit(BatchCommit(PipelineRecord("no-duration", 2, last_batch_id=5,
                                                fingerprint_doc={"window.duration_ms": 1_000})))
        assert sorted((s, e) for s, e, _, _ in store.load("no-duration").groups) == [
            (s, s + 1_000_000) for s in (-120_000_000, 0, 60_000_000)]
    finally:
        store.close()
    build().open()  # a second open applies nothing
    assert query("SELECT max(version) FROM ematix_streaming_schema_version") == [(migrations.SCHEMA_VERSION,)]


def test_a_stored_end_that_is_not_the_window_kinds_is_refused_on_restore(tmp_path):
    import sqlite3

    from ematix_dagster.errors import CorruptState
    from ematix_dagster.streaming.durable import restore_engine
    from ematix_dagster.streaming.micro_batch import Engine
    from state_store.sqlite import SqliteStateStore

    _install(tmp_path)
    spec_ = spec(tmp_path)

    def restore():
        engine = Engine.for_window(spec_.pipeline_name, spec_.window, spec_.source_names, (None, True, None))
        with SqliteStateStore(tmp_path / "state.db") as store:
            record = restore_engine(engine, store.load(spec_.pipeline_name), store.description)
        return engine, record

    engine, record = restore()  # the migrated fixture restores as is
    assert record.last_batch_id == FIRST_RUN_MINUTES - 1 and engine.state.group_count == 6
    with sqlite3.connect(tmp_path / "state.db") as conn:  # an end filled from the hop instead of the duration
        conn.execute("UPDATE ematix_streaming_state SET window_end = window_start + ? WHERE window_start = "
                     "(SELECT min(window_start) FROM ematix_streaming_state)", (HOP_MS * 1_000,))
    conn.close()
    with pytest.raises(CorruptState, match="pipeline 'v2_fixture'.*stored with end .* its window kind gives"):
        restore()
    # `ematix-dagster check` reports the same, with its own way out and without running anything
    from ematix_dagster.operations import check

    problems = check(spec_).problems
    assert [p.code for p in problems] == ["corrupt_state"]
    assert "stored with end" in problems[0].message and "Restore the state store" not in problems[0].message
