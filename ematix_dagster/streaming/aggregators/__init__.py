"""Aggregators, one class per aggregation (see ``base.Aggregator`` for the interface).

Spark computes one *partial* per (window, group) and batch on the executors; these classes fold
partials into an accumulator that lives in window state and turn it into the output value.
A new aggregator is one class (``basic`` or its own module), one line in ``AGGREGATORS`` and its
name in the spec's ``spec.window.AGGREGATIONS``, which the spec's validation reads; the class checks
its input column (``input_problem``).

>>> Sum(integral=True).result(Sum(integral=True).merge(3, 4))
7
>>> First().merge((5, "b"), (5, "a"))
(5, 'a')
>>> Count().merge_column([None, 2], [3, 4])  # a fixed window's groups: one column at a time
[3, 6]
>>> states = [[None], [2]]  # sessions and sliding windows: rows may share a group
>>> Count().merge_batch(states, 0, [3, 4])
>>> states
[[3], [6]]
"""

from __future__ import annotations

from typing import Callable, Sequence

from ematix_dagster.spec import Aggregation, Window
from ematix_dagster.streaming.aggregators.aggregator import (
    SCALAR_TYPES,
    Aggregator,
    PartialRowError,
    SparkInput,
    describe_value,
    order_key,
)
from ematix_dagster.streaming.aggregators.basic import Avg, Count, First, Last, Max, Min, Sum
from ematix_dagster.streaming.aggregators.distinct import ApproxDistinct, ExactDistinct
from ematix_dagster.streaming.aggregators.trigger_rows import TRIGGER_ROWS_ALIAS, TriggerRows

#: spec ``agg`` -> (the spec entry, whether a sum is integral, hll_precision) -> its aggregator; the
#: names are the spec's ``spec.window.AGGREGATIONS``, in its order
AGGREGATORS: dict[str, Callable[[Aggregation, bool | None, int], Aggregator]] = {
    "count": lambda a, integral, lg_k: Count(),
    "count_col": lambda a, integral, lg_k: Count(),
    "sum": lambda a, integral, lg_k: Sum(integral),
    "min": lambda a, integral, lg_k: Min(),
    "max": lambda a, integral, lg_k: Max(),
    "avg": lambda a, integral, lg_k: Avg(),
    "first": lambda a, integral, lg_k: First(),
    "last": lambda a, integral, lg_k: Last(),
    "count_distinct": lambda a, integral, lg_k: ApproxDistinct(lg_k) if a.distinct_mode == "approximate"
    else ExactDistinct(a.max_distinct_values_per_group or 0),
}


def make_aggregator(agg: Aggregation, integral: bool | None, hll_precision: int) -> Aggregator:
    """The aggregator for one spec entry; ``integral`` tells sum which arithmetic to use.

    ``integral=None`` (not known without Spark's column types) is for vetting stored state and for
    the fingerprint: such a sum accepts integer, float and decimal accumulators.
    """
    return AGGREGATORS[agg.agg](agg, integral, hll_precision)


def window_aggregators(window: Window, integral: Sequence[bool | None]) -> list[Aggregator]:
    """What a window's state holds per group: one aggregator per aggregation (``integral[i]``: as
    :func:`make_aggregator`), then the emit trigger's hidden row count where it needs one."""
    aggs = [make_aggregator(a, integral[i], window.hll_precision) for i, a in enumerate(window.aggregations)]
    return aggs + [TriggerRows()] if window.emit_trigger.counts_rows else aggs


def window_aliases(window: Window) -> list[str]:
    """The names of :func:`window_aggregators`' accumulators, for messages."""
    aliases = [a.as_ for a in window.aggregations]
    return aliases + [TRIGGER_ROWS_ALIAS] if window.emit_trigger.counts_rows else aliases


__all__ = [
    "AGGREGATORS", "Aggregator", "Count", "Sum", "Min", "Max", "Avg", "First", "Last", "ApproxDistinct",
    "ExactDistinct", "PartialRowError", "SparkInput", "TriggerRows", "make_aggregator", "window_aggregators",
    "window_aliases", "order_key", "describe_value",
    "SCALAR_TYPES",
]
