"""Session windows under ``late_data = "reopen"`` (docs/contract/windows.md, docs/contract/emission.md): corrections, retractions, durable flags.

The ground truth is the session oracle of ``tests/streaming/session_oracle.py`` (pandas, docs/contract/windows.md
applied batch by batch, no engine code), fed the rows each micro-batch read according to Spark's
checkpoint; it gives each batch's ``final`` / ``correction`` rows, the ``retract`` rows of keys that
disappeared, and the final target. Checked here:

* the parquet target (append): per batch, retract rows first, each repeating the row it withdraws
  exactly (session_id, bounds, values), then the rows replacing them, numbered by ``_emit_seq``;
  the reader's rule (largest ``(batch_id, _emit_seq)`` per key, retracted keys dropped) gives the
  oracle's final target;
* the PostgreSQL target (upsert) with a PostgreSQL state store, in the store's transaction and in the
  writer's own: the vanished keys are deleted, the table equals the oracle's final target;
* durability of the per-session ``emitted`` flag (schema step 5): an engine restored from each store
  after every batch continues exactly like one that never stopped, and a pipeline stopped and
  started again over one SQLite store and checkpoint writes a correction after the restart, never
  a second final, for a merged session whose end was still after the watermark when it stopped.
"""

from __future__ import annotations

import datetime as dt
import random
import uuid
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from ematix_dagster.spark.batch.convert import UTC_MICROS, rows_to_arrow
from ematix_dagster.spec import Aggregation, Target, Window, load_pipeline_str
from ematix_dagster.streaming.durable import batch_commit, restore_engine
from ematix_dagster.streaming.micro_batch import BatchInput, BatchResult, Engine, SourceStats
from ematix_dagster.targets import make_window_writer
from state_store.codec import encode_key
from state_store.contract import StateStore
from state_store.memory import InMemoryStateStore
from state_store.postgres_store import PostgresStateStore
from state_store.segment_replay import replayed
from state_store.sqlite import SqliteStateStore
from tests.e2e.lateness_helpers import Feed, files_source, make_spec, metric, read_batch_dirs, row, run, us
from tests.e2e.test_sessions import AGGREGATIONS, at, pd_isna
from tests.pipeline_toml import postgres_store, postgres_target, sqlite_store, windowed_pipeline_toml
from tests.streaming.session_oracle import ALIASES, Oracle, Params, canon, partials_of

S = 1_000_000
GAP_S, CAP_S, ALLOWED_S = 10, 600, 300
SEQ, KIND = "_emit_seq", "_emit_kind"


# tests/fixtures/state_v7 and state_v8 were made from these (test_state_v7_fixtures.py, test_state_v8_fixtures.py):
# changing them breaks those fixtures
def session_window(**extra: Any) -> dict[str, Any]:
    return {"kind": "session", "gap_ms": GAP_S * 1000, "max_session_duration_ms": CAP_S * 1000, "group_by": ["k"],
            "late_data": "reopen", "allowed_lateness_ms": ALLOWED_S * 1000, "max_groups_per_window": 1000,
            "aggregations": AGGREGATIONS, **extra}


def params() -> Params:
    return Params(gap=GAP_S * S, cap=CAP_S * S, policy="reopen", allowed=ALLOWED_S * S)


# (key, seconds after T0, v); T0 is a multiple of the cap. W = the newest event time (lateness 0).
# tests/fixtures/state_v7 and state_v8 were made from these (test_state_v7_fixtures.py, test_state_v8_fixtures.py):
# changing them breaks those fixtures
BRIDGES = [
    # a: [0, 10) [15, 25); b: [0, 10) [14, 24) [28, 38); c: [50, 60); all final at W = 100, z open
    [("a", 0, 1), ("a", 15, 2), ("b", 0, 3), ("b", 14, 4), ("b", 28, 5), ("c", 50, 6), ("z", 100, 0)],
    # late, within the allowance (>= 100 - 300): a@8 bridges two of a's sessions (one correction, a@15
    # retracted); b@7 and b@21 bridge three (b@14 and b@28 retracted); c@45 moves c's start (c@50 retracted)
    [("a", 8, 7), ("b", 7, 8), ("b", 21, 9), ("c", 45, 10), ("z", 105, 0)],
    [("z", 400, 0)],  # W = 400: z final; a, b and c leave state (end + 300 < 400)
    [("a", 95, 11), ("b", 390, 12)],  # a@95 < 400 - 300 is beyond the allowance (late, dropped)
    [("z", 1000, 0)],  # b [390, 400) final
]


