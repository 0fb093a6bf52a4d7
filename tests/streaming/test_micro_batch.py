"""Fast unit tests of the pure driver logic in ``ematix_dagster/streaming`` (no Spark here).

Every expected value is computed independently in the test (by hand or with plain Python), never by
calling the code under test a second time.
"""

from __future__ import annotations

import doctest
import importlib
import itertools
import math
import pkgutil
import random
from typing import Any

import pytest
from datasketches import hll_sketch

import ematix_dagster.spec
import ematix_dagster.streaming
from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.spec import Aggregation, Window
from ematix_dagster.streaming.aggregators import (
    ApproxDistinct, Avg, Count, ExactDistinct, First, Last, Max, Min, Sum, make_aggregator,
)
from ematix_dagster.streaming.aggregators.base import PartialRowError
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats
from ematix_dagster.streaming.watermark import Watermarks
from ematix_dagster.streaming.emission import emit
from ematix_dagster.streaming.state.fixed import FixedState
from ematix_dagster.streaming.state.order import sorted_keys
from ematix_dagster.streaming.windows import FixedWindows, format_us, format_window, window_starts

NAN = float("nan")
MS = 1_000  # µs per ms


# ---------------------------------------------------------------------------------------------
# helpers (independent of the code under test)
# ---------------------------------------------------------------------------------------------

def same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN and floats compare with a tiny tolerance."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def spark_key(v: Any) -> tuple:
    """Spark's order of non-null values: NaN is larger than every other float (incl. +inf)."""
    if isinstance(v, float) and v != v:
        return (1, 0)
    return (0, v)


def brute_starts(t: int, duration: int, hop: int, lo: int = -2000, hi: int = 2000) -> list[int]:
    """Every multiple of hop in [lo*hop, hi*hop] whose window [s, s+D) contains t, by exhaustion."""
    return [s for s in range(lo * hop, hi * hop + 1, hop) if s <= t < s + duration]


def direct(agg: str, rows: list[tuple[int, Any]]) -> Any:
    """The answer over all rows at once, Spark semantics, written out by hand."""
    vals = [v for _, v in rows if v is not None]
    if agg == "count":
        return len(rows)
    if agg == "count_col":
        return len(vals)
    if agg == "count_distinct":
        return len(set(vals))
    if not vals:
        return None
    if agg == "sum":
        return sum(vals)
    if agg == "avg":
        return sum(vals) / len(vals)
    nans = [v for v in vals if isinstance(v, float) and v != v]
    real = [v for v in vals if not (isinstance(v, float) and v != v)]
    if agg == "max":
        return NAN if nans else max(real)
    if agg == "min":
        return min(real) if real else NAN
    timed = [(t, v) for t, v in rows if v is not None]
    if agg == "first":
        t0 = min(t for t, _ in timed)
        cands = [v for t, v in timed if t == t0]
        real = [v for v in cands if not (isinstance(v, float) and v != v)]
        return min(real) if real else NAN
    if agg == "last":
        t1 = max(t for t, _ in timed)
        cands = [v for t, v in timed if t == t1]
        if any(isinstance(v, float) and v != v for v in cands):
            return NAN
        return max(cands)
    raise AssertionError(agg)


def spark_partial(agg: str, rows: list[tuple[int, Any]]) -> Any:
    """What the executors hand the driver for one chunk of rows (one (window, group), one batch)."""
    vals = [v for _, v in rows if v is not None]
    if agg == "count":
        return len(rows)
    if agg == "count_col":
        return len(vals)
    if agg == "count_distinct":
        return sorted(set(vals), key=spark_key)  # collect_set: a list
    if agg == "avg":
        return (sum(vals) if vals else None, len(vals))  # sum(col), count(col)
    if not vals:
        return None
    if agg == "sum":
        return sum(vals)
    if agg == "min":
        return min(vals, key=spark_key)
    if agg == "max":
        return max(vals, key=spark_key)
    timed = [(t, v) for t, v in rows if v is not None]
    if agg == "first":
        return min(timed, key=lambda p: (p[0], spark_key(p[1])))
    if agg == "last":
        return max(timed, key=lambda p: (p[0], spark_key(p[1])))
    raise AssertionError(agg)


