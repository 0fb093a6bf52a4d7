"""Which windows a time falls in, their bounds and how they print (``ematix_dagster/streaming/kinds``; no Spark).

Every expected value is computed independently in the test (by hand or with plain Python), never by
calling the code under test a second time.
"""

from __future__ import annotations

import random
from typing import Callable

import numpy as np
import pytest

from ematix_dagster.streaming.kinds import (
    FixedWindows,
    SessionWindows,
    SlidingWindows,
    WindowBounds,
    WindowKind,
    format_us,
    format_window,
    window_starts,
)
from tests.streaming.reference import MS, brute_starts

# ---------------------------------------------------------------------------------------------
# tumbling and hopping starts, bounds, formatting
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t, expected", [
    (0, [0]), (1, [0]), (59, [0]), (60, [60]), (61, [60]), (119, [60]), (120, [120]),
    (-1, [-60]), (-60, [-60]), (-61, [-120]), (-59, [-60]),
])
def test_tumbling_starts_by_hand(t: int, expected: list[int]) -> None:
    assert list(window_starts(t, duration=60, hop=60)) == expected


def test_tumbling_matches_exhaustive_search_incl_negative() -> None:
    rng = random.Random(1)
    for t in [*range(-250, 250), *(rng.randint(-10**5, 10**5) for _ in range(100))]:
        assert list(window_starts(t, duration=100, hop=100)) == brute_starts(t, 100, 100, lo=t // 100 - 3, hi=t // 100 + 3), t


@pytest.mark.parametrize("duration, hop", [(100, 40), (100, 30), (100, 100), (100, 50), (10, 3), (7, 7), (100, 1)])
def test_hopping_matches_exhaustive_search(duration: int, hop: int) -> None:
    for t in range(-3 * duration, 3 * duration + 1):
        got = list(window_starts(t, duration=duration, hop=hop))
        assert got == brute_starts(t, duration, hop, lo=-5 * duration, hi=5 * duration), (t, duration, hop)


def test_hopping_not_a_multiple_by_hand() -> None:
    # D = 100, hop = 40: windows [40,140), [80,180), [120,220) contain 125; [0,100) does not.
    assert list(window_starts(125, duration=100, hop=40)) == [40, 80, 120]
    # t = 100: [0,100) ends exactly at 100 (end exclusive) so it is excluded; [40,140) and [80,180).
    assert list(window_starts(100, duration=100, hop=40)) == [40, 80]
    # t = 99: [0,100) contains 99 (last µs); [40,140) and [80,180) too.
    assert list(window_starts(99, duration=100, hop=40)) == [0, 40, 80]
    # negative: t = -1 -> multiples of 40 in (-101, -1]: -80, -40
    assert list(window_starts(-1, duration=100, hop=40)) == [-80, -40]
    # number of windows alternates between floor(D/hop) and ceil(D/hop)
    counts = {len(window_starts(t, 100, 40)) for t in range(0, 400)}
    assert counts == {2, 3}


def test_exact_bounds_start_inclusive_end_exclusive() -> None:
    d, hop = 60_000 * MS, 15_000 * MS
    for s in (0, 15_000 * MS, -45_000 * MS, 1_700_000_010_000_000):  # all multiples of the hop
        assert s in window_starts(s, d, hop)                 # start inclusive
        assert s in window_starts(s + d - 1, d, hop)         # last µs inside
        assert s not in window_starts(s + d, d, hop)         # end exclusive
        assert s not in window_starts(s - 1, d, hop)         # before start


def test_format_us_iso_z() -> None:
    assert format_us(0) == "1970-01-01T00:00:00Z"
    assert format_us(-1) == "1969-12-31T23:59:59.999999Z"
    # 1_700_000_000 s = 2023-11-14 22:13:20 UTC
    assert format_us(1_700_000_000_123_000) == "2023-11-14T22:13:20.123Z"
    assert format_us(1_700_000_000_999_999) == "2023-11-14T22:13:20.999999Z"
    assert format_us(None) == "-inf"
    assert format_window(0, 60_000_000) == "[1970-01-01T00:00:00Z, 1970-01-01T00:01:00Z)"


# ---------------------------------------------------------------------------------------------
# the fixed window kind as the engine uses it
# ---------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("kind, rule", [
    (FixedWindows(10, 10), lambda end, w, r: end + r <= w),  # the end is exclusive
    (SessionWindows(gap=10, cap=100), lambda end, w, r: end + r < w),
    (SlidingWindows(duration=10, max_events=100), lambda end, w, r: end + r < w),  # the end is inclusive
], ids=["fixed", "session", "sliding"])
def test_each_kind_evicts_a_column_of_windows_as_it_evicts_each_one(
        kind: WindowKind, rule: Callable[[int, int, int], bool]) -> None:
    """The emission judges a batch's written rows as one column (``evicted``) and a state may judge
    its windows one by one (``is_evicted``): both give the kind's documented rule
    (docs/contract/windows.md), to the microsecond around ``W - retention``."""
    rng = random.Random(3)
    for _ in range(300):
        w, r = rng.randint(-10**15, 10**15), rng.choice([0, 1, rng.randint(0, 10**10)])
        ends = [w - r - 1, w - r, w - r + 1, *(rng.randint(w - r - 50, w - r + 50) for _ in range(20))]
        expected = [rule(end, w, r) for end in ends]
        assert [kind.is_evicted(WindowBounds(end - 10, end), w, r) for end in ends] == expected, (w, r)
        assert kind.evicted(np.array(ends, dtype=np.int64), w, r).tolist() == expected, (w, r)
        assert expected[:3] in ([True, True, False], [True, False, False])  # the boundary was crossed
    assert not kind.is_evicted(WindowBounds(0, 10), None, 0)
    assert kind.evicted(np.array([-10**15, 0], dtype=np.int64), None, 0).tolist() == [False, False]


def test_each_kind_says_its_windows_in_words() -> None:
    from ematix_dagster.spec import Aggregation, Window

    def shape(kind: str, **keys: int) -> str:
        return Window(kind=kind, max_groups_per_window=1, group_by=("k",), aggregations=(Aggregation("count", "n"),),
                      **keys).shape

    assert shape("tumbling", duration_ms=60_000) == "tumbling windows of 60 s"
    assert shape("hopping", duration_ms=60_000, hop_ms=1_500) == "hopping windows of 60 s every 1500 ms"
    assert shape("session", gap_ms=30_000, max_session_duration_ms=3_600_000) == \
        "session windows (gap 30 s, cut every 3600 s)"
    assert shape("sliding", duration_ms=10_000, max_events_per_group=5) == "sliding windows of 10 s (one per event time)"
