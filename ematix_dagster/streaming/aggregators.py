"""Driver-side aggregators: merge Spark's per-batch partials into window state and finish them.

Spark computes one *partial* per (window, group) and batch on the executors (see
``ematix_dagster.spark.partials``); these classes fold partials into an accumulator that lives in
window state and turn it into the output value. One small class per aggregator, each with
``merge(acc, partial)`` and ``result(acc)``; ``None`` is the empty accumulator.

Ordering follows Spark's, so the driver and the executors agree: NULLs are skipped and NaN sorts
above every other float. first/last break event-time ties by value (SPEC.md §4), which makes the
answer independent of how rows fall into micro-batches.

>>> Sum(integral=True).result(Sum(integral=True).merge(3, 4))
7
>>> First().merge((5, "b"), (5, "a"))
(5, 'a')
"""

from __future__ import annotations

import math
from typing import Any, Callable

from datasketches import hll_sketch, hll_union

from ematix_dagster.errors import AggregationOverflow, StateCapExceeded
from ematix_dagster.spec import Aggregation

BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1


def order_key(value: Any) -> Any:
    """Sort key that matches Spark's ordering of non-null values (NaN is the largest float)."""
    if isinstance(value, float):
        return (1, 0.0) if math.isnan(value) else (0, value)
    return value


class Aggregator:
    """Base class: fold partials (``merge``) and finish (``result``)."""

    def merge(self, acc: Any, partial: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc


class Count(Aggregator):
    """count(*) and count(col): the partial is already a count."""

    def merge(self, acc: Any, partial: Any) -> Any:
        return (acc or 0) + (partial or 0)

    def result(self, acc: Any) -> Any:
        return acc or 0


class Sum(Aggregator):
    """Integer sums are exact Python ints checked against BIGINT; float/decimal sums add up."""

    def __init__(self, integral: bool) -> None:
        self.integral = integral

    def merge(self, acc: Any, partial: Any) -> Any:
        if partial is None:
            return acc
        if self.integral:
            partial = int(partial)
        total = partial if acc is None else acc + partial
        if self.integral and not BIGINT_MIN <= total <= BIGINT_MAX:
            raise AggregationOverflow("integer sum left the BIGINT range")
        return total


class Min(Aggregator):
    """The smallest non-null value; subclasses change the ordering or the direction."""

    largest = False

    def key(self, value: Any) -> Any:
        return order_key(value)

    def merge(self, acc: Any, partial: Any) -> Any:
        if partial is None:
            return acc
        if acc is None:
            return partial
        new, old = self.key(partial), self.key(acc)
        return partial if (new > old if self.largest else new < old) else acc


class Max(Min):
    largest = True


class First(Min):
    """(event_ts, value) with the smallest event time; ties take the smallest value."""

    def key(self, value: Any) -> Any:
        return (value[0], order_key(value[1]))

    def result(self, acc: Any) -> Any:
        return None if acc is None else acc[1]


class Last(First):
    """(event_ts, value) with the largest event time; ties take the largest value."""

    largest = True


class Avg(Aggregator):
    """State is (sum, count) so that merging partials stays exact in count."""

    def merge(self, acc: Any, partial: Any) -> Any:
        if partial is None or not partial[1]:
            return acc
        if acc is None or not acc[1]:  # an empty (NULL, 0) pair is the empty accumulator too
            return (float(partial[0]), int(partial[1]))
        return (acc[0] + float(partial[0]), acc[1] + int(partial[1]))

    def result(self, acc: Any) -> Any:
        return None if acc is None or not acc[1] else acc[0] / acc[1]


class ApproxDistinct(Aggregator):
    """HLL sketches as compact bytes; unions happen only when a group gets a second partial.

    Keeping bytes (not sketch objects) makes the common case, a group seen once per window,
    free of deserialisation, and the state is already in its persisted form.
    """

    def __init__(self, lg_k: int) -> None:
        self.lg_k = lg_k

    def merge(self, acc: Any, partial: Any) -> Any:
        if partial is None:
            return acc
        if acc is None:
            return bytes(partial)
        union = hll_union(self.lg_k)
        union.update(hll_sketch.deserialize(acc))
        union.update(hll_sketch.deserialize(bytes(partial)))
        return union.get_result().serialize_compact()

    def result(self, acc: Any) -> Any:
        if acc is None:
            return 0
        return int(round(hll_sketch.deserialize(acc).get_estimate()))


class ExactDistinct(Aggregator):
    """A set of canonical values, capped by ``max_distinct_values_per_group``."""

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def merge(self, acc: Any, partial: Any) -> Any:
        if not partial:
            return acc
        merged = set(acc or ()) | set(partial)
        if len(merged) > self.cap:
            raise StateCapExceeded(f"max_distinct_values_per_group={self.cap} reached")
        return merged

    def result(self, acc: Any) -> Any:
        return len(acc) if acc else 0


def make_aggregator(agg: Aggregation, integral: bool, hll_precision: int) -> Aggregator:
    """The aggregator for one spec entry; ``integral`` tells sum which arithmetic to use."""
    factories: dict[str, Callable[[], Aggregator]] = {
        "count": Count,
        "count_col": Count,
        "sum": lambda: Sum(integral),
        "min": Min,
        "max": Max,
        "avg": Avg,
        "first": First,
        "last": Last,
        "count_distinct": lambda: ApproxDistinct(hll_precision)
        if agg.distinct_mode == "approximate"
        else ExactDistinct(agg.max_distinct_values_per_group or 0),
    }
    return factories[agg.agg]()


__all__ = [
    "Aggregator", "Count", "Sum", "Min", "Max", "Avg", "First", "Last", "ApproxDistinct",
    "ExactDistinct", "make_aggregator", "order_key",
]