def random_split(rng: random.Random, items: list, max_parts: int = 6) -> list[list]:
    """Split into 1..max_parts non-empty chunks at random cut points."""
    n = len(items)
    k = rng.randint(1, min(max_parts, n))
    cuts = sorted(rng.sample(range(1, n), k - 1))
    bounds = [0, *cuts, n]
    return [items[a:b] for a, b in zip(bounds, bounds[1:])]


def fold_random_tree(rng: random.Random, agg_obj: Any, partials: list) -> Any:
    """Merge partials pairwise in a random tree and random argument order."""
    pool = list(partials)
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        a, b = pool[i], pool[j]
        merged = agg_obj.merge(a, b) if rng.random() < 0.5 else agg_obj.merge(b, a)
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [merged]
    return pool[0]


# ---------------------------------------------------------------------------------------------
# windows
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
# aggregators
# ---------------------------------------------------------------------------------------------

def _float_rows(rng: random.Random, n: int) -> list[tuple[int, Any]]:
    """Event times with many ties; values are small multiples of 0.5 (exact sums), NaN, inf, None."""
    pool = [NAN, None, None, float("inf"), float("-inf"), -0.5, 0.0, 1.5, 2.0, 3.5, 7.0, 7.0]
    rows = []
    for _ in range(n):
        v = rng.choice(pool) if rng.random() < 0.5 else rng.randint(-20, 20) / 2
        rows.append((rng.randint(0, 8), v))
    return rows


def _finite_rows(rng: random.Random, n: int) -> list[tuple[int, Any]]:
    return [(rng.randint(0, 8), None if rng.random() < 0.2 else rng.randint(-40, 40) / 2) for _ in range(n)]


def _int_rows(rng: random.Random, n: int) -> list[tuple[int, Any]]:
    return [(rng.randint(0, 8), None if rng.random() < 0.2 else rng.randint(-10**12, 10**12)) for _ in range(n)]


def _str_rows(rng: random.Random, n: int) -> list[tuple[int, Any]]:
    return [(rng.randint(0, 8), None if rng.random() < 0.2 else rng.choice(["", "a", "b", "bb", "c", "é"]))
            for _ in range(n)]


AGG_CASES = [
    ("count", lambda: Count(), _float_rows),
    ("count_col", lambda: Count(), _float_rows),
    ("sum", lambda: Sum(integral=True), _int_rows),
    ("sum", lambda: Sum(integral=False), _finite_rows),
    ("sum", lambda: Sum(integral=False), _float_rows),  # NaN / inf propagate
    ("avg", lambda: Avg(), _finite_rows),
    ("min", lambda: Min(), _float_rows),
    ("max", lambda: Max(), _float_rows),
    ("min", lambda: Min(), _str_rows),
    ("max", lambda: Max(), _str_rows),
    ("first", lambda: First(), _float_rows),
    ("last", lambda: Last(), _float_rows),
    ("first", lambda: First(), _str_rows),
    ("last", lambda: Last(), _str_rows),
    ("count_distinct", lambda: ExactDistinct(cap=1_000), _str_rows),
    ("count_distinct", lambda: ExactDistinct(cap=1_000), _int_rows),
]


@pytest.mark.parametrize("agg, factory, gen", AGG_CASES,
                         ids=[f"{c[0]}-{c[2].__name__.strip('_')}-{i}" for i, c in enumerate(AGG_CASES)])
def test_merge_over_random_splits_matches_direct(agg: str, factory, gen) -> None:
    for seed in range(60):
        rng = random.Random(seed)
        rows = gen(rng, rng.randint(1, 25))
        expected = direct(agg, rows)
        agg_obj = factory()
        partials = [spark_partial(agg, chunk) for chunk in random_split(rng, rows)]
        # sequential fold in a shuffled order (commutativity), with NULL partials sprinkled in
        order = partials + [None] * rng.randint(0, 2)
        rng.shuffle(order)
        acc = None
        for p in order:
            acc = agg_obj.merge(acc, p)
        got = agg_obj.result(acc)
        assert same(got, expected), (seed, rows, got, expected)
        # random merge tree (associativity)
        tree = fold_random_tree(rng, agg_obj, partials)
        assert same(agg_obj.result(tree), expected), (seed, rows)


