"""Session windows end to end on real Spark (docs/contract/windows.md): files -> sessions -> parquet, against the oracle.

Each file is one micro-batch. The ground truth is the session oracle of
``tests/streaming/session_oracle.py`` (pandas; docs/contract/windows.md applied batch by batch, no engine code), fed
the rows each batch read according to Spark's checkpoint. The target must hold exactly the
oracle's ``final`` rows, batch by batch, with the aggregates of every aggregator; late rows are
dropped or dead-lettered; ``session_id`` is docs/contract/windows.md's hash.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from pathlib import Path
from typing import Any

import msgpack
import pyarrow.parquet as pq
import pytest

from state_store.codec import encode_key
from tests import oracle
from tests.e2e.lateness_helpers import Feed, files_source, make_spec, row, run, us
from tests.streaming.session_oracle import ALIASES, Oracle, Params, canon

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)  # a multiple of the cap
S = 1_000_000
GAP_S, CAP_S = 10, 60
# tests/fixtures/state_v7 was made from these (test_state_v7_fixtures.py): changing them breaks that fixture
AGGREGATIONS = [
    {"agg": "count", "as": "n"}, {"agg": "count_col", "column": "v", "as": "n_v"},
    {"agg": "sum", "column": "v", "as": "sum_v"}, {"agg": "min", "column": "v", "as": "min_v"},
    {"agg": "max", "column": "v", "as": "max_v"}, {"agg": "first", "column": "v", "as": "first_v"},
    {"agg": "last", "column": "v", "as": "last_v"},
    {"agg": "count_distinct", "column": "v", "as": "distinct_v", "mode": "exact", "max_distinct_values_per_group": 50},
    {"agg": "avg", "column": "v", "as": "avg_v"},
]
APPROX_DISTINCT = {"agg": "count_distinct", "column": "v", "as": "hll_v"}  # exact at these cardinalities


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


# (key, seconds after T0, v): rows exactly the gap apart join, gap + 1 ms splits, a session is cut
# at the 60 s bucket boundary, a NULL key is a group, a NULL value counts as a row only.
BATCHES = [
    [("a", 0, 1), ("a", 10, 2), ("a", 20.001, 3), ("b", 55, 4), ("b", 62, 5), (None, 5, 6), ("a", 5, None)],
    [("a", 30, 7), ("b", 100, 8), (None, 14, 9), ("c", 200, 10)],  # a@30 and None@14 are late (W = 62)
    [("a", 150, 11), ("c", 205, 12), ("b", 199.5, 13), ("a", 400, 14)],  # a@150 and b@199.5 are late (W = 200)
    [("b", 1000, 15)],
]


def write_batches(tmp: Path, batch_files) -> Feed:
    feed, files = Feed(), batch_files("in")
    ids = iter(range(1, 1000))
    for rows in BATCHES:
        feed.parquet("a", files, [row(next(ids), k, v, at(s)) for k, s, v in rows])
    return feed


def oracle_finals(feed: Feed, cp: str, policy: str, sources: tuple[str, ...] = ("a",),
                  idleness_ms: int = 60_000) -> list[list[tuple]]:
    """The session oracle's rows per batch; with several sources W comes from ``tests/oracle.py``'s
    watermark rule (per-source maxima, idle sources left out), which is the same for every kind."""
    sessions = Oracle(Params(gap=GAP_S * S, cap=CAP_S * S, policy=policy))
    batches = feed.batches(cp, list(sources))
    marks = oracle.run(batches, oracle.Params(sources=sources, duration_ms=60_000, source_idleness_ms=idleness_ms,
                                              group_by=("k",))).watermarks
    out = []
    for batch_id, batch in enumerate(batches):
        rows = [((None if pd_isna(r["k"]) else r["k"],), int(r["_event_ts"]), None if pd_isna(r["v"]) else int(r["v"]))
                for r in batch.rows.to_dict("records")]
        retracts, emitted = sessions.batch(rows, watermark=marks[batch_id])
        assert not retracts  # nothing is retracted without reopen
        out.append(emitted)
    return out


def as_output(rows: list[dict[str, Any]]) -> list[tuple]:
    """Target rows as the oracle writes them: (kind, start, end, key, values)."""
    return [(r["_emit_kind"], us(r["window_start"]), us(r["window_end"]), (r["k"],), tuple(r[a] for a in ALIASES))
            for r in rows]


def pd_isna(value: Any) -> bool:
    return value is None or value != value


def target_rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist() if path.exists() else []


@pytest.mark.parametrize("policy", ["drop", "dlq"])
def test_sessions_match_the_oracle(spark, tmp_path, batch_files, policy):
    feed = write_batches(tmp_path, batch_files)
    window = {"kind": "session", "gap_ms": GAP_S * 1000, "max_session_duration_ms": CAP_S * 1000,
              "group_by": ["k"], "late_data": policy, "aggregations": [*AGGREGATIONS, APPROX_DISTINCT]}
    spec = make_spec(tmp_path, f"sessions-{policy}", [files_source("a", tmp_path / "in")], window,
                     dead_letter=policy == "dlq")
    summary, _ = run(spec, spark)
    assert summary.batches == len(BATCHES)
    expected = oracle_finals(feed, spec.run.checkpoint_location, policy)
    got = target_rows(Path(spec.target.path))
    assert {r["_emit_kind"] for r in got} == {"final"}
    assert canon(as_output(got)) == canon([r for batch in expected for r in batch])
    assert all(r["hll_v"] == r["distinct_v"] for r in got)  # both count_distinct modes
    assert summary.late_rows == 4
    # sessions: a [0, 10] (10 s apart joins) ends at 20, a [20.001] (10.001 s: a new one) at 30.001,
    # b [55] is cut at the bucket end (60), b [62] ends at 72
    starts = {(r["k"], us(r["window_start"])): us(r["window_end"]) for r in got}
    t0 = us(T0)
    assert starts[("a", t0)] == t0 + 20 * S and starts[("a", t0 + 20_001_000)] == t0 + 30_001_000
    assert starts[("b", t0 + 55 * S)] == t0 + 60 * S and starts[("b", t0 + 62 * S)] == t0 + 72 * S
    for r in got:  # docs/contract/windows.md: the first 8 bytes of SHA-256 over msgpack([pipeline, key bytes, start µs])
        doc = msgpack.packb([spec.pipeline_name, encode_key((r["k"],)), us(r["window_start"])], use_bin_type=True)
        assert r["session_id"] == int.from_bytes(hashlib.sha256(doc).digest()[:8], "big", signed=True)
    if policy == "dlq":
        dead = target_rows(Path(spec.dead_letter.path))
        assert sorted((str(d["k"]), d["_reason"]) for d in dead) == [("None", "late"), ("a", "late"), ("a", "late"),
                                                                     ("b", "late")]



def test_sessions_continue_across_runs_from_the_sqlite_store(spark, tmp_path, batch_files):
    """Two runs over one checkpoint and SQLite store: the sessions the first run left open (with
    their stored ends) are continued by the second, and together they emit what one run would."""
    import dataclasses

    from ematix_dagster.spec import StateStoreConfig

    feed, files = Feed(), batch_files("in")
    window = {"kind": "session", "gap_ms": GAP_S * 1000, "max_session_duration_ms": CAP_S * 1000,
              "group_by": ["k"], "aggregations": AGGREGATIONS}
    spec = make_spec(tmp_path, "sessions-restart", [files_source("a", tmp_path / "in")], window)
    spec = dataclasses.replace(spec, state_store=StateStoreConfig(kind="sqlite", path=str(tmp_path / "state.db")))
    ids = iter(range(1, 1000))
    for rows in BATCHES[:2]:
        feed.parquet("a", files, [row(next(ids), k, v, at(s)) for k, s, v in rows])
    first, _ = run(spec, spark)
    assert first.windows_left_open > 0  # sessions still open are kept in the store
    from ematix_dagster.operations import summary

    held = summary(spec)["sessions"]  # what `ematix-dagster state` shows
    assert held["sessions"] == first.windows_left_open == sum(t["sessions"] for t in held["top_keys"])
    assert held["keys"] == len(held["top_keys"]) and all(len(t["key"]) == 1 for t in held["top_keys"])
    for rows in BATCHES[2:]:
        feed.parquet("a", files, [row(next(ids), k, v, at(s)) for k, s, v in rows])
    second, _ = run(spec, spark)
    assert first.batches + second.batches == len(BATCHES)
    expected = oracle_finals(feed, spec.run.checkpoint_location, "drop")
    assert canon(as_output(target_rows(Path(spec.target.path)))) == canon([r for batch in expected for r in batch])


def test_two_sources_one_idle(spark, tmp_path, batch_files):
    """Sources a (every batch), b (batch 0 only) and c (never a row), ``source_idleness_ms = 1``: c
    holds W back in batch 0, then b and c are idle and W follows a alone, so b's session closes
    on a's event time. A late row under drop is counted, not merged."""
    a, b, c = batch_files("a"), batch_files("b"), batch_files("c")
    feed, ids = Feed(), iter(range(1, 1000))

    def put(source: str, files, rows: list[tuple]) -> None:
        feed.parquet(source, files, [row(next(ids), k, v, at(t)) for k, t, v in rows])

    put("a", a, [("a", 0, 1), ("a", 5, 2)])
    put("b", b, [("b", 100, 3), (None, 101, 4)])
    put("a", a, [("a", 12, 5), ("b", 20, 6)])  # W = 20 s: a alone (b and c idle)
    put("a", a, [("a", 40, 7), ("a", 15, 8)])  # a@15 is late (15 < 20)
    put("a", a, [("c", 130, 9)])  # W = 130 s: b's sessions [100, 110] and [101, 111] are final
    window = {"kind": "session", "gap_ms": GAP_S * 1000, "max_session_duration_ms": CAP_S * 1000,
              "group_by": ["k"], "source_idleness_ms": 1, "aggregations": AGGREGATIONS}
    spec = make_spec(tmp_path, "sessions-idle", [files_source(n, f.directory) for n, f in (("a", a), ("b", b), ("c", c))],
                     window)
    summary, _ = run(spec, spark)
    assert summary.batches == 4
    expected = oracle_finals(feed, spec.run.checkpoint_location, "drop", ("a", "b", "c"), idleness_ms=1)
    got = target_rows(Path(spec.target.path))
    assert canon(as_output(got)) == canon([r for batch in expected for r in batch])
    assert summary.reports[0].watermark is None, "c, never seen and not yet idle, holds W back"
    assert set(summary.reports[1].idle_sources) == {"b", "c"}
    assert summary.late_rows == 1
    finals = {(r["k"], us(r["window_start"])) for r in got}
    assert ("b", us(at(100))) in finals and (None, us(at(101))) in finals, "b's sessions close on a's time"
    assert len(got) == 5


