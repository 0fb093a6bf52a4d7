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
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from operator import itemgetter
from typing import Any, Callable

from datasketches import hll_sketch, hll_union

from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.spec import Aggregation

BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1


#: Types of a single column value in stored state (state_store.codec's value types, no containers).
SCALAR_TYPES = frozenset({bool, int, float, str, bytes, Decimal, datetime, date, time, timedelta})
_NONE = type(None)
_PAIR_TYPES = frozenset({_NONE, tuple})
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def describe_value(value: Any) -> str:
    """A short, safe description of a stored value for messages (type and the start of its repr)."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def order_key(value: Any) -> Any:
    """Sort key that matches Spark's ordering of non-null values (NaN is the largest float)."""
    if isinstance(value, float):
        return (1, 0.0) if math.isnan(value) else (0, value)
    return value


class Aggregator:
    """Base class: fold partials (``merge``), finish (``result``), vet restored state.

    Restored state decodes to plain values; whether they are this aggregator's accumulators is
    checked in two ways. ``scan_states`` looks at one aggregation's accumulators of every group at
    once with C-level scans (``map`` and ``set``: types, tuple lengths, sketch headers), cheap
    enough for a restore of a million groups. ``check_state`` looks at one accumulator as closely
    as it can and says what is wrong; it names the group a scan rejected, and ``ematix-dagster
    check`` runs it on every accumulator. Every accumulator may be ``None`` (nothing merged yet).
    """

    #: the accumulator types allowed; for most aggregators the type decides alone, the others
    #: (``looks_inside``) check the contents of accumulators of these types in ``scan_contents``
    state_types: frozenset[type] = frozenset({_NONE})
    looks_inside = False
    expected = "an accumulator"

    def merge(self, acc: Any, partial: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc

    def check_state(self, acc: Any) -> str | None:
        """None when ``acc`` is a valid accumulator of this aggregator, else what is wrong with it."""
        if type(acc) in self.state_types:
            return None
        return f"expected {self.expected}, got {describe_value(acc)}"

    def scan_states(self, states: list[Any]) -> bool:
        """True when every accumulator in ``states`` passes the cheap checks (a restore's bulk check)."""
        types = set(map(type, states))
        return types <= self.state_types and (not self.looks_inside or self.scan_contents(states, types))

    def scan_contents(self, states: list[Any], types: set[type]) -> bool:
        """The cheap look inside accumulators whose types (``types``) are all in ``state_types``."""
        return True


class Count(Aggregator):
    """count(*) and count(col): the partial is already a count."""

    state_types = frozenset({_NONE, int})
    expected = "a count (an integer)"

    def merge(self, acc: Any, partial: Any) -> Any:
        return (acc or 0) + (partial or 0)

    def result(self, acc: Any) -> Any:
        return acc or 0


class Sum(Aggregator):
    """Integer sums are exact Python ints checked against BIGINT; float/decimal sums add up."""

    def __init__(self, integral: bool | None) -> None:
        # None: not known (``ematix-dagster check`` vets state without asking Spark for column types)
        self.integral = integral
        if integral is None:
            self.state_types = frozenset({_NONE, int, float, Decimal})
            self.expected = "a sum (an integer, float or decimal)"
        elif integral:
            self.state_types = frozenset({_NONE, int})
            self.expected = "an integer sum"
        else:
            self.state_types = frozenset({_NONE, float, Decimal})
            self.expected = "a float or decimal sum"

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
    state_types = SCALAR_TYPES | {_NONE}
    expected = "a single value"

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

    state_types = _PAIR_TYPES
    looks_inside = True

    def key(self, value: Any) -> Any:
        return (value[0], order_key(value[1]))

    def result(self, acc: Any) -> Any:
        return None if acc is None else acc[1]

    def check_state(self, acc: Any) -> str | None:
        if acc is None or (type(acc) is tuple and len(acc) == 2 and type(acc[0]) is int
                           and type(acc[1]) in SCALAR_TYPES):
            return None
        return f"expected an (event time µs, value) pair, got {describe_value(acc)}"

    def scan_contents(self, states: list[Any], types: set[type]) -> bool:
        pairs = _not_none(states, types)
        return (set(map(len, pairs)) <= {2} and set(map(type, map(_FIRST, pairs))) <= {int}
                and set(map(type, map(_SECOND, pairs))) <= SCALAR_TYPES)


class Last(First):
    """(event_ts, value) with the largest event time; ties take the largest value."""

    largest = True


class Avg(Aggregator):
    """State is (sum, count) so that merging partials stays exact in count."""

    state_types = _PAIR_TYPES
    looks_inside = True

    def merge(self, acc: Any, partial: Any) -> Any:
        if partial is None or not partial[1]:
            return acc
        if acc is None or not acc[1]:  # an empty (NULL, 0) pair is the empty accumulator too
            return (float(partial[0]), int(partial[1]))
        return (acc[0] + float(partial[0]), acc[1] + int(partial[1]))

    def result(self, acc: Any) -> Any:
        return None if acc is None or not acc[1] else acc[0] / acc[1]

    def check_state(self, acc: Any) -> str | None:
        if acc is None or (type(acc) is tuple and len(acc) == 2 and type(acc[0]) is float and type(acc[1]) is int):
            return None
        return f"expected a (float sum, count) pair, got {describe_value(acc)}"

    def scan_contents(self, states: list[Any], types: set[type]) -> bool:
        pairs = _not_none(states, types)
        return (set(map(len, pairs)) <= {2} and set(map(type, map(_FIRST, pairs))) <= {float}
                and set(map(type, map(_SECOND, pairs))) <= {int})


class ApproxDistinct(Aggregator):
    """HLL sketches as compact bytes; unions happen only when a group gets a second partial.

    Keeping bytes (not sketch objects) makes the common case, a group seen once per window,
    free of deserialisation, and the state is already in its persisted form.
    """

    state_types = frozenset({_NONE, bytes})
    looks_inside = True

    def __init__(self, lg_k: int) -> None:
        self.lg_k = lg_k
        # A DataSketches HLL image starts with: preamble ints (2 list, 3 set, 10 HLL mode), serial
        # version 1, family 7 (HLL), lg_k; every image has at least 8 bytes.
        self._headers = frozenset(bytes([pre, 1, 7, lg_k]) for pre in (2, 3, 10))

    def merge(self, acc: Any, partial: Any) -> Any:
        if partial is None:
            return acc
        if acc is None:
            return bytes(partial)
        union = hll_union(self.lg_k)
        union.update(self._sketch(acc))
        union.update(hll_sketch.deserialize(bytes(partial)))
        return union.get_result().serialize_compact()

    def result(self, acc: Any) -> Any:
        if acc is None:
            return 0
        return int(round(self._sketch(acc).get_estimate()))

    def _sketch(self, acc: bytes) -> Any:
        """The stored sketch; one that the restore's header scan let through but does not load is corrupt."""
        try:
            return hll_sketch.deserialize(acc)
        except Exception as exc:  # noqa: BLE001 - DataSketches raises ValueError/IndexError/RuntimeError
            raise CorruptState(f"stored HLL sketch is corrupt: {_describe_sketch(acc)} does not load ({exc}); "
                               "restore the state store from a backup, or start over with "
                               "`ematix-dagster reset PIPELINE.toml --yes`") from None

    def check_state(self, acc: Any) -> str | None:
        if acc is None:
            return None
        if type(acc) is not bytes:
            return f"expected an HLL sketch (bytes), got {describe_value(acc)}"
        try:
            lg_k = hll_sketch.deserialize(acc).lg_config_k
        except Exception as exc:  # noqa: BLE001 - DataSketches raises ValueError/IndexError/RuntimeError
            return f"{_describe_sketch(acc)} are not a DataSketches HLL sketch image ({exc})"
        if lg_k != self.lg_k:
            return f"the HLL sketch has lg_k {lg_k}, but the pipeline's hll_precision is {self.lg_k}"
        if not self.scan_states([acc]):
            return f"{_describe_sketch(acc)} do not start with a DataSketches HLL preamble"
        return None

    def scan_contents(self, states: list[Any], types: set[type]) -> bool:
        """Preamble headers only: opening every sketch would cost more than decoding the whole state."""
        sketches = _not_none(states, types)
        return set(map(_HEADER, sketches)) <= self._headers and min(map(len, sketches), default=8) >= 8


class ExactDistinct(Aggregator):
    """A set of canonical values, capped by ``max_distinct_values_per_group``."""

    # The cap is not checked here: caps may be lowered between runs (the next merge enforces it).
    state_types = frozenset({_NONE, set, frozenset})
    expected = "a set of distinct values"

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


_HEADER = itemgetter(slice(0, 4))


def _describe_sketch(acc: bytes) -> str:
    return f"{len(acc)} bytes ({acc[:8].hex()}{'...' if len(acc) > 8 else ''})"


def _not_none(states: list[Any], types: set[type]) -> list[Any]:
    """``states`` without its None entries (``types``: the types present in ``states``)."""
    return states if _NONE not in types else [s for s in states if s is not None]


def make_aggregator(agg: Aggregation, integral: bool | None, hll_precision: int) -> Aggregator:
    """The aggregator for one spec entry; ``integral`` tells sum which arithmetic to use.

    ``integral=None`` (not known without Spark's column types) is only for vetting stored state:
    such a sum accepts integer, float and decimal accumulators.
    """
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
    "ExactDistinct", "make_aggregator", "order_key", "describe_value", "SCALAR_TYPES",
]