def test_nan_is_the_largest_float() -> None:
    assert math.isnan(Max().merge(float("inf"), NAN))
    assert math.isnan(Max().merge(NAN, float("inf")))
    assert Min().merge(NAN, float("inf")) == float("inf")
    assert Min().merge(float("-inf"), NAN) == float("-inf")
    assert math.isnan(Min().merge(NAN, None))
    assert math.isnan(Min().result(Min().merge(None, NAN)))


def test_first_last_tie_break_by_value() -> None:
    assert First().merge((5, "b"), (5, "a")) == (5, "a")
    assert First().merge((5, "a"), (5, "b")) == (5, "a")
    assert First().merge((4, "z"), (5, "a")) == (4, "z")
    assert Last().merge((5, "a"), (5, "b")) == (5, "b")
    assert Last().merge((5, "b"), (5, "a")) == (5, "b")
    assert Last().merge((6, "a"), (5, "z")) == (6, "a")
    # NaN is the largest value: first avoids it on a tie, last takes it
    assert First().result(First().merge((5, NAN), (5, 1.0))) == 1.0
    assert First().result(First().merge((5, 1.0), (5, NAN))) == 1.0
    assert math.isnan(Last().result(Last().merge((5, 1.0), (5, NAN))))
    assert math.isnan(Last().result(Last().merge((5, NAN), (5, float("inf")))))
    # every batch split of the same rows gives the same answer
    rows = [(7, 3.0), (7, -1.0), (7, 2.0), (9, 4.0), (9, 8.0), (3, 5.0), (3, 0.5)]
    for perm in itertools.permutations(rows):
        acc_f = acc_l = None
        for r in perm:
            acc_f, acc_l = First().merge(acc_f, r), Last().merge(acc_l, r)
        assert First().result(acc_f) == 0.5
        assert Last().result(acc_l) == 8.0


def test_null_partials_are_skipped() -> None:
    assert Count().result(Count().merge(None, None)) == 0
    assert Count().merge(3, None) == 3
    for agg in (Sum(True), Sum(False), Min(), Max(), Avg(), First(), Last(), ApproxDistinct(12), ExactDistinct(5)):
        assert agg.merge(None, None) is None, agg
    assert Sum(True).merge(5, None) == 5
    assert Sum(True).result(None) is None  # sum over only NULLs is NULL
    assert Min().merge(2, None) == 2 and Max().merge(None, 2) == 2
    assert Avg().merge((3.0, 2), None) == (3.0, 2)
    assert Avg().merge((3.0, 2), (None, 0)) == (3.0, 2)  # a chunk of only NULLs
    assert Avg().result(Avg().merge(None, (None, 0))) is None
    assert First().merge((1, "x"), None) == (1, "x") and Last().merge(None, (1, "x")) == (1, "x")
    assert ExactDistinct(5).merge({"a"}, None) == {"a"}
    assert ExactDistinct(5).merge({"a"}, []) == {"a"}
    assert ExactDistinct(5).result(None) == 0 and ApproxDistinct(12).result(None) == 0


def test_integer_sum_overflow_raises() -> None:
    big = 2**63 - 1
    assert Sum(True).merge(big - 1, 1) == big  # exactly BIGINT max is fine
    assert Sum(True).merge(-(2**63) + 1, -1) == -(2**63)
    with pytest.raises(AggregationOverflow):
        Sum(True).merge(big, 1)
    with pytest.raises(AggregationOverflow):
        Sum(True).merge(-(2**63), -1)
    with pytest.raises(AggregationOverflow):
        Sum(True).merge(None, 2**63)
    # floats do not overflow into an error
    assert Sum(False).merge(1e308, 1e308) == float("inf")


def test_exact_distinct_cap() -> None:
    agg = ExactDistinct(cap=3)
    acc = agg.merge(None, ["a", "b"])
    acc = agg.merge(acc, ["b", "c"])  # exactly the cap
    assert agg.result(acc) == 3
    assert agg.result(agg.merge(acc, ["a", "c"])) == 3  # repeats add nothing
    with pytest.raises(StateCapExceeded, match="max_distinct_values_per_group=3"):
        agg.merge(acc, ["d"])


def _sketch(values: range, lg_k: int = 14) -> bytes:
    s = hll_sketch(lg_k)
    for i in values:
        s.update(f"user-{i}")
    return s.serialize_compact()


