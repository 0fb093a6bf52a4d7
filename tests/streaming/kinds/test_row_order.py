"""Group key order (``ematix_dagster/streaming/kinds/row_order.py``): emitted keys sort as Spark orders them."""

from __future__ import annotations

import math
import random

import pytest

from ematix_dagster.streaming.kinds.row_order import key_order, row_order, sorted_keys


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


@pytest.mark.parametrize("keys", [
    [(3,), (-1,), (2,), (3,), (0,)],  # ints: one NumPy sort
    [(3, 1), (3, 0), (-2, 5), (3, 1), (0, 0)],
    [(3,), (True,), (2**70,), (3,), (0,)],  # a bool, an int past int64: compared in Python
    [("b",), (None,), ("a",), ("b",), ("a",)],
])
def test_rows_sort_by_start_then_key(keys) -> None:
    starts = [10, 0, 10, 0, 10]
    assert row_order(starts, keys) == sorted(range(len(keys)), key=lambda i: (starts[i], key_order(keys[i])))


@pytest.mark.parametrize("seed", range(5))
def test_rows_already_by_start_with_a_few_ties_sort_the_ties_by_key(seed) -> None:
    # a sliding window's rows come by end: only rows sharing a start are sorted, NULLs first
    rng = random.Random(seed)
    starts = sorted(rng.sample(range(1000), 60) + rng.sample(range(1000), 4))  # 4 starts twice at most
    keys = [(rng.choice([None, "a", "b", "c"]), rng.randint(0, 3)) for _ in starts]
    got = [(starts[i], keys[i]) for i in row_order(starts, keys)]
    assert got == sorted(zip(starts, keys), key=lambda row: (row[0], [(v is not None, v or 0) for v in row[1]]))


def test_rows_in_order_already_come_back_as_a_range() -> None:
    # the emission then reorders nothing
    assert row_order([1, 2, 3, 5], [(9,), (1,), (3,), (0,)]) == range(4)
    assert row_order([], []) == range(0)
    assert row_order([1, 2, 2], [(9,), (3,), (1,)]) == [0, 2, 1]
