"""The window-kind and aggregator interfaces on their own (no Spark): what the engine relies on."""

from __future__ import annotations

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


def test_arrow_shapes() -> None:
    assert Avg().partial_names("_p3") == ("_p3", "_p3_n")
    assert Avg().from_arrow([[2.0, None], [1, 0]]) == [(2.0, 1), (None, 0)]
    assert First().partial_names("_p0") == ("_p0",)
    assert First().from_arrow([[{"t": 5, "v": "x"}, None]]) == [(5, "x"), None]
