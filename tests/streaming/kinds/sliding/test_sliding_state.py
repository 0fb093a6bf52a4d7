"""Sliding windows (KIP-450, docs/contract/windows.md) on the driver against an independent ground truth.

The oracle, the partials Spark will send and the harness that runs the real ``Engine`` beside the oracle (a
simulated store to restart from) live in tests/streaming/sliding_oracle.py. No Spark is started.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.streaming.aggregators import Count
from ematix_dagster.streaming.emission import emit
from ematix_dagster.streaming.kinds import SlidingWindows
from ematix_dagster.streaming.kinds.sliding.sliding_state import SlidingState
from tests.streaming.sliding_oracle import (
    ADDITIVE,
    ALIASES,
    MS,
    Both,
    Harness,
    Key,
    Oracle,
    Out,
    Params,
    Row,
    T,
    canon,
    run_both,
)

A, Z = ("a",), ("z",)


def vals(*vs: int) -> tuple[Any, ...]:
    """The expected values of a window whose rows carry ``vs`` at distinct, increasing times (no NULLs)."""
    return (len(vs), len(vs), sum(vs), min(vs), max(vs), vs[0], vs[-1], len(set(vs)), sum(vs) / len(vs))


def final(t: int, key: Key, values: tuple[Any, ...], D: int = 10 * T) -> Out:  # noqa: N803
    return ("final", t - D, t, key, values)


def correction(t: int, key: Key, values: tuple[Any, ...], D: int = 10 * T) -> Out:  # noqa: N803
    return ("correction", t - D, t, key, values)


# -- the oracle on its own (hand-computed values) --------------------------------------------------

def test_oracle_by_hand() -> None:
    o = Oracle(Params())
    assert o.batch([]) == [] and o.w is None
    # W = 20 ms + 1 µs: windows 0 and 10 ms are final, 20 ms + 1 µs is not (t < W is strict)
    assert o.batch([(A, 0, 1), (A, 10 * T, 2), (A, 20 * T + 1, 3)]) == [final(0, A, vals(1)),
                                                                        final(10 * T, A, vals(1, 2))]
    assert sorted(o.windows) == [(A, 20 * T + 1)] and o.gone == {(A, 0), (A, 10 * T)}
    assert o.batch([(A, 10 * T + 1, 4), (A, 10 * T, 5)]) == []  # x + D = W_prev kept (no window); 1 µs less late
    assert o.stats["late"] == 1 and o.stats["accepted_without_window"] == 1
    assert o.batch([(Z, 100 * T, 0)]) == [final(20 * T + 1, A, vals(4, 3))]
    assert o.flush() == [final(100 * T, Z, vals(0))] and o.flush() == []


# -- scenarios with exact values -------------------------------------------------------------------

def test_rows_sharing_an_event_time_make_one_window() -> None:
    b = run_both(Params(), [
        [(A, 5 * T, 1), (A, 5 * T, 2), (A, 5 * T, None)],
        [(A, 5 * T, 4), (A, 8 * T, 3)],  # 5 ms >= W_prev = 5 ms: joins the still open window 5 ms
        [(Z, 100 * T, 0)],
    ], flush=True)
    assert b.harness.outputs == [
        [],
        [final(5 * T, A, (4, 3, 7, 1, 4, 1, 4, 3, 7 / 3))],  # ties at one time: first = min, last = max value
        [final(8 * T, A, (5, 4, 10, 1, 4, 1, 3, 4, 2.5))],
    ]


def test_both_bounds_are_inclusive() -> None:
    rows = [(A, 0, 1), (A, 10 * T, 2), (A, 20 * T + 1, 3), (("b",), 0, 5), (("b",), 10 * T - 1, 6),
            (("b",), 20 * T - 1, 7), (Z, 100 * T, 0)]
    b = run_both(Params(), [rows], flush=True)
    B = ("b",)  # noqa: N806
    assert b.harness.outputs == [sorted([
        final(0, A, vals(1)), final(10 * T, A, vals(1, 2)),  # 0 = 10 ms - D counts in window 10 ms
        final(20 * T + 1, A, vals(3)),  # 10 ms = (20 ms + 1 µs) - D - 1 µs does not
        final(0, B, vals(5)), final(10 * T - 1, B, vals(5, 6)), final(20 * T - 1, B, vals(6, 7)),
    ], key=lambda r: (r[1], repr(r[3]), r[0]))]


@pytest.mark.parametrize("policy", ["drop", "dlq"])
def test_late_rows_are_not_merged(policy: str) -> None:
    b = run_both(Params(policy=policy), [
        [(A, 0, 1), (A, 50 * T, 2)],
        [(A, 39 * T, 7), (A, 40 * T, 8), (A, 55 * T, 3)],  # 39 + 10 < 50: late; 40 is kept but makes no window
        [(Z, 100 * T, 0)],
    ], flush=True)
    assert b.harness.outputs == [
        [final(0, A, vals(1))],
        [final(50 * T, A, vals(8, 2))],
        [final(55 * T, A, vals(2, 3))],
    ]
    assert b.harness.late == 1 and b.oracle.stats["accepted_without_window"] == 1


def test_reopen_corrections() -> None:
    p = Params(policy="reopen", allowed_ms=30)
    b = run_both(p, [
        [(A, 0, 1), (A, 20 * T, 2), (Z, 50 * T, 0)],  # W = 50: a@0, a@20 final; a@0 forgotten (0 + 30 < 50)
        [(A, 25 * T, 5), (A, 12 * T, 6), (A, 5 * T, 9)],  # 25 creates a window behind W; 12 changes a@20; 5 late
        [(A, 21 * T, 4), (Z, 81 * T, 0)],  # 21 creates a window and changes a@25; W = 81 forgets a@20..25
        [(A, 45 * T, 7), (A, 40 * T, 8), (A, 51 * T, 3)],  # 40 late; 45 kept, no window; 51 = W - allowed
        [(Z, 200 * T, 0)],
    ], flush=True)
    assert b.harness.outputs == [
        [final(0, A, vals(1)), final(20 * T, A, vals(2))],
        [correction(20 * T, A, vals(6, 2)), correction(25 * T, A, vals(2, 5))],
        [correction(21 * T, A, vals(6, 2, 4)), correction(25 * T, A, vals(2, 4, 5)), final(50 * T, Z, vals(0))],
        [correction(51 * T, A, vals(7, 3))],
        [final(81 * T, Z, vals(0))],
    ]
    assert b.harness.late == 2


def test_reopen_row_exactly_at_the_allowance() -> None:
    """Under reopen the threshold is W_prev - allowed (here 40 - 15 = 25 ms): a row with x + D = 25 ms is
    kept, 1 µs less is late; a row at exactly 25 ms creates a window (behind W_prev: a correction)."""
    p = Params(policy="reopen", allowed_ms=15)
    B = ("b",)  # noqa: N806
    b = run_both(p, [
        [(A, 25 * T, 1), (Z, 40 * T, 0)],  # W = 40: a@25 final, retained (25 + 15 is not < 40)
        [(A, 15 * T, 2), (A, 15 * T - 1, 3)],  # 15 kept, no window, changes a@25; 15 ms - 1 µs late
        [(B, 25 * T, 4), (B, 25 * T - 1, 5)],  # b@25 is created behind W; 25 ms - 1 µs makes no window
    ], flush=True)
    assert b.harness.outputs == [
        [final(25 * T, A, vals(1))],
        [correction(25 * T, A, vals(2, 1))],
        [correction(25 * T, B, vals(5, 4))],
    ]
    assert b.flushed == [final(40 * T, Z, vals(0))]
    assert b.harness.late == 1 and b.oracle.stats["accepted_without_window"] == 2


@pytest.mark.parametrize("policy, allowed_ms", [("drop", 0), ("reopen", 5)])
def test_a_row_d_before_the_threshold_is_kept_for_a_window_created_at_it(policy: str, allowed_ms: int) -> None:
    """After W, a window may still be created at W - retention, and it reaches back to W - retention - D:
    a row exactly there must still be held."""
    p = Params(policy=policy, allowed_ms=allowed_ms)
    threshold = 10 * T
    b = run_both(p, [
        [(A, 0, 1), (Z, threshold + p.retention, 0)],
        [(A, threshold, 2)],  # the window [0, threshold] holds a@0
        [(Z, 100 * T, 0)],
    ], flush=True)
    made = final if policy == "drop" else correction  # under reopen the window is behind W_prev
    assert b.harness.outputs[0] == [final(0, A, vals(1))]
    assert (made(threshold, A, vals(1, 2)) in b.harness.outputs[1] + b.harness.outputs[2])


def test_lateness_delays_the_watermark() -> None:
    b = run_both(Params(lateness_ms=5), [
        [(A, 0, 1), (A, 10 * T, 2)],  # W = 5
        [(A, 3 * T, 3), (A, 14 * T, 4)],  # 3 counts in a@10, makes no window; W = 9
        [(A, 16 * T, 5)],  # W = 11: a@10 final
        [(A, 4 * T, 6), (A, 0, 9), (Z, 100 * T, 0)],  # 4 + 10 >= 11 kept; 0 + 10 < 11 late
    ], flush=True)
    assert b.harness.outputs == [
        [final(0, A, vals(1))],
        [],
        [final(10 * T, A, vals(1, 3, 2))],
        [final(14 * T, A, vals(6, 2, 4)), final(16 * T, A, vals(2, 4, 5))],
    ]
    assert b.harness.watermarks == [5 * T, 9 * T, 11 * T, 95 * T] and b.harness.late == 1


def test_every_aggregator() -> None:
    rows = [(A, 0, 3), (A, 2 * T, None), (A, 4 * T, -2), (A, 6 * T, 3), (A, 6 * T, 7), (A, 8 * T, None),
            (A, 16 * T, None), (("n",), 1 * T, None)]
    b = run_both(Params(), [rows, [(Z, 100 * T, 0)]], flush=True)  # W = 16 ms after the first batch
    assert canon(b.harness.outputs[0] + b.harness.outputs[1]) == sorted([
        final(0, A, (1, 1, 3, 3, 3, 3, 3, 1, 3.0)),
        final(2 * T, A, (2, 1, 3, 3, 3, 3, 3, 1, 3.0)),
        final(4 * T, A, (3, 2, 1, -2, 3, 3, -2, 2, 0.5)),
        final(6 * T, A, (5, 4, 11, -2, 7, 3, 7, 3, 2.75)),
        final(8 * T, A, (6, 4, 11, -2, 7, 3, 7, 3, 2.75)),
        final(16 * T, A, (4, 2, 10, 3, 7, 3, 7, 2, 5.0)),  # first / last tie at 6 ms: 3 and 7
        final(1 * T, ("n",), (1, 0, None, None, None, None, None, 0, None)),  # only NULL values
    ], key=lambda r: (r[1], repr(r[3]), r[0]))


def test_null_keys_are_groups_of_their_own() -> None:
    N, S = (None,), ("None",)  # noqa: N806
    b = run_both(Params(), [
        [(N, 0, 1), (A, 0, 2), (S, 0, 3), (N, 5 * T, None)],
        [(A, 5 * T, 4), (N, 200 * T, None)],
    ], flush=True)
    assert b.harness.outputs == [
        canon([final(0, N, vals(1)), final(0, A, vals(2)), final(0, S, vals(3))]),
        canon([final(5 * T, N, (2, 1, 1, 1, 1, 1, 1, 1, 1.0)), final(5 * T, A, vals(2, 4))]),
    ]
    assert b.flushed == [final(200 * T, N, (1, 0, None, None, None, None, None, 0, None))]


def test_event_cap_counts_distinct_retained_event_times() -> None:
    b = Both(Params(max_events=3))
    b.batch([(A, 0, 1), (A, T, 2), (A, T, 3), (A, 2 * T, 4), (A, 2 * T, 5)])  # 3 distinct times, 5 rows
    b.batch([(("b",), 50 * T, 0)])  # W = 50: a's rows (x + D < 50) are needed by no window any more
    b.batch([(A, 51 * T, 1), (A, 52 * T, 2), (A, 53 * T, 3), (A, 53 * T, 4)])
    b.batch([(A, 53 * T, 5)])  # a time already held does not count again
    with pytest.raises(StateCapExceeded) as failed:
        b.harness.batch([(A, 54 * T, 6)])  # 51..53 are still needed (x + D >= W_prev = 53): a 4th time
    message = str(failed.value)
    assert "max_events_per_group" in message and "('a',)" in message, message


def test_event_cap_in_one_batch() -> None:
    h = Harness(Params(max_events=2))
    with pytest.raises(StateCapExceeded, match=r"\('k1',\)"):
        h.batch([(("k0",), 0, 1), (("k1",), 0, 1), (("k1",), 3 * T, 1), (("k1",), 6 * T, 1)])


def test_caps_hold_exactly_at_their_bounds_across_batches() -> None:
    # a key holding 2 times takes a 3rd (cap 3) but not a 4th; a state of 1 key takes a 2nd (cap 2)
    # but not a 3rd, whether the rows come one batch at a time or together
    h = Harness(Params(max_events=3))
    h.batch([(A, 0, 1), (A, T, 1)])
    with pytest.raises(StateCapExceeded, match="max_events_per_group"):
        h.batch([(A, 2 * T, 1), (A, 3 * T, 1)])
    h.batch([(A, 2 * T, 1)])
    h = Harness(Params(max_groups=2))
    h.batch([(A, 0, 1)])
    with pytest.raises(StateCapExceeded, match="max_groups_per_window"):
        h.batch([(("b",), T, 1), (("c",), T, 1)])
    h.batch([(("b",), T, 1)])


def test_group_cap_counts_keys_holding_retained_rows() -> None:
    b = Both(Params(max_groups=2))
    b.batch([(A, 0, 1), (("b",), 100 * T, 2)])  # W = 100: a's row is needed no more
    b.batch([(("c",), 101 * T, 3)])  # b and c hold rows
    with pytest.raises(StateCapExceeded) as failed:
        b.harness.batch([(("d",), 102 * T, 4), (("c",), 103 * T, 5)])  # b (100 + 10 >= 101), c, d
    message = str(failed.value)
    assert "max_groups_per_window" in message and "('d',)" in message, message


# -- randomised: against the oracle per policy; split invariance without late rows -----------------

RANDOM_KEYS: list[Key] = [("a",), (None,), ("b",), ("c",)]
BASE = 1_700_000_000_000_000  # a realistic epoch time in µs


def random_rows(rng: random.Random, n: int, disorder_ms: int, step_ms: int = 3, keys: int = 4,
                pool: list[Key] = RANDOM_KEYS) -> list[Row]:
    """Rows in arrival order: event times advance by 0..step ms, up to ``disorder_ms`` behind, on whole
    ms mostly (so rows land exactly D apart and exactly on thresholds) and now and then 1 µs off."""
    rows, t, choices = [], BASE, pool[:keys]
    for _ in range(n):
        t += rng.randint(0, step_ms) * MS
        x = t - rng.randint(0, disorder_ms) * MS + rng.choice([0, 0, 0, 0, 0, -1, 1])
        rows.append((rng.choice(choices), x, rng.choice([None, *range(-5, 6)])))
    return rows


def random_split(rng: random.Random, rows: list[Row], batches: int) -> list[list[Row]]:
    cuts = sorted(rng.sample(range(1, len(rows)), batches - 1))
    return [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)])]


@pytest.mark.parametrize("policy", ["drop", "dlq", "reopen"])
@pytest.mark.parametrize("aliases", [tuple(ALIASES), ADDITIVE], ids=["two-stacks", "prefix-sums"])
def test_random_late_data_matches_the_oracle(policy: str, aliases: tuple[str, ...]) -> None:
    """All nine aggregations take the two-stack path; additive ones alone (counts, sums, averages)
    take prefix sums."""
    stats: Counter[str] = Counter()
    kinds: set[str] = set()
    for seed in range(20):
        rng = random.Random(1_000 * seed + len(policy))
        p = Params(duration_ms=rng.choice([4, 10, 20]), lateness_ms=rng.choice([0, 0, 3]), policy=policy,
                   allowed_ms=rng.choice([5, 15, 40]) if policy == "reopen" else 0, aliases=aliases)
        rows = random_rows(rng, 220, disorder_ms=rng.choice([10, 30, 60]), keys=rng.choice([1, 2, 4]))
        batches = random_split(rng, rows, 12)
        batches.insert(rng.randrange(len(batches)), [])  # a batch without rows
        both = run_both(p, batches, seed=seed, flush=True, restart_after=rng.randrange(len(batches)))
        stats += both.oracle.stats
        kinds |= {r[0] for out in both.harness.outputs for r in out}
    assert stats["late"] > 0 and stats["accepted_without_window"] > 0
    if policy == "reopen":
        assert kinds == {"final", "correction"}
        assert stats["created_behind"] > 0 and stats["changed_retained"] > 0
    else:
        assert kinds == {"final"}


#: keys that are their own ids (``IntKeys``): small, negative, past what a (key, time) pair holds, int64's ends
INT_KEYS: list[Key] = [(7,), (-3,), (10**15,), (2**63 - 1,), (-(2**63),)]


@pytest.mark.parametrize("later", [None, (None,)], ids=["ints throughout", "then a NULL"])
@pytest.mark.parametrize("aliases", [tuple(ALIASES), ADDITIVE], ids=["two-stacks", "prefix-sums"])
def test_integer_keys_match_the_oracle_and_move_to_an_index_when_a_null_comes(later: Key | None,
                                                                              aliases: tuple[str, ...]) -> None:
    """Partials of one-integer keys hold no key objects; a later batch bringing a NULL key (which
    no int64 id stands for) moves every held partial to a key index mid-stream. Both match the
    oracle, across a restart."""
    for seed in range(4):
        rng = random.Random(seed)
        p = Params(duration_ms=10, lateness_ms=3, policy="reopen", allowed_ms=15, aliases=aliases)
        rows = random_rows(rng, 220, disorder_ms=30, keys=len(INT_KEYS), pool=INT_KEYS)
        if later is not None:
            rows[150:] = [(later if rng.random() < 0.3 else key, t, v) for key, t, v in rows[150:]]
        both = run_both(p, random_split(rng, rows, 12), seed=seed, flush=True, restart_after=rng.randrange(12))
        assert type(both.harness.engine.state.codes).__name__ == ("IntKeys" if later is None else "KeyIndex")


@pytest.mark.parametrize("seed", range(6))
def test_split_invariance_without_late_rows(seed: int) -> None:
    rng = random.Random(500 + seed)
    disorder = rng.choice([0, 4])
    p = Params(duration_ms=rng.choice([4, 10]), lateness_ms=disorder, policy=rng.choice(["drop", "dlq", "reopen"]),
               allowed_ms=20)
    rows = sorted(random_rows(rng, 300, disorder_ms=0, step_ms=2, keys=rng.choice([2, 4])), key=lambda r: r[1])
    if disorder:  # up to ``lateness`` behind the newest row: never behind W under any split
        rows = [(k, x - rng.randint(0, disorder) * MS, v) for k, x, v in rows]
        newest = None
        for _, x, _ in rows:
            assert newest is None or x >= newest - disorder * MS
            newest = x if newest is None else max(newest, x)

    def finals(batches: list[list[Row]]) -> list[Out]:
        both = run_both(p, batches, seed=seed)
        out = [r for rows_ in both.harness.outputs for r in rows_] + both.flush()
        assert both.harness.late == 0 and {r[0] for r in out} <= {"final"}
        return canon(out)

    whole = finals([rows])
    assert len(whole) > 100 and len({(r[2], r[3]) for r in whole}) == len(whole)
    for n in (2, 7, 30, 120):
        assert finals(random_split(rng, rows, n)) == whole, f"{n} batches"


def test_retractions_keep_no_written_row_of_a_window_its_emission_evicts() -> None:
    """Under ``drop`` and ``dlq`` (``retractions`` is refused under ``reopen``) a sliding window is
    written once, final, and evicted by the same emission (``t + 0 < W``): nothing can supersede
    its row, so none is kept (the state's eviction drops partials, never ``written``)."""
    state = SlidingState("p", [Count()], ["n"], 10, SlidingWindows(duration=10, max_events=100), keeps_written=True)
    before = None
    for t in (0, 100, 200):
        state.merge([t], [("a",)], [[1]])
        rows = emit(state, before, t + 1, retention=0, retractions=True).rows
        assert [(r.start, r.end, r.kind) for r in rows] == [(t - 10, t, "final")] and state.written == {}
        before = t + 1
