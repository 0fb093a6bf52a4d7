"""Group key order (``ematix_dagster/streaming/state/order.py``): emitted keys sort as Spark orders them."""

from __future__ import annotations

import math

import pytest

from ematix_dagster.streaming.state.order import key_order, row_order, sorted_keys


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
