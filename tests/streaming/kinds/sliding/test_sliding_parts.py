"""Sliding windows' additive parts (``streaming/kinds/sliding/sliding_windows.py``) held as int64 or float64
columns where that changes no value: a window's value must be the exact sum of its partials
whatever the column's type, against a sum written out here per window (floats: a window is a
difference of running sums, so within a relative 1e-12 of the direct sum)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from ematix_dagster.errors import AggregationOverflow
from ematix_dagster.streaming.aggregators import Count
from ematix_dagster.streaming.aggregators.basic import Sum
from ematix_dagster.streaming.emission import emit
from ematix_dagster.streaming.kinds import SlidingWindows
from ematix_dagster.streaming.kinds.sliding.sliding_state import SlidingState

D = 10


def windows(batches: list[list[tuple[str, int, Any]]], integral: bool) -> dict[tuple[str, int], tuple[Any, Any]]:
    """(key, t) -> (count, sum) of every window the engine emits, every batch flushed at once."""
    state = SlidingState("p", [Count(), Sum(integral)], ["n", "s"], 10**6, SlidingWindows(duration=D, max_events=10**6))
    out, before = {}, None
    for rows in batches:
        state.merge([t for _, t, _ in rows], [(k,) for k, _, _ in rows], [[1] * len(rows), [v for _, _, v in rows]])
        watermark = max(t for _, t, _ in rows) + 1
        for row in emit(state, before, watermark, retention=10**6).rows:
            out[(row.key[0], row.end)] = row.values
        before = watermark
    return out


def expected(batches: list[list[tuple[str, int, Any]]]) -> dict[tuple[str, int], tuple[Any, Any]]:
    rows = [row for batch in batches for row in batch]
    out = {}
    for key, t, _ in rows:
        inside = [v for k, u, v in rows if k == key and t - D <= u <= t]
        values = [v for v in inside if v is not None]
        total = None
        for v in values:
            total = v if total is None else total + v
        out[(key, t)] = (len(inside), total)
    return out


BIG = 2**62
CASES = {
    # each window's sum fits BIGINT, a running sum over every partial does not: exact only as Python ints
    "bigint": ([[("a", 0, BIG), ("a", 5, BIG - 1), ("b", 3, BIG)], [("a", 20, BIG), ("b", 30, -BIG), ("b", 31, BIG)],
                [("c", 40, 7)]], True),
    # a float sum whose partial is NULL (an all-NULL group) beside floats
    "float with a null": ([[("a", 0, 0.1), ("a", 2, None), ("a", 4, 0.2)], [("a", 6, None), ("b", 7, 1e300), ("a", 13, 0.3)],
                           [("a", 30, None), ("b", 9, None)]], False),
    # decimals never become floats
    "decimal": ([[("a", 0, Decimal("0.1")), ("a", 3, Decimal("0.2"))], [("a", 8, None), ("a", 12, Decimal("1E+30"))]],
                False),
}


@pytest.mark.parametrize("case", CASES)
def test_a_window_is_the_exact_sum_of_its_partials(case: str) -> None:
    batches, integral = CASES[case]
    got = windows(batches, integral)
    want = expected(batches)
    assert got.keys() == want.keys()
    for window, (count, total) in want.items():
        assert got[window][0] == count
        same = got[window][1] == (pytest.approx(total, rel=1e-12) if type(total) is float else total)
        assert same and type(got[window][1]) is type(total), (window, got[window], total)


def test_a_window_whose_sum_leaves_bigint_is_refused_though_each_partial_fits() -> None:
    # as int64 the two partials' running sum would wrap to -2**63 and look in range
    with pytest.raises(AggregationOverflow, match=r"left the BIGINT range: on window .* group \('a',\)"):
        windows([[("b", 0, 1), ("a", 0, BIG), ("a", 5, BIG)]], True)
