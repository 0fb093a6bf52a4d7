"""Sliding windows' values derived from a key's retained partials, for a whole batch of windows at once.

A window ``[t - D, t]`` ends at a retained partial (its row in the state's columns, sorted by key
id and event time), so its last partial is that row and its first is one search away
(:func:`~ematix_dagster.streaming.kinds.state_columns.search_pairs`). When every aggregator subtracts
(counts, sums, averages: ``Aggregator.additive_parts``) a window is a difference of prefix sums
over the batch's columns of parts, one ``cumsum`` per part; else a
:class:`~ematix_dagster.streaming.two_stacks.TwoStacks` is slid over each key's partials.

Prefix sums run over the object columns (Python's own addition, in event-time order), so integer
sums stay exact and BIGINT checks (``from_parts``) see the true total.

>>> from ematix_dagster.streaming.aggregators import Count
>>> parts = [np.array([1, 2, 3], dtype=object)]
>>> by_prefix_sums([Count()], np.array([0, 0, 0]), parts, np.array([0, 0, 1]), np.array([2, 3, 3]))
[[3, 6, 5]]
"""

from __future__ import annotations

from typing import Any, Sequence, cast

import numpy as np

from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.streaming.aggregators import Aggregator
from ematix_dagster.streaming.kinds.kind_state import Accumulators
from ematix_dagster.streaming.kinds.state_columns import I64, accumulator_rows, objects, run_count, run_rows, run_starts
from ematix_dagster.streaming.two_stacks import TwoStacks

#: the largest int a float64 holds exactly, with every int below it
_EXACT_FLOAT_INT = 2**53

#: what a merge or a window's total may raise (a cap, an overflow, a corrupt accumulator)
FAILURES = (StateCapExceeded, AggregationOverflow, CorruptState)


class WindowFailed(Exception):
    """Deriving window ``window`` (its position among the windows asked for) failed with ``error``."""

    def __init__(self, window: int, error: StateCapExceeded | AggregationOverflow | CorruptState) -> None:
        super().__init__(str(error))
        self.window, self.error = window, error


def additive(aggregators: Sequence[Aggregator]) -> bool:
    """Every aggregator subtracts (counts, sums, averages): windows are differences of prefix sums."""
    return all(agg.additive_parts for agg in aggregators)


def parts_of(aggregators: Sequence[Aggregator], accs: Sequence[np.ndarray], rows: np.ndarray) -> list[np.ndarray]:
    """The additive parts of the accumulators at ``rows``, one column per part (kept beside the
    accumulators, so a batch sums columns instead of calling ``to_parts`` per partial), typed
    where :func:`numbers` may."""
    return [numbers(part) for agg, column in zip(aggregators, accs) for part in agg.to_parts_column(column[rows].tolist())]


def numbers(values: list[Any]) -> np.ndarray:
    """``values`` as int64 (ints in range) or float64 (floats, and ints a float holds exactly) when
    that changes none of them, else as objects (decimals, bigger ints): then a batch's prefix sums
    and its parts' updates run in C, and exactness never depends on it.

    >>> [numbers(v).dtype.name for v in ([1, 2], [0, 1.5], [2**63], [True])]
    ['int64', 'float64', 'object', 'object']
    """
    types = set(map(type, values))
    if types <= {int}:
        try:
            return np.array(values, dtype=I64).reshape(len(values))
        except OverflowError:  # an int beyond 64 bits
            pass
    elif types == {float} or (types == {int, float} and all(-_EXACT_FLOAT_INT <= v <= _EXACT_FLOAT_INT
                                                            for v in values if type(v) is int)):
        return np.array(values, dtype=np.float64).reshape(len(values))
    return objects(values, len(values))