def write_feed(batch_files, batches: list[list[tuple]], feed: Feed | None = None, files=None) -> tuple[Feed, Any]:
    feed, files = feed or Feed(), files or batch_files("in")
    for rows in batches:
        n = len(feed.rows)
        feed.parquet("a", files, [row(1000 * n + i, k, v, at(s)) for i, (k, s, v) in enumerate(rows)])
    return feed, files


def oracle_batches(feed: Feed, cp: str) -> tuple[Oracle, list[tuple[list, list]]]:
    """(retracts, finals and corrections) of each batch Spark formed, by the session oracle."""
    oracle, out = Oracle(params()), []
    for batch in feed.batches(cp, ["a"]):
        rows = [((None if pd_isna(r["k"]) else r["k"],), int(r["_event_ts"]), None if pd_isna(r["v"]) else int(r["v"]))
                for r in batch.rows.to_dict("records")]
        out.append(oracle.batch(rows))
    return oracle, out


def as_out(r: dict[str, Any]) -> tuple:
    return (r[KIND], r["window_start"], r["window_end"], (r["k"],), tuple(r[a] for a in ALIASES))


def check_parquet_batches(path: str, expected: list[tuple[list, list]]) -> dict[tuple, dict[str, Any]]:
    """Every batch's rows against the oracle, retract rows against what they withdraw; the reader's
    view of the target (latest row per key by (batch_id, _emit_seq), retracted keys dropped)."""
    got = read_batch_dirs(path)
    assert set(got) == {b for b, (retracts, rows) in enumerate(expected) if retracts or rows}
    written: dict[tuple, dict[str, Any]] = {}  # (start, k) -> the row the target holds for it
    latest: dict[tuple, tuple[tuple[int, int], dict[str, Any]]] = {}
    for batch_id in sorted(got):
        rows = got[batch_id]
        assert [r[SEQ] for r in rows] == list(range(len(rows))), "_emit_seq numbers the batch's rows in order"
        kinds = [r[KIND] for r in rows]
        assert kinds == sorted(kinds, key=lambda k: k != "retract"), "retract rows come first"
        retracts, emitted = expected[batch_id]
        assert canon([as_out(r) for r in rows if r[KIND] == "retract"]) == retracts, batch_id
        assert canon([as_out(r) for r in rows if r[KIND] != "retract"]) == emitted, batch_id
        for r in rows:
            key = (r["window_start"], r["k"])
            body = {c: v for c, v in r.items() if c not in (SEQ, KIND)}
            if r[KIND] == "retract":
                assert body == written.pop(key), "a retract row repeats the row it retracts exactly"
            else:
                written[key] = body
            latest[key] = max(latest.get(key, ((-1, -1), r)), ((batch_id, r[SEQ]), r), key=lambda x: x[0])
    view = {key: r for key, (_, r) in latest.items() if r[KIND] != "retract"}
    assert {key: {c: v for c, v in r.items() if c not in (SEQ, KIND)} for key, r in view.items()} == written
    return view


def oracle_target(oracle: Oracle) -> dict[tuple, tuple]:
    return {(start, key[0]): (end, values) for (start, key), (end, values) in oracle.target.items()}


# -- the spec and the engine, without Spark --------------------------------------------------------

