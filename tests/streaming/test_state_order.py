"""Group key order (``ematix_dagster/streaming/state/order.py``): emitted keys sort as Spark orders them."""

from __future__ import annotations

import math

import pytest

from ematix_dagster.streaming.state.order import sorted_keys


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