def test_approx_distinct_union_within_two_percent() -> None:
    truth = 10_000
    parts = [range(0, 4_000), range(3_000, 7_000), range(6_000, truth), range(0, truth, 7), range(9_990, truth)]
    assert len(set().union(*parts)) == truth  # overlapping partials covering exactly 10,000 values
    sketches = [_sketch(r) for r in parts]
    agg = ApproxDistinct(14)
    results = set()
    for perm in itertools.permutations(sketches):
        acc = None
        for sk in perm:
            acc = agg.merge(acc, sk)
        assert isinstance(acc, bytes)
        results.add(agg.result(acc))
    assert len(results) == 1  # order never changes the answer
    (estimate,) = results
    assert abs(estimate - truth) <= 0.02 * truth, estimate
    # associativity: a tree of unions gives the same answer
    rng = random.Random(3)
    assert agg.result(fold_random_tree(rng, agg, sketches)) == estimate
    # a single partial is kept as is; small exact-ish counts
    single = _sketch(range(10))
    assert agg.merge(None, single) == single
    assert agg.result(agg.merge(single, _sketch(range(5, 15)))) == 15


def test_approx_distinct_columns_match_one_group_at_a_time() -> None:
    """The column-wise merge and results (one union reused, new groups' bytes kept) give what the
    one-group merge gives; a stored sketch that does not load is named as corrupt, by row."""
    agg = ApproxDistinct(14)
    held = [_sketch(range(i, i + 5)) for i in range(0, 300, 3)] + [None, _sketch(range(4))]
    partials = [_sketch(range(i + 2, i + 9)) for i in range(0, 300, 3)] + [_sketch(range(3)), None]
    merged = agg.merge_column(held, partials)
    assert merged == [agg.merge(a, p) for a, p in zip(held, partials)]
    assert agg.merge_column([None] * len(partials), partials) == [agg.merge(None, p) for p in partials]
    assert agg.result_column(merged) == [agg.result(a) for a in merged]
    assert agg.result_column(merged)[:2] == [9, 9] and agg.result_column([None]) == [0]
    corrupt = bytes([2, 1, 7, 14]) + b"\xff" * 4  # the preamble the restore's scan lets through
    with pytest.raises(PartialRowError) as failed:
        agg.merge_column([held[0], corrupt], partials[:2])
    assert failed.value.row == 1 and isinstance(failed.value.error, CorruptState)
    assert "stored HLL sketch is corrupt: 8 bytes (02010" in str(failed.value.error)
    with pytest.raises(CorruptState, match="stored HLL sketch is corrupt"):
        agg.result_column([held[0], corrupt])


def test_make_aggregator() -> None:
    assert isinstance(make_aggregator(Aggregation("count", "n"), False, 14), Count)
    s = make_aggregator(Aggregation("sum", "s", "v"), True, 14)
    assert isinstance(s, Sum) and s.integral
    assert not make_aggregator(Aggregation("sum", "s", "v"), False, 14).integral
    a = make_aggregator(Aggregation("count_distinct", "d", "v"), False, 11)
    assert isinstance(a, ApproxDistinct) and a.lg_k == 11
    e = make_aggregator(Aggregation("count_distinct", "d", "v", mode="exact", max_distinct_values_per_group=9), False, 14)
    assert isinstance(e, ExactDistinct) and e.cap == 9
    for name, cls in (("count_col", Count), ("min", Min), ("max", Max), ("avg", Avg), ("first", First), ("last", Last)):
        assert isinstance(make_aggregator(Aggregation(name, "x", "v"), False, 14), cls)


# ---------------------------------------------------------------------------------------------
# watermarks
# ---------------------------------------------------------------------------------------------

