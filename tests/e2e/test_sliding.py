"""Sliding windows end to end on real Spark (docs/contract/windows.md): files -> windows -> parquet, against the oracle.

Each file is one micro-batch. The ground truth is the sliding oracle of
``tests/streaming/sliding_oracle.py`` (docs/contract/windows.md applied batch by batch, no engine code), fed the rows
each batch read according to Spark's checkpoint. Every batch's rows in the target must be exactly
the oracle's rows of that batch (the end-of-input flush's with the last batch), with the values of
every aggregator; late rows are dropped, dead-lettered or (under ``reopen``) let in by the
allowance, and the counters say so.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from ematix_dagster.operations import summary as state_summary
from ematix_dagster.spec import StateStoreConfig
from tests.e2e.lateness_helpers import Feed, files_source, make_spec, metric, read_batch_dirs, row, run, us
from tests.e2e.test_sessions import AGGREGATIONS, APPROX_DISTINCT
from tests.streaming.sliding_oracle import ALIASES, Oracle, Params, canon

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
S = 1_000_000
D_S = 10
ALLOWED_S = 5


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


# (key, seconds after T0, v). Batch 0: rows exactly D apart (a@0 is in window a@10), a shared event
# time (a@10 twice: one window), a NULL key, a NULL value. Batch 1 (W_prev = 10): a@9 is behind W
# but not late (9 + D >= 10): it makes no window, yet counts in the open window a@10; b@1 reaches
# the emitted window b@5 only under reopen; a@-1 is late unless the allowance lets it in. Batch 2
# (W_prev = 20): a@16 creates a window behind W only under reopen (a correction); None@3 is late
# under every policy.
# tests/fixtures/state_v7 and state_v8 were made from these (test_state_v7_fixtures.py, test_state_v8_fixtures.py):
# changing them breaks those fixtures
BATCHES = [
    [("a", 0, 1), ("a", 10, 2), ("a", 10, 3), ("b", 5, 4), (None, 7, 5), ("a", 4, None)],
    [("a", 20, 6), ("b", 1, 7), ("c", 12, 8), ("a", 9, 9), ("a", -1, 10)],
    [("a", 30, 11), ("c", 22, 12), ("a", 14, 13), ("a", 16, 14), (None, 3, 15)],
    [("b", 100, 16)],
]


def write_batches(batch_files, batches: list[list[tuple]], feed: Feed | None = None, files=None) -> tuple[Feed, Any]:
    feed = feed or Feed()
    files = files or batch_files("in")
    first = 1 + sum(len(rows) for rows in feed.rows.values())
    ids = iter(range(first, first + 1000))
    for rows in batches:
        feed.parquet("a", files, [row(next(ids), k, v, at(s)) for k, s, v in rows])
    return feed, files


# tests/fixtures/state_v7 and state_v8 were made from these (test_state_v7_fixtures.py, test_state_v8_fixtures.py):
# changing them breaks those fixtures
def sliding_window(policy: str, aggregations: list[dict[str, Any]] = AGGREGATIONS) -> dict[str, Any]:
    window = {"kind": "sliding", "duration_ms": D_S * 1000, "max_events_per_group": 100, "group_by": ["k"],
              "late_data": policy, "aggregations": aggregations}
    if policy == "reopen":
        window["allowed_lateness_ms"] = ALLOWED_S * 1000
    return window


def oracle_batches(feed: Feed, cp: str, policy: str) -> tuple[Oracle, list[list[tuple]], int]:
    """The oracle's rows per batch Spark formed (the flush's with the last), and how many accepted
    rows were behind the previous watermark (what ``late_rows_reopened`` counts under reopen)."""
    p = Params(duration_ms=D_S * 1000, policy=policy, allowed_ms=ALLOWED_S * 1000 if policy == "reopen" else 0)
    oracle, out, behind = Oracle(p), [], 0
    for batch in feed.batches(cp, ["a"]):
        rows = [((None if pd_isna(r["k"]) else r["k"],), int(r["_event_ts"]), None if pd_isna(r["v"]) else int(r["v"]))
                for r in batch.rows.to_dict("records")]
        w_prev = oracle.w
        if w_prev is not None:
            behind += sum(1 for _, x, _ in rows if x < w_prev and x + p.D >= w_prev - p.retention)
        out.append(oracle.batch(rows))
    out[-1] = canon(out[-1] + oracle.flush())
    return oracle, out, behind


def pd_isna(value: Any) -> bool:
    return value is None or value != value


def target_batches(path: str) -> dict[int, list[tuple]]:
    """The target's rows per batch id as the oracle writes them: (kind, start, end, key, values)."""
    return {b: canon([(r["_emit_kind"], r["window_start"], r["window_end"], (r["k"],), tuple(r[a] for a in ALIASES))
                      for r in rows]) for b, rows in read_batch_dirs(path).items()}


