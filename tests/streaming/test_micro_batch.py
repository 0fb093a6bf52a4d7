"""The engine (``ematix_dagster/streaming/micro_batch.py``; no Spark), batch by batch: watermarks, emission,
eviction, corrections, caps and counters.

Every expected value is computed independently in the test (by hand or with plain Python), never by
calling the code under test a second time.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from ematix_dagster.errors import AggregationOverflow, StateCapExceeded
from ematix_dagster.spec import Aggregation, Window
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats
from tests.streaming.reference import MS, NAN, brute_starts, direct, same, spark_partial


def _window(**kw: Any) -> Window:
    base = dict(kind="tumbling", duration_ms=10_000, max_groups_per_window=100, group_by=("k",),
                aggregations=(Aggregation("count", "n"),), source_idleness_ms=3_600_000)
    base.update(kw)
    w = Window(**base)
    w.validate()
    return w


def _stats(rows: int, max_ms: int | None, **kw: int) -> dict[str, SourceStats]:
    return {"s": SourceStats(rows=rows, max_event_ts=None if max_ms is None else max_ms * MS, **kw)}


def _rows(result) -> list[tuple]:
    return [(r.start // MS, r.end // MS, r.key, r.values, r.kind) for r in result.rows]


def test_engine_drop_finals_exact_bounds_eviction_flush_counters() -> None:
    w = _window(lateness_ms=2_000, aggregations=(
        Aggregation("count", "n"), Aggregation("sum", "total", "v"), Aggregation("max", "top", "v")))
    eng = Engine.for_window("pipe-drop", w, sources=("s",), integral=(False, True, False))
    assert eng.closed_before() is None and eng.emitted_before() is None

    # batch 0: rows (ts ms, key, v): (1000,a,1) (3000,a,2) (9000,b,5) (12000,a,7); max 12000 -> W = 10000
    r0 = eng.process(BatchInput(
        batch_id=0, batch_time=0, sources=_stats(4, 12_000, invalid=1, future=2, malformed=3),
        starts=[0, 0, 10_000 * MS], keys=[("a",), ("b",), ("a",)],
        partials=[[2, 1, 1], [3, 5, 7], [2, 5, 7]]))
    assert r0.watermark_before is None and r0.watermark == 10_000 * MS
    # window [0, 10s) ends exactly at W: emitted, groups in key order
    assert _rows(r0) == [(0, 10_000, ("a",), (2, 3, 2), "final"), (0, 10_000, ("b",), (1, 5, 5), "final")]
    assert r0.finals == 2 and r0.corrections == 0
    assert r0.windows_open == 1 and r0.groups == 1  # no retention under drop: [0,10s) evicted at once
    assert eng.closed_before() == 10_000 * MS and eng.emitted_before() == 10_000 * MS
    assert r0.source_watermarks == {"s": 10_000 * MS} and r0.idle_sources == []

    # batch 1: (15000,b,1) (18000,a,1) (21999,a,4); W = 19999 < end 20000: nothing emitted
    r1 = eng.process(BatchInput(
        batch_id=1, batch_time=1_000 * MS, sources=_stats(3, 21_999),
        starts=[10_000 * MS, 10_000 * MS, 20_000 * MS], keys=[("b",), ("a",), ("a",)],
        partials=[[1, 1, 1], [1, 1, 4], [1, 1, 4]], late_rows=2, late_assignments=1,
        dead_letters={"late": 2}))
    assert r1.watermark == 19_999 * MS and r1.rows == []
    assert r1.windows_open == 2 and r1.groups == 4 - 1  # [10s): a,b ; [20s): a

    # batch 2: (22000, b, 9): W = 20000 -> [10s,20s) emitted
    r2 = eng.process(BatchInput(
        batch_id=2, batch_time=2_000 * MS, sources=_stats(1, 22_000),
        starts=[20_000 * MS], keys=[("b",)], partials=[[1], [9], [9]]))
    assert r2.watermark_before == 19_999 * MS and r2.watermark == 20_000 * MS
    assert _rows(r2) == [(10_000, 20_000, ("a",), (2, 8, 7), "final"),
                         (10_000, 20_000, ("b",), (1, 1, 1), "final")]
    assert r2.windows_open == 1

    # an empty batch does not move W and emits nothing
    r3 = eng.process(BatchInput(batch_id=3, batch_time=3_000 * MS, sources=_stats(0, None)))
    assert r3.rows == [] and r3.watermark == 20_000 * MS

    # flush: everything open is emitted, W raised to the largest end, state emptied
    rf = eng.flush(batch_id=4, batch_time=3_000 * MS)
    assert _rows(rf) == [(20_000, 30_000, ("a",), (1, 4, 4), "final"), (20_000, 30_000, ("b",), (1, 9, 9), "final")]
    assert rf.watermark == 30_000 * MS and rf.windows_open == 0 and rf.groups == 0
    assert eng.emitted_before() == 30_000 * MS and eng.last_batch_id == 4
    assert eng.flush(batch_id=5, batch_time=4_000 * MS).rows == []  # flushing twice emits nothing

    c = eng.counters
    assert c["windows_emitted"] == 6 and c["window_corrections"] == 0
    assert c["rows_consumed:s"] == 4 + 3 + 1
    assert c["invalid_event_time_rows:s"] == 1 and c["future_rows:s"] == 2 and c["malformed_rows:s"] == 3
    assert c["late_rows_dropped"] == 2 and c["late_assignments_dropped"] == 1
    assert c["dead_letter_rows:late"] == 2 and c["late_rows_reopened"] == 0


def test_engine_reopen_corrections_only_for_touched_groups_and_eviction() -> None:
    w = _window(late_data="reopen", allowed_lateness_ms=5_000,
                aggregations=(Aggregation("count", "n"), Aggregation("last", "last_v", "v")))
    eng = Engine.for_window("pipe-reopen", w, sources=("s",), integral=(False, False))

    # batch 0: (1000,a,"x") (2000,b,"y") (11000,a,"z") -> W = 11000: [0,10s) final, retained
    r0 = eng.process(BatchInput(
        batch_id=0, batch_time=0, sources=_stats(3, 11_000),
        starts=[0, 0, 10_000 * MS], keys=[("a",), ("b",), ("a",)],
        partials=[[1, 1, 1], [(1_000 * MS, "x"), (2_000 * MS, "y"), (11_000 * MS, "z")]]))
    assert _rows(r0) == [(0, 10_000, ("a",), (1, "x"), "final"), (0, 10_000, ("b",), (1, "y"), "final")]
    assert r0.windows_open == 2  # [0,10s) retained until W >= 15000
    assert eng.closed_before() == (11_000 - 5_000) * MS
    assert eng.emitted_before() == 11_000 * MS

    # batch 1: late (3000,a,"w") reopens [0,10s) for group a only; (12000,b,"q") on time. W = 12000
    r1 = eng.process(BatchInput(
        batch_id=1, batch_time=1_000 * MS, sources=_stats(2, 12_000),
        starts=[0, 10_000 * MS], keys=[("a",), ("b",)],
        partials=[[1, 1], [(3_000 * MS, "w"), (12_000 * MS, "q")]], reopened_rows=1))
    assert _rows(r1) == [(0, 10_000, ("a",), (2, "w"), "correction")]  # b untouched: no correction
    assert r1.finals == 0 and r1.corrections == 1
    assert r1.windows_open == 2

    # batch 2: nothing touches [0,10s) -> no correction; W = 14999 keeps it retained
    r2 = eng.process(BatchInput(batch_id=2, batch_time=2_000 * MS, sources=_stats(1, 14_999),
                                starts=[10_000 * MS], keys=[("a",)], partials=[[1], [(14_999 * MS, "r")]]))
    assert r2.rows == [] and r2.windows_open == 2

    # batch 3: another late row for [0,10s) b, and W = 15000 = end + allowed: correction, then evicted
    r3 = eng.process(BatchInput(batch_id=3, batch_time=3_000 * MS, sources=_stats(2, 15_000),
                                starts=[0], keys=[("b",)], partials=[[1], [(9_999 * MS, "m")]], reopened_rows=1))
    assert _rows(r3) == [(0, 10_000, ("b",), (2, "m"), "correction")]
    assert r3.windows_open == 1
    assert eng.closed_before() == 10_000 * MS  # [0,10s) assignments are now closed

    # batch 4: W = 20000 -> [10s,20s) final with all its rows; retained until 25000
    r4 = eng.process(BatchInput(batch_id=4, batch_time=4_000 * MS, sources=_stats(1, 20_000),
                                starts=[20_000 * MS], keys=[("a",)], partials=[[1], [(20_000 * MS, "t")]]))
    assert _rows(r4) == [(10_000, 20_000, ("a",), (2, "r"), "final"),
                         (10_000, 20_000, ("b",), (1, "q"), "final")]
    assert r4.windows_open == 2

    # flush: [20s,30s) emitted as final; W = 30000 also evicts [10s,20s) (20000 + 5000 <= 30000)
    rf = eng.flush(batch_id=5, batch_time=5_000 * MS)
    assert _rows(rf) == [(20_000, 30_000, ("a",), (1, "t"), "final")]
    assert rf.watermark == 30_000 * MS and rf.windows_open == 1  # [20s,30s) retained (30000+5000 > W)
    assert eng.counters["windows_emitted"] == 5
    assert eng.counters["window_corrections"] == 2
    assert eng.counters["late_rows_reopened"] == 2


def test_max_groups_per_window_cap_message() -> None:
    start = 1_700_000_000_000_000  # 2023-11-14T22:13:20Z
    w = _window(duration_ms=60_000, max_groups_per_window=2)
    eng = Engine.for_window("cap-pipe", w, sources=("s",), integral=(False,))
    # two groups in each of two windows is within the per-window cap
    eng.process(BatchInput(batch_id=0, batch_time=0, sources=_stats(4, 1_700_000_000_000),
                           starts=[start, start, start + 60_000 * MS, start + 60_000 * MS],
                           keys=[("a",), ("b",), ("a",), ("b",)], partials=[[1, 1, 1, 1]]))
    # a group that already exists does not count again
    eng.process(BatchInput(batch_id=1, batch_time=0, sources=_stats(1, 1_700_000_000_000),
                           starts=[start], keys=[("a",)], partials=[[1]]))
    with pytest.raises(StateCapExceeded) as exc:
        eng.process(BatchInput(batch_id=2, batch_time=0, sources=_stats(1, 1_700_000_000_000),
                               starts=[start], keys=[("c",)], partials=[[1]]))
    msg = str(exc.value)
    assert "max_groups_per_window=2" in msg
    assert "2023-11-14T22:13:20Z" in msg and "2023-11-14T22:14:20Z" in msg
    assert "cap-pipe" in msg


def test_overflow_and_distinct_cap_messages_name_pipeline_window_group() -> None:
    w = _window(aggregations=(Aggregation("sum", "total", "v"),
                              Aggregation("count_distinct", "d", "v", mode="exact", max_distinct_values_per_group=2)))
    eng = Engine.for_window("msg-pipe", w, sources=("s",), integral=(True, False))
    eng.process(BatchInput(batch_id=0, batch_time=0, sources=_stats(1, 1_000), starts=[0], keys=[("g1",)],
                           partials=[[2**63 - 1], [["x"]]]))
    with pytest.raises(AggregationOverflow) as ov:
        eng.process(BatchInput(batch_id=1, batch_time=0, sources=_stats(1, 1_000), starts=[0], keys=[("g1",)],
                               partials=[[1], [None]]))
    text = str(ov.value)
    assert "msg-pipe" in text and "total" in text and "g1" in text
    assert "1970-01-01T00:00:00Z" in text and "1970-01-01T00:00:10Z" in text
    eng2 = Engine.for_window("msg-pipe", w, sources=("s",), integral=(True, False))
    with pytest.raises(StateCapExceeded) as cap:
        eng2.process(BatchInput(batch_id=0, batch_time=0, sources=_stats(1, 1_000), starts=[0], keys=[("g2",)],
                                partials=[[1], [["x", "y", "z"]]]))
    text = str(cap.value)
    assert "max_distinct_values_per_group=2" in text and "msg-pipe" in text and "g2" in text and "d" in text


def test_engine_hopping_matches_direct_groupby() -> None:
    """Random on-time rows in hopping windows (D not a multiple of hop), many aggregations.

    Every (window, group) is emitted exactly once, at the first batch whose W reaches its end, with
    the values a direct computation over all of its rows gives.
    """
    D, hop, lateness = 10_000 * MS, 4_000 * MS, 1_000 * MS
    aggs = [("count", None), ("count_col", "f"), ("sum", "i"), ("min", "f"), ("max", "f"), ("avg", "h"),
            ("first", "f"), ("last", "f"), ("count_distinct", "s")]
    spec_aggs = tuple(
        Aggregation(a, f"o{j}", col, mode="exact" if a == "count_distinct" else None,
                    max_distinct_values_per_group=50 if a == "count_distinct" else None)
        for j, (a, col) in enumerate(aggs))
    w = _window(kind="hopping", duration_ms=10_000, hop_ms=4_000, lateness_ms=1_000, aggregations=spec_aggs)
    for seed in range(5):
        rng = random.Random(seed)
        n = 60
        ts = sorted(rng.randint(-5_000 * MS, 60_000 * MS) for _ in range(n))
        rows = [dict(ts=t, k=rng.choice(["a", "b", None]),
                     f=rng.choice([None, NAN, 1.5, -2.0, 3.0, 3.0, float("inf")]),
                     i=rng.choice([None, 1, 2, -7, 10**12]),
                     h=rng.choice([None, 0.5, 1.0, -4.0]),
                     s=rng.choice([None, "", "x", "y", "z"])) for t in ts]
        cuts = sorted(rng.sample(range(1, n), 6))
        batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, n])]

        # expected: direct per (window start, key) over all rows
        members: dict[tuple, list[dict]] = {}
        for r in rows:
            for s in brute_starts(r["ts"], D, hop, lo=-10, hi=30):
                members.setdefault((s, (r["k"],)), []).append(r)
        expected = {wk: tuple(direct(a, [(r["ts"], None if col is None else r[col]) for r in rs]) if col
                              else len(rs) for a, col in aggs)
                    for wk, rs in members.items()}

        eng = Engine.for_window(f"hop-{seed}", w, sources=("s",),
                                integral=tuple(a == "sum" for a, _ in aggs))
        seen: dict[tuple, tuple] = {}
        w_prev = None
        max_ts = None
        for b, batch in enumerate(batches):
            groups: dict[tuple, list[dict]] = {}
            for r in batch:
                for s in brute_starts(r["ts"], D, hop, lo=-10, hi=30):
                    groups.setdefault((s, (r["k"],)), []).append(r)
            order = list(groups)
            rng.shuffle(order)  # Spark hands partials in no particular order
            partials = [[spark_partial(a, [(r["ts"], None if col is None else r[col]) for r in groups[g]])
                         for g in order] for a, col in aggs]
            batch_max = max(r["ts"] for r in batch)
            res = eng.process(BatchInput(batch_id=b, batch_time=b * 1_000 * MS,
                                         sources={"s": SourceStats(rows=len(batch), max_event_ts=batch_max)},
                                         starts=[g[0] for g in order], keys=[g[1] for g in order],
                                         partials=partials))
            max_ts = batch_max if max_ts is None else max(max_ts, batch_max)
            w_now = max_ts - lateness
            assert res.watermark == w_now
            due = {wk for wk in expected if wk[0] + D <= w_now and (w_prev is None or wk[0] + D > w_prev)}
            got = {(r.start, r.key) for r in res.rows}
            assert all(r.kind == "final" for r in res.rows)
            assert len(res.rows) == len(got)
            assert got == due, (seed, b)
            assert [r.start for r in res.rows] == sorted(r.start for r in res.rows)
            for r in res.rows:
                assert r.end == r.start + D
                seen[(r.start, r.key)] = r.values
            w_prev = w_now
        rf = eng.flush(batch_id=len(batches), batch_time=len(batches) * 1_000 * MS)
        for r in rf.rows:
            assert (r.start, r.key) not in seen
            seen[(r.start, r.key)] = r.values
        assert rf.windows_open == 0
        assert set(seen) == set(expected)
        for wk, vals in expected.items():
            assert same(seen[wk], vals), (seed, wk, seen[wk], vals)
        assert eng.counters["windows_emitted"] == len(expected)


def test_engine_idle_sources_and_processing_time() -> None:
    w = _window(source_idleness_ms=5_000)
    eng = Engine.for_window("two", w, sources=("a", "b"), integral=(False,))
    r0 = eng.process(BatchInput(batch_id=0, batch_time=100_000 * MS,
                                sources={"a": SourceStats(rows=1, max_event_ts=12_000 * MS)},
                                starts=[10_000 * MS], keys=[("x",)], partials=[[1]]))
    assert r0.watermark is None and r0.idle_sources == [] and r0.rows == []  # b never seen, not idle yet
    r1 = eng.process(BatchInput(batch_id=1, batch_time=105_001 * MS,
                                sources={"a": SourceStats(rows=1, max_event_ts=21_000 * MS),
                                         "b": SourceStats(rows=0)},
                                starts=[20_000 * MS], keys=[("x",)], partials=[[1]]))
    assert r1.idle_sources == ["b"] and r1.watermark == 21_000 * MS
    assert _rows(r1) == [(10_000, 20_000, ("x",), (1,), "final")]
    assert r1.source_watermarks == {"a": 21_000 * MS, "b": None}

    # processing time: W follows the batch time, windows close on the clock whatever the event times
    wp = _window(time_mode="processing")
    eng_p = Engine.for_window("proc", wp, sources=("s",), integral=(False,))
    rp0 = eng_p.process(BatchInput(batch_id=0, batch_time=9_999 * MS, sources=_stats(1, 10**9),
                                   starts=[0], keys=[("x",)], partials=[[3]]))
    assert rp0.watermark == 9_999 * MS and rp0.rows == []
    rp1 = eng_p.process(BatchInput(batch_id=1, batch_time=10_000 * MS, sources=_stats(0, None)))
    assert _rows(rp1) == [(0, 10_000, ("x",), (3,), "final")]