def test_watermark_monotone_and_min_over_sources() -> None:
    wm = Watermarks(lateness=10, idleness=1_000, sources=("a", "b"))
    wm.start_run(batch_time=0)
    wm.observe("a", rows=2, max_event_ts=100, batch_time=0)
    wm.observe("b", rows=1, max_event_ts=70, batch_time=0)
    assert wm.advance(batch_time=0) == 60  # min(100, 70) - 10
    assert wm.source_watermarks() == {"a": 90, "b": 60}
    wm.observe("a", rows=1, max_event_ts=50, batch_time=5)  # older rows never lower a source
    wm.observe("b", rows=1, max_event_ts=40, batch_time=5)
    assert wm.advance(batch_time=5) == 60
    assert wm.source_watermarks() == {"a": 90, "b": 60}
    wm.observe("b", rows=1, max_event_ts=300, batch_time=10)
    assert wm.advance(batch_time=10) == 90  # now "a" is the slowest
    # W never goes back, even when the slowest active source changes
    wm2 = Watermarks(lateness=0, idleness=100, sources=("a", "b"))
    wm2.start_run(0)
    wm2.observe("a", 1, 500, 0)
    wm2.observe("b", 1, 400, 0)
    assert wm2.advance(0) == 400
    wm2.observe("b", 1, 600, 150)  # "a" idle at 150 -> W = 600
    assert wm2.advance(150) == 600
    wm2.observe("a", 1, 510, 160)  # "a" back, at 510 < 600: W stays
    assert wm2.advance(160) == 600


def test_idle_exclusion_by_batch_time() -> None:
    wm = Watermarks(lateness=0, idleness=100, sources=("a", "b"))
    wm.start_run(batch_time=1_000)
    wm.observe("a", 1, 500, 1_000)
    wm.observe("b", 1, 200, 1_000)
    assert wm.advance(1_000) == 200
    wm.observe("a", 1, 800, 1_100)
    wm.observe("b", 0, None, 1_100)
    assert not wm.is_idle("b", 1_100)  # exactly idleness since last arrival: not yet idle
    assert wm.advance(1_100) == 200
    wm.observe("a", 1, 900, 1_101)
    assert wm.is_idle("b", 1_101) and not wm.is_idle("a", 1_101)
    assert wm.advance(1_101) == 900  # b excluded
    wm.observe("b", 3, 250, 1_200)   # b is back (behind): W does not go back
    assert not wm.is_idle("b", 1_200)
    assert wm.advance(1_200) == 900
    assert wm.source_watermarks() == {"a": 900, "b": 250}


def test_never_seen_source_holds_w_until_idle() -> None:
    wm = Watermarks(lateness=5, idleness=100, sources=("a", "b"))
    wm.start_run(batch_time=50)  # first batch of the run: every source counts as just arrived
    wm.observe("a", 4, 1_000, 50)
    wm.observe("b", 0, None, 50)
    assert wm.advance(50) is None
    wm.observe("a", 1, 1_100, 150)
    assert wm.advance(150) is None     # 150 - 50 = 100: b not idle yet
    wm.observe("a", 1, 1_200, 151)
    assert wm.advance(151) == 1_195    # b idle now; a's watermark alone
    assert wm.source_watermarks() == {"a": 1_195, "b": None}


def test_all_sources_idle_w_stays() -> None:
    wm = Watermarks(lateness=0, idleness=10, sources=("a", "b"))
    wm.start_run(0)
    wm.observe("a", 1, 100, 0)
    wm.observe("b", 1, 80, 0)
    assert wm.advance(0) == 80
    assert wm.advance(11) == 80  # both idle: stays
    assert wm.is_idle("a", 11) and wm.is_idle("b", 11)
    assert wm.advance(10_000) == 80
    # nothing ever seen and everything idle: still no watermark
    wm2 = Watermarks(lateness=0, idleness=10, sources=("a",))
    wm2.start_run(0)
    assert wm2.advance(100) is None


def test_restart_resets_last_arrival() -> None:
    wm = Watermarks(lateness=0, idleness=10, sources=("a", "b"))
    wm.start_run(0)
    wm.observe("a", 1, 100, 0)
    wm.observe("b", 1, 50, 0)
    assert wm.advance(0) == 50
    wm.observe("a", 1, 200, 100)
    assert wm.advance(100) == 200  # b idle
    wm.start_run(1_000)           # restart: b counts as just arrived again
    wm.observe("a", 1, 300, 1_000)
    assert not wm.is_idle("b", 1_000)
    assert wm.advance(1_000) == 200  # b (wm 50) holds W; W never goes back


def test_processing_time_mode() -> None:
    wm = Watermarks(lateness=7, idleness=10, sources=("a",), processing_time=True)
    wm.start_run(100)
    wm.observe("a", 1, 10**9, 100)  # event times do not matter
    assert wm.advance(100) == 93
    assert wm.advance(500) == 493
    assert wm.advance(400) == 493  # monotone even if a batch time went back
    wm.raise_to(1_000)
    assert wm.global_wm == 1_000
    wm.raise_to(10)
    assert wm.global_wm == 1_000


