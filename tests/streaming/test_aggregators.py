"""The aggregators (``ematix_dagster/streaming/aggregators``; no Spark): merges, Spark's orders, caps, sketches.

Every expected value is computed independently in the test (by hand or with plain Python), never by
calling the code under test a second time.
"""

from __future__ import annotations

import itertools
import math
import random
from decimal import Decimal
from typing import Any

import pytest
from datasketches import hll_sketch

from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.spec import Aggregation
from ematix_dagster.streaming.aggregators import (
    ApproxDistinct,
    Avg,
    Count,
    ExactDistinct,
    First,
    Last,
    Max,
    Min,
    PartialRowError,
    Sum,
    make_aggregator,
)
from tests.streaming.reference import NAN, direct, fold_random_tree, random_split, same, spark_partial

# ---------------------------------------------------------------------------------------------
# merging partials
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
# the batch and column merges the engine relies on
# ---------------------------------------------------------------------------------------------


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
    # new and old groups mixed in one window: added as object arrays (a new group's -0.0 kept)
    (Count(), [None, 2, None], [3, 4, 1], [3, 6, 1]),
    (Sum(integral=True), [None, 2**63 - 5, 7], [Decimal(4), Decimal(4), Decimal(-9)], [4, 2**63 - 1, -2]),
    (Sum(integral=False), [None, 1.0, None], [-0.0, 2.0, 0.5], [-0.0, 3.0, 0.5]),
    (Sum(integral=False), [Decimal("1.5"), None], [Decimal("0.25"), Decimal("2.50")], [Decimal("1.75"), Decimal("2.50")]),
    # the rest row by row: all-NULL partials, other aggregators
    (Count(), [None, 2], [3, None], [3, 2]),
    (Sum(integral=True), [None, 3], [Decimal(1), None], [1, 3]),
    (Avg(), [None, (1.0, 1)], [(2.0, 2), (3.0, 1)], [(2.0, 2), (4.0, 2)]),
    (First(), [(5, "b"), None], [(5, "a"), (4, "z")], [(5, "a"), (4, "z")]),
    (ExactDistinct(cap=10), [{"a"}, None], [["b"], []], [{"a", "b"}, None]),
])
def test_merge_column_folds_each_row_into_its_group(agg, accs, partials, expected) -> None:
    before = list(accs)
    merged = agg.merge_column(accs, partials)
    assert merged == expected and list(map(repr, merged)) == list(map(repr, expected))  # types, -0.0, decimal places
    assert merged == [agg.merge(a, p) for a, p in zip(accs, partials)]
    assert accs == before  # the state's lists are replaced, never changed in place


@pytest.mark.parametrize("accs", [[0, 2**63 - 2], [None, None], [None, 2**63 - 2]])
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
