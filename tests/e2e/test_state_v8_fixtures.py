"""The committed state of store schema 8 (state segments, pending rows, counters in the pipelines
row) still loads and continues exactly.

``tests/fixtures/state_v8/`` was written by ``make_fixtures.py`` with the code of schema 8 and codec
``STATE_VERSION`` 2: per kind, a real pipeline stopped part way, its SQLite store file, its Spark
checkpoint and its target (and dead letters) so far. The kinds: ``tumbling``, ``session`` (reopen) and
``sliding`` pin the segment format; ``rows`` holds rows ``WATERMARK_TS()`` keeps pending; ``emit``
holds rows an ``[emit] sql`` keeps pending and the counter ``emit_release_watermark``; ``flush`` ended
in its end-of-input flush. Every windowed run stores ``last_batch_rows_written``. Both counters sit in
the counters map of the pipelines row as schema 8 stores them, which a later schema step may move:
each test reads the committed file with SQL before the engine opens it (schema 8; the counters and
the watermark, checked against the oracle), then resumes the pipeline over the rest of its input, and
the whole target (the committed run's rows included) must equal the oracle's (no engine code computes
an expected value). A tumbling
run resumed with no input and a flush numbers the flush's rows after the stored
``last_batch_rows_written`` (docs/contract/targets-and-guarantees.md), so that counter is read back,
not only carried.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ematix_dagster.operations import summary
from ematix_dagster.spec import StateStoreConfig, load_pipeline, load_pipeline_str
from tests import oracle
from tests.e2e import test_sessions_reopen as sessions
from tests.e2e import test_sliding as sliding
from tests.e2e.emit_oracle import EmitOracle
from tests.e2e.lateness_helpers import FAR_FUTURE, Feed, at, compare_output, files_source, make_spec, oracle_params, run
from tests.e2e.row_helpers import (
    DELAYED_QUERY,
    DELAYED_SQL,
    dead_letters,
    expected_batches,
    expected_dead_letters,
    oracle_run,
    parquet_batches,
    row_toml,
    write_batches,
)
from tests.e2e.test_emit_sql import check_written, emit_table, expected
from tests.e2e.test_state_v7_fixtures import install_run, write_tumbling
from tests.e2e.trigger_helpers import config, pipeline_text, write_input
from tests.e2e.trigger_oracle import TriggerOracle
from tests.pipeline_toml import windowed_pipeline_toml

FIXTURES = Path(__file__).parent.parent / "fixtures" / "state_v8"
KINDS = ("tumbling", "session", "sliding", "rows", "emit", "flush")
# The committed runs were made from the specs and batches below (and sessions.BRIDGES, sliding.BATCHES,
# row_helpers.DELAYED_SQL, emit_oracle.PREDICATE): changing them breaks the fixtures.
SCHEMA = 8  # the store schema the committed files are at
LAST_ROWS, RELEASE_WATERMARK = "last_batch_rows_written", "emit_release_watermark"
MINUTES, FIRST_MINUTES = 5, 3  # tumbling and flush: input files, and those the committed run consumed
FIRST_SESSION_BATCHES = 2  # of sessions.BRIDGES
FIRST_SLIDING_BATCHES = 2  # of sliding.BATCHES
SLIDING_BATCHES = cast(list[list[tuple]], sliding.BATCHES)
# (id, k, v, page, event time) per micro-batch: row_helpers.DELAYED_RUN_1, then DELAYED_RUN_2
ROW_BATCHES: list[list[tuple]] = [
    [(1, "rt", 1, None, at(9)), (2, "emb", 2, None, at(7)), (3, "emb", 3, None, at(7, 30)),
     (4, "strict", 4, None, at(8, 30)), (5, "emb", 5, "held-5", at(10)), (6, "other", 6, None, at(9)),
     (7, "emb", 150, "2024-01-01 00:11:00", at(9, 50)), (8, "rt", 100, None, at(9, 10)),
     (9, "other", 120, None, at(9, 20)), (10, "rt", 130, "soon", at(9, 30)), (11, "emb", 11, None, None),
     (12, None, 12, None, at(9)), (13, "strict", 13, None, at(10))],
    [(21, "emb", 21, None, at(10)), (20, "emb", 20, None, at(10)), (22, "emb", 22, "dup", at(11)),
     (22, "emb", 22, "dup", at(11)), (23, "strict", 23, None, at(11)), (24, "emb", 24, "held-24", at(12, 30)),
     (25, "rt", 25, None, FAR_FUTURE), (26, "strict", 26, "held-26", at(12)),
     (27, "emb", 180, "2024-01-01 00:30:00", at(12)), (28, "rt", 28, None, at(12, 30)), (29, "emb", 29, None, at(9))],
    [(30, "rt", 30, None, at(13)), (31, "emb", 31, None, at(10, 30))],
    [(32, "rt", 32, None, at(13, 10)), (33, "other", 33, None, at(13))],
    [(40, "emb", 40, "held-40", at(20)), (41, "rt", 41, None, at(19))],
]
FIRST_ROW_BATCHES = 4
# (k, seconds after lateness_helpers.T0, v) per micro-batch: trigger_helpers.BATCHES
EMIT_BATCHES: list[list[tuple[str | None, float, int]]] = [
    [("a", 10, 1), ("a", 20, 2), (None, 30, 3), ("b", 40, 4)],
    [("a", 50, 5), ("a", 52, 6), (None, 55, 7), ("b", 37, 8)],
    [("b", 70, 9), ("a", 75, 10), ("a", 31, 11)],
    [("b", 58, 12), ("c", 45, 13), ("a", 80, 14), (None, 85, 15)],
    [("a", 130, 16), ("a", 30, 17), ("b", 110, 18), ("d", 140, 19), ("d", 162, 20)],
    [("d", 158, 21)],
]
FIRST_EMIT_BATCHES = 3
# tumbling 60 s under reopen, every batch fires, retractions, no flush: finals wait while corrections replace them
EMIT_CONFIG = dataclasses.replace(config("tumbling", "reopen", "every_batch", True), end_of_input="keep")


# -- the specs and the input ------------------------------------------------------------------------------


def tumbling_spec(root: Path, end_of_input: str | None = None):
    return load_pipeline_str(windowed_pipeline_toml("v8_tumbling", root, window_kind="tumbling", duration_ms=60_000,
                                                    lateness_ms=30_000, end_of_input=end_of_input))


def flush_spec(root: Path):
    return load_pipeline_str(windowed_pipeline_toml("v8_flush", root, window_kind="tumbling", duration_ms=60_000,
                                                    lateness_ms=30_000, end_of_input="flush"))


def session_spec(root: Path):
    spec = make_spec(root, "v8_session", [files_source("a", root / "in")], sessions.session_window())
    return dataclasses.replace(spec, state_store=StateStoreConfig(kind="sqlite", path=str(root / "state.db")))


def sliding_spec(root: Path):
    spec = make_spec(root, "v8_sliding", [files_source("a", root / "in")], sliding.sliding_window("reopen"))
    return dataclasses.replace(spec, state_store=StateStoreConfig(kind="sqlite", path=str(root / "state.db")))


def rows_spec(root: Path):
    return load_pipeline(row_toml("v8_rows", root, DELAYED_SQL, dead_letter={"kind": "parquet",
                                                                             "path": str(root / "dlq")}))


def emit_spec(root: Path):
    return load_pipeline_str(pipeline_text("v8_emit", root, EMIT_CONFIG) + emit_table())


# -- the committed files ------------------------------------------------------------------------------------


def install(kind: str, root: Path) -> None:
    install_run(FIXTURES / kind, root)


@dataclass(frozen=True)
class Stored:
    """What the committed store file holds, read with SQL (no engine code)."""

    watermark: int | None
    counters: dict[str, int]
    segments: int
    pending: int


def stored(db: Path, pipeline: str) -> Stored:
    """The committed file, which must still be at schema 8 with its state in segments."""
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max(version) FROM ematix_streaming_schema_version").fetchone()[0] == SCHEMA
        assert conn.execute("SELECT count(*) FROM ematix_streaming_state").fetchone()[0] == 0, "schema 8 writes segments"
        watermark, counters = conn.execute("SELECT watermark, counters FROM ematix_streaming_pipelines "
                                           "WHERE pipeline_name = ?", (pipeline,)).fetchone()
        out = Stored(watermark, json.loads(counters),
                     *(conn.execute(f"SELECT count(*) FROM {table} WHERE pipeline_name = ?", (pipeline,)).fetchone()[0]
                       for table in ("ematix_streaming_segments", "ematix_streaming_pending")))
    conn.close()
    return out


# -- the tests ------------------------------------------------------------------------------------------------


def test_tumbling_windows_of_schema_8_continue_exactly(spark, tmp_path, batch_files):
    install("tumbling", tmp_path)
    state = stored(tmp_path / "state.db", "v8_tumbling")
    spec = tumbling_spec(tmp_path)
    files, feed = batch_files("in"), Feed()
    write_tumbling(files, feed, range(MINUTES))  # the committed run read the first files; the rest is new
    result, _ = run(spec, spark)
    assert [r.batch_id for r in result.reports] == list(range(FIRST_MINUTES, MINUTES))
    batches = feed.batches(spec.run.checkpoint_location, ["a"])
    expected_rows = oracle.run(batches, oracle_params(spec))
    got = compare_output(spec, expected_rows)  # the committed run numbered its rows already
    assert min(got) < FIRST_MINUTES <= max(got), "rows of both runs are compared"
    committed = oracle.run(batches[:FIRST_MINUTES], oracle_params(spec))
    assert state.counters[LAST_ROWS] == len(committed.emitted[FIRST_MINUTES - 1]) > 0
    assert state.watermark == committed.watermarks[FIRST_MINUTES - 1]
    assert state.segments > 0, "the fixture holds open windows"


def test_a_flush_after_the_committed_run_numbers_its_rows_after_the_stored_count(spark, tmp_path, batch_files):
    """No input is new: the run has no batch of its own, and its flush writes beside the committed run's
    last batch, ``_emit_seq`` going on from the rows that batch wrote (the stored counter)."""
    install("tumbling", tmp_path)
    state = stored(tmp_path / "state.db", "v8_tumbling")
    spec = tumbling_spec(tmp_path, end_of_input="flush")  # end_of_input is no part of the fingerprint
    files, feed = batch_files("in"), Feed()
    write_tumbling(files, feed, range(FIRST_MINUTES))
    result, _ = run(spec, spark)
    last = FIRST_MINUTES - 1
    assert [r.batch_id for r in result.reports] == [last], "the flush only"
    expected_rows = oracle.run(feed.batches(spec.run.checkpoint_location, ["a"]), oracle_params(spec))
    got = compare_output(spec, expected_rows)  # part-0 then flush.parquet, _emit_seq numbering both
    assert len(got[last]) > state.counters[LAST_ROWS] > 0, "the flush wrote rows after the last batch's"
    assert (tmp_path / "out" / f"batch_id={last}" / "flush.parquet").exists()


def test_sessions_of_schema_8_keep_their_flags_and_written_rows(spark, tmp_path, batch_files):
    install("session", tmp_path)
    state = stored(tmp_path / "state.db", "v8_session")
    spec = session_spec(tmp_path)
    feed, _ = sessions.write_feed(batch_files, sessions.BRIDGES)
    result, _ = run(spec, spark)
    assert [r.batch_id for r in result.reports] == list(range(FIRST_SESSION_BATCHES, len(sessions.BRIDGES)))
    found, expected_rows = sessions.oracle_batches(feed, spec.run.checkpoint_location)
    # the retractions of batch 1 were written by the committed run; later batches retract and correct
    # sessions whose flags and written rows come from the committed segments
    view = sessions.check_parquet_batches(spec.target.path, expected_rows)
    assert {key: (r["window_end"], tuple(r[a] for a in sessions.ALIASES)) for key, r in view.items()} == \
        sessions.oracle_target(found)
    retracts, rows = expected_rows[FIRST_SESSION_BATCHES - 1]
    assert state.counters[LAST_ROWS] == len(retracts) + len(rows) > 0 and state.segments > 0


def test_sliding_partials_of_schema_8_continue_exactly(spark, tmp_path, batch_files):
    install("sliding", tmp_path)
    state = stored(tmp_path / "state.db", "v8_sliding")
    spec = sliding_spec(tmp_path)
    feed, _ = sliding.write_batches(batch_files, SLIDING_BATCHES)
    result, _ = run(spec, spark)
    assert [r.batch_id for r in result.reports] == list(range(FIRST_SLIDING_BATCHES, len(SLIDING_BATCHES)))
    _, expected_rows, _ = sliding.oracle_batches(feed, spec.run.checkpoint_location, "reopen")
    expected_rows[-1] = [r for r in expected_rows[-1] if r[2] < sliding.us(sliding.at(100))]  # no flush: b@100 stays open
    assert sliding.target_batches(spec.target.path) == {b: rows for b, rows in enumerate(expected_rows) if rows}
    assert state.counters[LAST_ROWS] == len(expected_rows[FIRST_SLIDING_BATCHES - 1]) > 0 and state.segments > 0


def test_rows_held_by_watermark_ts_at_schema_8_leave_exactly(spark, tmp_path, batch_files):
    install("rows", tmp_path)
    state = stored(tmp_path / "state.db", "v8_rows")
    spec = rows_spec(tmp_path)
    files, feed = batch_files("in"), Feed()
    write_batches(feed, files, ROW_BATCHES)
    result, _ = run(spec, spark)
    assert [r.batch_id for r in result.reports] == list(range(FIRST_ROW_BATCHES, len(ROW_BATCHES)))
    outs = oracle_run(feed, spec.run.checkpoint_location, DELAYED_QUERY)
    assert parquet_batches(spec.target.path) == expected_batches(outs)  # rows, columns, order of every batch
    assert dead_letters(str(tmp_path / "dlq")) == expected_dead_letters(outs)
    assert summary(spec, windows=False)["pending"]["rows"] == len(outs[-1].held) > 0
    committed = outs[FIRST_ROW_BATCHES - 1]
    assert state.pending == len(committed.held) > 0 and state.watermark == committed.watermark
    released_later = {h.row["id"] for out in outs[FIRST_ROW_BATCHES:] for h in out.released}
    assert {h.row["id"] for h in committed.held} & released_later, "rows the committed run held leave now"


def test_rows_waiting_for_emit_sql_at_schema_8_leave_exactly(spark, tmp_path, batch_files):
    install("emit", tmp_path)
    state = stored(tmp_path / "state.db", "v8_emit")
    spec = emit_spec(tmp_path)
    feed = write_input(batch_files("in"), EMIT_BATCHES)
    result, _ = run(spec, spark)
    assert [r.batch_id for r in result.reports] == list(range(FIRST_EMIT_BATCHES, len(EMIT_BATCHES)))
    cp = spec.run.checkpoint_location
    want = expected(feed, cp, EMIT_CONFIG, flush_after=set())
    check_written(spec.target.path, want)  # every batch's released rows, in release order
    # the committed run as the oracles see it: what waited when it stopped, and its counters
    triggers, delay = TriggerOracle(EMIT_CONFIG), EmitOracle()
    for batch_id, batch in enumerate(feed.batches(cp, ["a"])[:FIRST_EMIT_BATCHES]):
        delay.batch(batch_id, triggers.batch(batch.time_us, batch.rows.to_dict("records")),
                    triggers.out.watermarks[-1])
    last = FIRST_EMIT_BATCHES - 1
    assert state.pending == len(delay.pending) + len(delay.retracts) > 0
    assert state.counters[RELEASE_WATERMARK] == want.watermarks[last] is not None
    assert state.counters[LAST_ROWS] == len(want.emitted[last]) > 0
    waiting = {(r["window_start"], r["k"]) for *_order, r in delay.pending.values()}
    assert waiting & {(r["window_start"], r["k"]) for rows in want.released[FIRST_EMIT_BATCHES:] for r in rows}
    assert summary(spec, windows=False)["pending"]["rows"] == len(want.oracle.pending) + len(want.oracle.retracts)


def test_a_run_that_ended_in_a_flush_at_schema_8_continues_exactly(spark, tmp_path, batch_files):
    """The flush closed every window for good (W raised to the last window's end, committed): a later row of
    a flushed window is late (dropped), the rest continue as a run of their own would."""
    install("flush", tmp_path)
    state = stored(tmp_path / "state.db", "v8_flush")
    spec = flush_spec(tmp_path)
    files, feed = batch_files("in"), Feed()
    write_tumbling(files, feed, range(MINUTES))
    result, _ = run(spec, spark)
    assert [r.batch_id for r in result.reports] == [*range(FIRST_MINUTES, MINUTES), MINUTES - 1]  # and its flush
    batches = feed.batches(spec.run.checkpoint_location, ["a"])
    params = oracle_params(spec)
    committed = oracle.run(batches[:FIRST_MINUTES], params)  # ending in its flush
    before_flush = oracle.run(batches[:FIRST_MINUTES], dataclasses.replace(params, end_of_input="keep"))
    flushed, unflushed = committed.watermarks[FIRST_MINUTES - 1], before_flush.watermarks[FIRST_MINUTES - 1]
    assert flushed is not None and unflushed is not None

    # docs/contract/late-data.md: a row whose every window ended at or before W_prev is late; in the first
    # new batch W_prev is the flushed watermark
    duration = spec.window.duration_ms * oracle.MS
    first_new = batches[FIRST_MINUTES].rows
    late = [(ts // duration + 1) * duration <= flushed for ts in first_new["_event_ts"]]
    assert any(late) and max(first_new["_event_ts"][late]) < max(first_new["_event_ts"])
    rest = [dataclasses.replace(batches[FIRST_MINUTES], rows=first_new[[not x for x in late]]),
            *batches[FIRST_MINUTES + 1:]]
    later = oracle.run(rest, params)
    assert later.watermarks[0] is not None and later.watermarks[0] >= flushed, "the flushed W no longer decides"
    emitted = {**committed.emitted, **{FIRST_MINUTES + b: rows for b, rows in later.emitted.items()}}
    compare_output(spec, oracle.OracleResult(emitted=emitted))
    assert result.late_rows == sum(late) + later.counters["late_rows"]
    assert state.watermark == flushed > unflushed, "the flush's raise, committed"
    assert state.counters[LAST_ROWS] == len(before_flush.emitted[FIRST_MINUTES - 1]) > 0, "part-0's rows"


# -- what make_fixtures.py runs ------------------------------------------------------------------------------


def first_run(kind: str, root: Path, files_factory: Any) -> Any:
    """Feed the committed run's input into ``root/in`` and return its spec (make_fixtures.py)."""
    files = files_factory(root / "in")
    if kind in ("tumbling", "flush"):
        write_tumbling(files, Feed(), range(FIRST_MINUTES))
        return tumbling_spec(root) if kind == "tumbling" else flush_spec(root)
    if kind == "session":
        sessions.write_feed(lambda _name: files, sessions.BRIDGES[:FIRST_SESSION_BATCHES])
        return session_spec(root)
    if kind == "sliding":
        sliding.write_batches(lambda _name: files, SLIDING_BATCHES[:FIRST_SLIDING_BATCHES])
        return sliding_spec(root)
    if kind == "rows":
        write_batches(Feed(), files, ROW_BATCHES[:FIRST_ROW_BATCHES])
        return rows_spec(root)
    assert kind == "emit", kind
    write_input(files, EMIT_BATCHES[:FIRST_EMIT_BATCHES])
    return emit_spec(root)