@pytest.mark.parametrize("policy", ["drop", "dlq", "reopen"])
def test_sliding_windows_match_the_oracle(spark, tmp_path, batch_files, policy):
    feed, _ = write_batches(batch_files, BATCHES)
    spec = make_spec(tmp_path, f"sliding-{policy}", [files_source("a", tmp_path / "in")],
                     sliding_window(policy, [*AGGREGATIONS, APPROX_DISTINCT]), dead_letter=policy == "dlq",
                     end_of_input="flush")
    result, registry = run(spec, spark)
    assert result.last_batch_id == len(BATCHES) - 1
    oracle, expected, behind = oracle_batches(feed, spec.run.checkpoint_location, policy)
    assert target_batches(spec.target.path) == {b: rows for b, rows in enumerate(expected) if rows}
    got = [r for rows in read_batch_dirs(spec.target.path).values() for r in rows]
    assert all(r["hll_v"] == r["distinct_v"] for r in got)  # both count_distinct modes
    assert result.late_rows == oracle.stats["late"] == (1 if policy == "reopen" else 2)
    finals = sum(1 for rows in expected for r in rows if r[0] == "final")
    assert metric(registry, "windows_emitted_total", pipeline=spec.pipeline_name, kind="sliding") == finals
    t0 = us(T0)
    # window a@10 is [0 s, 10 s], both bounds inclusive: a@0, a@4, a@10 twice, and (batch 1) a@9
    a10 = [r for r in got if r["k"] == "a" and r["window_end"] == t0 + 10 * S]
    assert [(r["window_start"] - t0, r["n"], r["sum_v"]) for r in a10] == [(0, 5, 15)]
    kinds = {(r["k"], (r["window_end"] - t0) // S, r["_emit_kind"]) for r in got}
    if policy == "reopen":
        assert {("a", 16, "correction"), ("b", 5, "final"), ("b", 5, "correction")} <= kinds
        assert metric(registry, "late_rows_reopened_total", pipeline=spec.pipeline_name) == behind > 0
    else:
        windows = {(k, end) for k, end, _ in kinds}
        assert ("a", 16) not in windows and ("a", 9) not in windows, "rows behind W create no window"
        assert {kind for _, _, kind in kinds} == {"final"}
    if policy == "dlq":
        dead = [d for rows in read_batch_dirs(spec.dead_letter.path).values() for d in rows]
        assert sorted((str(d["k"]), d["_event_ts"] - t0, d["_reason"]) for d in dead) == [
            ("None", 3 * S, "late"), ("a", -1 * S, "late")]


def test_sliding_windows_continue_across_runs_from_the_sqlite_store(spark, tmp_path, batch_files):
    """Two runs over one checkpoint and SQLite store, the second after a restart: the retained
    partials (listed by ``ematix-dagster state``) are continued, and together the runs write what
    the oracle writes for one run."""
    spec = make_spec(tmp_path, "sliding-restart", [files_source("a", tmp_path / "in")], sliding_window("reopen"))
    spec = dataclasses.replace(spec, state_store=StateStoreConfig(kind="sqlite", path=str(tmp_path / "state.db")))
    feed, files = write_batches(batch_files, BATCHES[:2])
    first, _ = run(spec, spark)
    held = state_summary(spec)["events"]  # what `ematix-dagster state` shows
    assert held["events"] == first.reports[-1].counts.state_groups > 0
    assert held["keys"] == len(held["top_keys"]) and held["events"] == sum(t["events"] for t in held["top_keys"])
    write_batches(batch_files, BATCHES[2:], feed, files)
    second, _ = run(spec, spark)
    assert first.batches + second.batches == len(BATCHES)
    _, expected, _ = oracle_batches(feed, spec.run.checkpoint_location, "reopen")
    expected[-1] = [r for r in expected[-1] if r[2] < us(at(100))]  # no flush: b@100 stays open
    assert target_batches(spec.target.path) == {b: rows for b, rows in enumerate(expected) if rows}