def test_reopen_is_allowed_and_the_allowance_is_the_retention_and_the_late_rule(tmp_path) -> None:
    spec = make_spec(tmp_path, "reopen-spec", [files_source("a", tmp_path / "in")], session_window())
    window = spec.window
    assert (window.late_data, window.retention_ms) == ("reopen", ALLOWED_S * 1000)
    engine = Engine.for_window("p", window, ("a",), integral=(None,) * len(AGGREGATIONS))
    engine.process(BatchInput(batch_id=0, batch_time=0, sources={"a": SourceStats(rows=1, max_event_ts=500 * S)}))
    # the Spark plan's late rule: a row is late iff t < W_prev - allowed_lateness (docs/contract/windows.md)
    assert engine.closed_before() == 500 * S - ALLOWED_S * S and engine.retention == ALLOWED_S * S


def window_of(**extra: Any) -> Window:
    aggs = tuple(Aggregation(a["agg"], a["as"], a.get("column"), a.get("mode"), a.get("max_distinct_values_per_group"))
                 for a in AGGREGATIONS)
    return Window(kind="session", gap_ms=GAP_S * 1000, max_session_duration_ms=CAP_S * 1000, group_by=("k",),
                  late_data="reopen", allowed_lateness_ms=ALLOWED_S * 1000, max_groups_per_window=100,
                  aggregations=aggs, **extra)


INTEGRAL = tuple(a["agg"] == "sum" for a in AGGREGATIONS)


def feed(engine: Engine, batch_id: int, rows: list[tuple], rng: random.Random) -> tuple[list[tuple], BatchResult]:
    """One batch of rows (key, seconds, v) through ``engine`` as Spark sends it: the rows the late
    rule accepts, sessionized per key and bucket into partials; returns the rows in µs and the result."""
    plain = [((k,), s * S, v) for k, s, v in rows]
    closed = engine.closed_before()
    accepted = [r for r in plain if closed is None or r[1] >= closed]
    keys, firsts, lasts, columns = partials_of(accepted, params(), rng)
    return plain, engine.process(BatchInput(
        batch_id=batch_id, batch_time=batch_id * S, keys=keys, starts=firsts, lasts=lasts, partials=columns,
        sources={"a": SourceStats(rows=len(rows), max_event_ts=max(r[1] for r in plain))},
        late_rows=len(rows) - len(accepted)))


def run_engine(batches: list[list[tuple]], store: StateStore | None = None, drop_flags: bool = False) -> list[list]:
    """Each batch through an Engine, fed what Spark sends (the rows the late rule accepts, sessionized
    per key and bucket into partials); with a store, committed and restored after every batch
    (``drop_flags`` restores as if the store had no emitted flags: derived from the watermark)."""
    rng = random.Random(7)
    engine = Engine.for_window("reopen-core", window_of(), ("a",), INTEGRAL)
    out = []
    for batch_id, rows in enumerate(batches):
        _, result = feed(engine, batch_id, rows, rng)
        out.append((canon([r for r in result.rows if r.kind == "retract"]),
                    canon([r for r in result.rows if r.kind != "retract"])))
        assert [r.kind for r in result.rows] == sorted((r.kind for r in result.rows), key=lambda k: k != "retract")
        if store is not None:
            store.commit(batch_commit(engine, "reopen-core"))
            recovered = store.load("reopen-core")
            if drop_flags:  # the rows the segments stand for, without their flags
                recovered, _ = replayed(recovered, "the test's store")
                recovered.emitted, recovered.segments = {}, []
            engine = Engine.for_window("reopen-core", window_of(), ("a",), INTEGRAL)
            restore_engine(engine, recovered)
    return out


# a: [90, 100) final at W = 101; [108, 118) opens (W = 108); a@99 (late) bridges them into [90, 118),
# which counts as emitted although 118 >= W = 108; b likewise. Then a@112 changes a's session (a
# correction), while b's passes W unchanged (no row: it was written with these values already).
RESTART = [
    [("a", 90, 1), ("b", 90, 5), ("z", 101, 0)],
    [("a", 108, 2), ("b", 108, 6), ("z", 105, 0)],
    [("a", 99, 3), ("b", 99, 7), ("z", 106, 0)],
    [("a", 112, 4), ("z", 200, 0)],
    [("z", 700, 0)],
]