@pytest.mark.parametrize("seed", [1, 2])
def test_random_splits_give_the_same_target(spark, tmp_path, batch_files, seed):
    """Rows that are never late under any split (each file holds rows at or after every earlier
    file's), cut into files at random points: every split ends in the same sessions, which are the
    oracle's for the whole input in one batch (``end_of_input = "flush"`` emits the open ones)."""
    rng = random.Random(seed)
    events = sorted(((rng.choice(["a", "b", None]), rng.randrange(0, 300_000) / 1000, rng.choice([1, 2, None]))
                     for _ in range(40)), key=lambda e: e[1])
    cuts = sorted(rng.sample(range(1, len(events)), 3))
    chunks = [events[i:j] for i, j in zip([0, *cuts], [*cuts, len(events)])]
    feed, files, ids = Feed(), batch_files("in"), iter(range(1, 1000))
    for chunk in chunks:
        feed.parquet("a", files, [row(next(ids), k, v, at(t)) for k, t, v in chunk])
    window = {"kind": "session", "gap_ms": GAP_S * 1000, "max_session_duration_ms": CAP_S * 1000,
              "group_by": ["k"], "aggregations": AGGREGATIONS}
    spec = make_spec(tmp_path, f"sessions-split-{seed}", [files_source("a", tmp_path / "in")], window,
                     end_of_input="flush")
    summary, _ = run(spec, spark)
    assert summary.last_batch_id == len(chunks) - 1 and summary.late_rows == 0
    whole = Oracle(Params(gap=GAP_S * S, cap=CAP_S * S))
    whole.batch([((k,), us(at(t)), v) for k, t, v in events])
    whole.batch([], watermark=10 ** 18)  # the flush
    got = target_rows(Path(spec.target.path))
    assert {r["_emit_kind"] for r in got} == {"final"}
    assert canon(as_output(got)) == canon([("final", start, end, key, values)
                                           for (start, key), (end, values) in whole.target.items()])
    assert len(got) == len(whole.target) > 5