# ---------------------------------------------------------------------------------------------
# window state + engine, batch by batch
# ---------------------------------------------------------------------------------------------

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


def test_fixed_state_direct_emit_and_retention() -> None:
    st = FixedState(pipeline="p", kind=FixedWindows(10, 10), aggregators=[Count()], aliases=["n"],
                    max_groups_per_window=5)
    st.merge([0, 0, 10, 0], [("a",), (None,), ("a",), ("a",)], [[1, 2, 3, 4]])
    assert st.touched == {0: {("a",), (None,)}, 10: {("a",)}}
    out = emit(st, before=None, watermark=9, retention=0).rows
    assert out == [] and st.open_windows(9) == 2
    out = emit(st, before=9, watermark=10, retention=3).rows
    # NULL group keys are a group of their own and sort first
    assert [(r.start, r.end, r.key, r.values, r.kind) for r in out] == [
        (0, 10, (None,), (2,), "final"), (0, 10, ("a",), (5,), "final")]
    assert st.open_windows(10) == 1 and set(st.windows) == {0, 10}
    assert emit(st, before=10, watermark=12, retention=3).rows == []  # emitted once only; 10 + 3 > 12
    assert set(st.windows) == {0, 10}
    # a retained window touched again makes corrections for the touched groups only
    st.merge([0], [("a",)], [[1]])
    out = emit(st, before=12, watermark=12, retention=3).rows
    assert [(r.start, r.key, r.values, r.kind) for r in out] == [(0, ("a",), (6,), "correction")]
    assert emit(st, before=12, watermark=13, retention=3).rows == []  # 10 + 3 <= 13: evicted
    assert set(st.windows) == {10} and st.open_windows(13) == 1
    assert st.flush_watermark == 20 and st.group_count == 1


@pytest.mark.parametrize("keys", [
    [(3,), (1,), (2,)],
    [(3,), (None,), (1,)],
    [(1.5,), (float("nan"),), (-2.0,), (None,)],
    [("b", 2), ("a", float("nan")), ("a", 1.0), ("a", None)],
])
def test_emitted_keys_sort_as_spark_orders_them(keys) -> None:
    # Spark: NULLs first, NaN above every other float
    def spark_order(key):
        return tuple((v is not None, (1, 0.0) if isinstance(v, float) and math.isnan(v) else (0, v) if v is not None else 0)
                     for v in key)
    assert [repr(k) for k in sorted_keys(keys)] == [repr(k) for k in sorted(keys, key=spark_order)]


def test_fixed_state_merges_a_run_column_by_column_and_a_repeated_group_row_by_row() -> None:
    st = FixedState(pipeline="p", kind=FixedWindows(10, 10), aggregators=[Count(), Sum(integral=True)],
                    aliases=["n", "s"], max_groups_per_window=3)
    st.merge([0, 0], [("a",), ("b",)], [[1, 2], [10, 20]])
    # old and new groups in one run, then one group twice in a run (not from Spark, still exact)
    st.merge([0, 0, 0, 0], [("c",), ("a",), ("a",), ("b",)], [[5, 1, 2, 3], [50, 1, None, 2]])
    assert st.windows == {0: {("a",): [4, 11], ("b",): [5, 22], ("c",): [5, 50]}}
    with pytest.raises(StateCapExceeded, match="max_groups_per_window=3"):
        st.merge([0, 0], [("a",), ("d",)], [[1, 1], [1, 1]])


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


# ---------------------------------------------------------------------------------------------
# doctests
# ---------------------------------------------------------------------------------------------

def _doctest_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(ematix_dagster.streaming.__path__, "ematix_dagster.streaming.")]
    return ["ematix_dagster.streaming", *sorted(names), "ematix_dagster.spec.window"]


@pytest.mark.parametrize("module", _doctest_modules())
def test_doctests(module: str) -> None:
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{module}: {result.failed} doctest failure(s)"


def test_doctests_exist() -> None:
    total = sum(doctest.testmod(importlib.import_module(m)).attempted for m in _doctest_modules())
    assert total >= 10
