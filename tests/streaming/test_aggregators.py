"""The window-kind and aggregator interfaces on their own (no Spark): what the engine relies on."""

from __future__ import annotations

from decimal import Decimal

import pytest

from ematix_dagster.errors import AggregationOverflow
from ematix_dagster.streaming.aggregators import (
    Avg, Count, ExactDistinct, First, PartialRowError, Sum,
)
from ematix_dagster.streaming.windows import FixedWindows, WindowBounds, window_starts


@pytest.mark.parametrize("duration, hop", [(100, 40), (100, 100), (10, 3), (7, 7)])
def test_fixed_row_windows_are_the_open_windows_containing_the_row(duration: int, hop: int) -> None:
    kind = FixedWindows(duration, hop)
    for t in range(-2 * duration, 2 * duration):
        everything = [WindowBounds(s, s + duration) for s in window_starts(t, duration, hop)]
        assert kind.row_windows(t, None) == everything
        for closed_before in range(t - duration, t + 2):
            assert kind.row_windows(t, closed_before) == [w for w in everything if w.end > closed_before]


def test_fixed_final_and_eviction_follow_the_exclusive_end() -> None:
    kind = FixedWindows(10, 10)
    w = kind.bounds(20)
    assert w == WindowBounds(20, 30)
    assert not kind.is_final(w, None) and not kind.is_final(w, 29) and kind.is_final(w, 30)
    assert not kind.is_evicted(w, 34, retention=5) and kind.is_evicted(w, 35, retention=5)


@pytest.mark.parametrize("agg, partials", [
    (Count(), [1, None, 3, 2]),
    (Sum(integral=True), [1, -4, None, 9]),
    (Avg(), [(1.0, 1), None, (3.0, 2), (None, 0)]),
    (First(), [(5, "b"), (5, "a"), None, (4, "z")]),
    (ExactDistinct(cap=10), [["a"], ["b", "a"], [], ["c"]]),
])
def test_merge_batch_equals_merging_row_by_row_with_shared_groups(agg, partials) -> None:
    one, other = [None], [None]
    states = [one, other, one, one]  # a group may appear more than once in a batch
    agg.merge_batch(states, 0, partials)
    expected = [None, None]
    for slot, partial in zip([0, 1, 0, 0], partials):
        expected[slot] = agg.merge(expected[slot], partial)
    assert [one[0], other[0]] == expected


def test_merge_batch_names_the_failing_row() -> None:
    states = [[None], [2**63 - 2]]
    with pytest.raises(PartialRowError) as exc:
        Sum(integral=True).merge_batch(states, 0, [1, 5])
    assert exc.value.row == 1 and isinstance(exc.value.error, AggregationOverflow)


@pytest.mark.parametrize("agg, accs, partials, expected", [
    # the C-speed cases: groups new to the window, groups already there
    (Count(), [None, None], [3, 1], [3, 1]),
    (Count(), [2, 7], [3, 1], [5, 8]),
    (Sum(integral=True), [None, None], [Decimal(4), Decimal(-9)], [4, -9]),
    (Sum(integral=True), [1, 2**63 - 5], [Decimal(4), Decimal(4)], [5, 2**63 - 1]),
    (Sum(integral=False), [0.5, 1.0], [0.25, 2.0], [0.75, 3.0]),
    (Sum(integral=False), [Decimal("1.5"), None], [Decimal("0.5"), Decimal("2")], [Decimal("2.0"), Decimal("2")]),
    # the rest row by row: new and old groups mixed, all-NULL partials
    (Count(), [None, 2], [3, None], [3, 2]),
    (Sum(integral=True), [None, 3], [Decimal(1), None], [1, 3]),
    (Avg(), [None, (1.0, 1)], [(2.0, 2), (3.0, 1)], [(2.0, 2), (4.0, 2)]),
    (First(), [(5, "b"), None], [(5, "a"), (4, "z")], [(5, "a"), (4, "z")]),
    (ExactDistinct(cap=10), [{"a"}, None], [["b"], []], [{"a", "b"}, None]),
])
def test_merge_column_folds_each_row_into_its_group(agg, accs, partials, expected) -> None:
    before = list(accs)
    merged = agg.merge_column(accs, partials)
    assert merged == expected and [type(v) for v in merged] == [type(v) for v in expected]
    assert merged == [agg.merge(a, p) for a, p in zip(accs, partials)]
    assert accs == before  # the state's lists are replaced, never changed in place


@pytest.mark.parametrize("accs", [[0, 2**63 - 2], [None, None]])
def test_merge_column_names_the_row_that_overflows(accs) -> None:
    partials = [Decimal(1), Decimal(2**63 + 3 if accs[1] is None else 5)]
    with pytest.raises(PartialRowError) as exc:
        Sum(integral=True).merge_column(accs, partials)
    assert exc.value.row == 1 and isinstance(exc.value.error, AggregationOverflow)


def test_arrow_shapes() -> None:
    assert Avg().partial_names("_p3") == ("_p3", "_p3_n")
    assert Avg().from_arrow([[2.0, None], [1, 0]]) == [(2.0, 1), (None, 0)]
    assert First().partial_names("_p0") == ("_p0",)
    assert First().from_arrow([[{"t": 5, "v": "x"}, None]]) == [(5, "x"), None]