@pytest.fixture(params=["in_memory", "sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "in_memory":
        name = f"reopen-{uuid.uuid4().hex[:8]}"
        made: StateStore = InMemoryStateStore(name)
    elif request.param == "sqlite":
        made = SqliteStateStore(tmp_path / "state.db")
    else:
        made = PostgresStateStore(request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema"))
    made.open()
    yield made
    made.close()
    if request.param == "in_memory":
        InMemoryStateStore.forget(name)


@pytest.mark.parametrize("batches", [BRIDGES, RESTART], ids=["bridges", "merged-open"])
def test_an_engine_restored_after_every_batch_keeps_the_emitted_flags(store, batches) -> None:
    oracle = Oracle(params())
    expected = [oracle.batch([((k,), s * S, v) for k, s, v in rows]) for rows in batches]
    assert run_engine(batches) == expected
    assert run_engine(batches, store) == expected
    kinds = {r[0] for out in expected for rows in out for r in rows}
    assert kinds == ({"final", "correction", "retract"} if batches is BRIDGES else {"final", "correction"})
    if batches is RESTART:  # flags derived from the watermark would emit a's and b's merged sessions again
        again = run_engine(batches, InMemoryStateStore(f"derived-{uuid.uuid4().hex[:8]}"), drop_flags=True)
        merged = [("a",), ("b",)]
        assert [r[:4] for r in again[3][1] if r[3] in merged] == [("final", 90 * S, 122 * S, ("a",)),
                                                                  ("final", 90 * S, 118 * S, ("b",))]
        assert [r[:4] for r in expected[3][1] if r[3] in merged] == [("correction", 90 * S, 122 * S, ("a",))]


# -- the writers, without Spark ----------------------------------------------------------------------

def session_rows(rows: list[tuple]) -> pa.Table:
    """Rows of a session window's output schema (start, end, session_id, k, n, _emit_kind, _emit_seq)."""
    schema = pa.schema([("window_start", UTC_MICROS), ("window_end", UTC_MICROS), ("session_id", pa.int64()),
                        ("k", pa.string()), ("n", pa.int64()), (KIND, pa.string()), (SEQ, pa.int64())])
    cols = list(zip(*[(*r, i) for i, r in enumerate(rows)]))
    return pa.table([pa.array(list(c), type=f.type) for c, f in zip(cols, schema)], schema=schema)


def test_the_postgres_writer_deletes_retracted_keys_before_its_upserts(pg_dsn, pg_schema) -> None:
    table = f"{pg_schema}.retracts"
    rows = session_rows([(0, 10, 1, "a", 1, "final"), (0, 10, 2, None, 1, "final"), (20, 30, 3, "a", 2, "final"),
                         (20, 30, 4, None, 5, "final"), (40, 50, 5, "b", 9, "final")])
    writer = make_window_writer(Target(kind="postgres", url=pg_dsn, table=table, create_table=True), "p",
                                rows.schema, ["window_start", "k"])
    writer.open()
    try:
        writer.write(0, rows)
        # a NULL group value is a key of its own (NULLS NOT DISTINCT): (20, NULL) goes, (0, NULL) stays;
        # (40, b) is retracted and written again in the same batch: the delete runs first
        later = session_rows([(20, 30, 3, "a", 2, "retract"), (20, 30, 4, None, 5, "retract"),
                              (40, 50, 5, "b", 9, "retract"), (0, 30, 1, "a", 4, "correction"),
                              (40, 55, 5, "b", 10, "correction")])
        for _ in range(2):  # a replay of the batch leaves what one write left
            writer.write(1, later)
            with psycopg.connect(pg_dsn) as conn:
                got = conn.execute(f"SELECT window_start, window_end, k, n FROM {table}").fetchall()
            assert sorted((us(s), us(e), k, n) for s, e, k, n in got) == [(0, 10, None, 1), (0, 30, "a", 4),
                                                                          (40, 55, "b", 10)]
        with psycopg.connect(pg_dsn) as conn:  # in the caller's transaction: a rollback keeps the rows
            writer.write_in_transaction(conn, 2, session_rows([(0, 30, 1, "a", 4, "retract")]))
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 2
            conn.rollback()
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 3
    finally:
        writer.close()


def test_output_rows_are_numbered_for_every_kind() -> None:
    from ematix_dagster.streaming.emitted import Emitted, EmittedRow

    rows = [EmittedRow(20, 30, ("a",), (2,), "retract"), EmittedRow(0, 30, ("a",), (3,), "correction")]
    out, last = Emitted(), Emitted()
    out.add_rows(rows)
    last.add_rows(rows[1:])
    schema = pa.schema([("window_start", UTC_MICROS), ("window_end", UTC_MICROS), ("session_id", pa.int64()),
                        ("k", pa.string()), ("n", pa.int64()), (KIND, pa.string()), (SEQ, pa.int64())])
    table = rows_to_arrow(schema, out, 1, [7, 8])
    assert table.to_pydict()[SEQ] == [0, 1] and table.to_pydict()[KIND] == ["retract", "correction"]
    assert table.to_pydict()["session_id"] == [7, 8] and table.to_pydict()["n"] == [2, 3]
    fixed = pa.schema([("window_start", UTC_MICROS), ("window_end", UTC_MICROS), ("k", pa.string()),
                       ("n", pa.int64()), (KIND, pa.string()), (SEQ, pa.int64())])
    # a fixed window's rows are numbered too; the end-of-input flush continues the last batch's numbers
    assert rows_to_arrow(fixed, last, 1, first_seq=5).to_pydict() == {
        "window_start": [dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)],
        "window_end": [dt.datetime(1970, 1, 1, 0, 0, 0, 30, tzinfo=dt.timezone.utc)],
        "k": ["a"], "n": [3], KIND: ["correction"], SEQ: [5]}


# -- real Spark ----------------------------------------------------------------------------------------

def test_late_rows_bridging_two_and_three_sessions_into_parquet(spark, tmp_path, batch_files):
    feed, _ = write_feed(batch_files, BRIDGES)
    spec = make_spec(tmp_path, "sessions-reopen", [files_source("a", tmp_path / "in")], session_window())
    summary, registry = run(spec, spark)
    assert summary.batches == len(BRIDGES) and summary.late_rows == 1  # a@95, beyond the allowance
    oracle, expected = oracle_batches(feed, spec.run.checkpoint_location)
    assert oracle.reopened > 0
    assert metric(registry, "late_rows_reopened_total", pipeline="sessions-reopen") == oracle.reopened
    t0 = us(at(0))
    # batch 1: one correction per key, the vanished starts retracted (docs/contract/windows.md, docs/contract/emission.md)
    retracts, rows = expected[1]
    assert [(r[0], r[1] - t0, r[3]) for r in retracts] == [
        ("retract", 14 * S, ("b",)), ("retract", 15 * S, ("a",)), ("retract", 28 * S, ("b",)),
        ("retract", 50 * S, ("c",))]
    assert [(r[0], r[1] - t0, r[2] - t0, r[3]) for r in rows] == [
        ("correction", 0, 25 * S, ("a",)), ("correction", 0, 38 * S, ("b",)), ("correction", 45 * S, 60 * S, ("c",))]
    view = check_parquet_batches(spec.target.path, expected)
    assert {key: (r["window_end"], tuple(r[a] for a in ALIASES)) for key, r in view.items()} == oracle_target(oracle)
    assert {(r["window_start"] - t0, r["k"]) for r in view.values()} == {
        (0, "a"), (0, "b"), (45 * S, "c"), (100 * S, "z"), (390 * S, "b"), (400 * S, "z")}
    assert sum(r.counts.corrections for r in summary.reports) == 3


@pytest.mark.parametrize("same_transaction", [True, False], ids=["exactly-once", "own-transaction"])
def test_retracted_keys_are_deleted_from_a_postgres_target(spark, tmp_path, batch_files, pg_dsn, pg_schema,
                                                           same_transaction):
    feed, _ = write_feed(batch_files, BRIDGES)
    table = f"{pg_schema}.sessions"
    store = postgres_store(pg_dsn, pg_schema) if same_transaction else sqlite_store(tmp_path / "state.db")
    text = windowed_pipeline_toml("sessions-pg", tmp_path, target=postgres_target(pg_dsn, table,
                                  same_transaction=same_transaction), state_store=store,
                                  extra={"transform": {"window": session_window()}})
    spec = load_pipeline_str(text)
    summary, _ = run(spec, spark)
    assert summary.batches == len(BRIDGES)
    oracle, expected = oracle_batches(feed, spec.run.checkpoint_location)
    assert sum(len(retracts) for retracts, _ in expected) == 4
    with psycopg.connect(pg_dsn) as conn:
        cols = ", ".join(ALIASES)
        got = conn.execute(f"SELECT window_start, window_end, k, {cols} FROM {table}").fetchall()
        columns = [c for (c,) in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = 'sessions' "
            "ORDER BY ordinal_position", (pg_schema,))]
    assert columns == ["window_start", "window_end", "session_id", "k", *ALIASES]  # no _emit_kind, no _emit_seq
    table_rows = {(us(ws), k): (us(we), tuple(vals)) for ws, we, k, *vals in got}
    assert len(table_rows) == len(got)
    assert table_rows == oracle_target(oracle)  # the vanished keys a@15, b@14, b@28, c@50 are gone


def test_a_restart_keeps_the_emitted_flags(spark, tmp_path, batch_files):
    toml = windowed_pipeline_toml("sessions-restart", tmp_path, state_store=sqlite_store(tmp_path / "state.db"),
                                  extra={"transform": {"window": session_window()}})
    spec = load_pipeline_str(toml)
    feed, files = write_feed(batch_files, RESTART[:3])
    first, _ = run(spec, spark)
    assert first.batches == 3
    with SqliteStateStore(tmp_path / "state.db") as sqlite_state:  # the stored rows (segments replayed)
        recovered, _ = replayed(sqlite_state.load("sessions-restart"), "the test's store")
    stored = [(start, end, key, recovered.emitted.get((start, key))) for start, end, key, _ in recovered.groups]
    watermark = recovered.record.watermark
    t0 = us(at(0))
    flags = {(start - t0, key): (end - t0, emitted) for start, end, key, emitted in stored}
    # the merged sessions end after W = 108 s and are stored as emitted; z [101, 116) is not
    assert watermark == t0 + 108 * S
    assert flags == {(90 * S, encode_key(("a",))): (118 * S, 1), (90 * S, encode_key(("b",))): (118 * S, 1),
                     (101 * S, encode_key(("z",))): (116 * S, 0)}

    write_feed(batch_files, RESTART[3:], feed, files)
    second, _ = run(spec, spark)  # the same store and checkpoint: continues at batch 3
    assert second.batches == 2
    oracle, expected = oracle_batches(feed, spec.run.checkpoint_location)
    view = check_parquet_batches(spec.target.path, expected)
    got = read_batch_dirs(spec.target.path)
    assert [(r[KIND], r["k"]) for r in got[3]] == [("correction", "a"), ("final", "z")]  # b: nothing, not a final
    finals = [(r["window_start"], r["k"]) for rows in got.values() for r in rows if r[KIND] == "final"]
    assert len(finals) == len(set(finals)), "no session is final twice"
    assert {key: (r["window_end"], tuple(r[a] for a in ALIASES)) for key, r in view.items()} == oracle_target(oracle)