def put(column: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``column`` with ``values`` at ``rows``: in place when their types agree, else the whole
    column typed anew (:func:`numbers`), so a value never takes a type that changes it."""
    if column.dtype == values.dtype:
        column[rows] = values
        return column
    whole = column.tolist()
    for row, value in zip(rows.tolist(), values.tolist()):
        whole[row] = value
    return numbers(whole)


def by_prefix_sums(aggregators: Sequence[Aggregator], kids: np.ndarray, parts: Sequence[np.ndarray],
                   lo: np.ndarray, hi: np.ndarray) -> list[list[Any]]:
    """The accumulators of the windows over partials ``[lo, hi)`` of the columns ``parts`` (rows of
    key ids ``kids``, sorted; a window's partials are one key's), one column per aggregator: what
    an emission finishes them from.

    The sums run over the whole runs of the windows' keys only: a batch emits a few keys' windows
    while every key's partials are retained, and a run summed alone sums as it does among all.
    """
    rows, lo, hi = _runs_of(kids, lo, hi)
    if rows is not None:
        kids, parts = kids[rows], [column[rows] for column in parts]
    diffs = []
    for column in parts:
        if column.dtype == I64 and (column == 1).all():  # one per partial (a count of one row each, a sum's
            diffs.append((hi - lo).tolist())             # non-NULL partials): the window's partials
            continue
        through, before = _prefix_sums(column, kids)
        diffs.append((through[hi - 1] - before[lo]).tolist())
    windows, at = [], 0
    for agg in aggregators:
        width = agg.additive_parts
        try:
            windows.append(agg.from_parts_column(diffs[at:at + width]))
        except FAILURES:
            for w, parts in enumerate(zip(*diffs[at:at + width])):  # which window: only after a failure
                try:
                    agg.from_parts(parts)
                except FAILURES as exc:
                    raise WindowFailed(w, exc) from None
            raise
        at += width
    return windows


def _runs_of(kids: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """The rows of the key runs that the windows ``[lo, hi)`` lie in (None: every row, nothing
    to take), and the windows' bounds within those rows."""
    if not len(hi):
        return None, lo, hi
    wanted = np.unique(kids[hi - 1])  # ids may be keys' own integers: no array indexed by id
    if len(wanted) == run_count(kids):  # every key emits (each batch closes windows of every key): all rows
        return None, lo, hi
    rows, offset, _ = run_rows(kids, wanted)
    shift = offset[np.searchsorted(wanted, kids[hi - 1])]
    return rows, lo - shift, hi - shift


def _prefix_sums(column: np.ndarray, kids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's running sum of its key's values through it and before it.

    Integers (counts, BIGINT sums) run over every key at once: exact, in int64 when no running
    sum can leave it, else as Python ints. Other values (floats, decimals) restart at each key,
    so a window's rounding is that of its own key's magnitudes, not of every key sorted before
    it: the keys' runs are laid out as the rows of a grid (padded at their ends) and summed along
    them in one call, or one by one when a few long runs would make the grid mostly padding.
    Floats are summed as float64: the same additions, in C. ``column`` is as typed as
    :func:`numbers` makes it (:func:`parts_of`, :func:`put`): an object column holds ints past
    int64, decimals, or a mix.
    """
    integral = column.dtype == I64 or (column.dtype == object and set(map(type, column.tolist())) <= {int})
    if integral:
        if column.dtype == I64 and len(column) * max(-int(column.min(initial=0)), int(column.max(initial=0))) >= 2**63:
            column = column.astype(object)  # a running sum could leave int64
        through = np.cumsum(column)
        return through, through - column
    n = len(column)
    starts = run_starts(kids)
    lengths = np.diff(np.append(starts, n))
    if len(starts) * int(lengths.max()) <= 4 * n + 1024:
        row, at = np.repeat(np.arange(len(starts)), lengths), np.arange(n) - np.repeat(starts, lengths)
        grid = np.zeros((len(starts), int(lengths.max()) + 1), dtype=column.dtype)
        grid[row, at + 1] = column
        sums = np.cumsum(grid, axis=1)
        return sums[row, at + 1], sums[row, at]
    through, before = np.empty(n, dtype=column.dtype), np.empty(n, dtype=column.dtype)
    for start, end in zip(starts.tolist(), np.append(starts[1:], n).tolist()):
        sums = np.cumsum(column[start:end])
        through[start:end] = sums
        before[start] = 0
        before[start + 1:end] = sums[:-1]
    return through, before


def by_two_stacks(aggregators: Sequence[Aggregator], kids: np.ndarray, accs: Sequence[np.ndarray],
                  lo: np.ndarray, hi: np.ndarray) -> list[Accumulators]:
    """The accumulators of the windows over partials ``[lo, hi)``, each key's windows from one
    two-stack queue slid over its partials (for aggregators that cannot subtract: min, max,
    distinct sets, sketches, first, last). ``hi`` must ascend within each key."""

    def merge(a: Accumulators | None, b: Accumulators | None) -> Accumulators | None:
        if a is None:
            return b
        if b is None:
            return a
        return [agg.merge(x, y) for agg, x, y in zip(aggregators, a, b)]

    found: list[Accumulators] = [[]] * len(hi)
    order = np.argsort(hi, kind="stable")
    groups = np.split(order, run_starts(kids[hi[order] - 1])[1:]) if len(hi) else []
    for at in groups:
        first, last = int(lo[at].min()), int(hi[at].max())
        rows = accumulator_rows(accs, slice(first, last))
        queue: TwoStacks[Accumulators] = TwoStacks(merge)
        held_lo = held_hi = 0  # the queue holds rows[held_lo:held_hi] (offsets from ``first``)
        for w, start, end in zip(at.tolist(), (lo[at] - first).tolist(), (hi[at] - first).tolist()):
            try:
                if held_hi <= start:  # nothing held is in this window: start afresh
                    queue, held_lo, held_hi = TwoStacks(merge), start, start
                while held_hi < end:
                    queue.push(rows[held_hi])
                    held_hi += 1
                while held_lo < start:
                    queue.pop()
                    held_lo += 1
                found[w] = cast(Accumulators, queue.total())  # a window holds its own partial
            except FAILURES as exc:
                raise WindowFailed(w, exc) from None
    return found
