"""Session windows end to end on real Spark (SPEC.md §8): files -> sessions -> parquet, against the oracle.

Each file is one micro-batch. The ground truth is the session oracle of
``tests/test_session_state.py`` (pandas; SPEC.md §8 applied batch by batch, no engine code), fed
the rows each batch read according to Spark's checkpoint. The target must hold exactly the
oracle's ``final`` rows, batch by batch, with the aggregates of every aggregator; late rows are
dropped or dead-lettered; ``session_id`` is SPEC.md §8's hash.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

import msgpack
import pyarrow.parquet as pq
import pytest

from state_store.codec import encode_key
from tests.test_lateness_e2e import Feed, files_source, make_spec, row, run, us
from tests.test_session_state import ALIASES, Oracle, Params, canon

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)  # a multiple of the cap
S = 1_000_000
GAP_S, CAP_S = 10, 60
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


def oracle_finals(feed: Feed, cp: str, policy: str) -> list[list[tuple]]:
    oracle = Oracle(Params(gap=GAP_S * S, cap=CAP_S * S, policy=policy))
    out = []
    for batch in feed.batches(cp, ["a"]):
        rows = [((None if pd_isna(r["k"]) else r["k"],), int(r["_event_ts"]), None if pd_isna(r["v"]) else int(r["v"]))
                for r in batch.rows.to_dict("records")]
        retracts, emitted = oracle.batch(rows)
        assert not retracts  # nothing is retracted without reopen
        out.append(emitted)
    return out


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
    as_out = [("final", us(r["window_start"]), us(r["window_end"]), (r["k"],), tuple(r[a] for a in ALIASES))
              for r in got]
    assert canon(as_out) == canon([r for batch in expected for r in batch])
    assert all(r["hll_v"] == r["distinct_v"] for r in got)  # both count_distinct modes
    assert summary.late_rows == 4
    # sessions: a [0, 10] (10 s apart joins) ends at 20, a [20.001] (10.001 s: a new one) at 30.001,
    # b [55] is cut at the bucket end (60), b [62] ends at 72
    starts = {(r["k"], us(r["window_start"])): us(r["window_end"]) for r in got}
    t0 = us(T0)
    assert starts[("a", t0)] == t0 + 20 * S and starts[("a", t0 + 20_001_000)] == t0 + 30_001_000
    assert starts[("b", t0 + 55 * S)] == t0 + 60 * S and starts[("b", t0 + 62 * S)] == t0 + 72 * S
    for r in got:  # SPEC.md §8: the first 8 bytes of SHA-256 over msgpack([pipeline, key bytes, start µs])
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
    got = [("final", us(r["window_start"]), us(r["window_end"]), (r["k"],), tuple(r[a] for a in ALIASES))
           for r in target_rows(Path(spec.target.path))]
    assert canon(got) == canon([r for batch in expected for r in batch])
