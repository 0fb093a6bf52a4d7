"""Spark's order of group keys, and of emitted rows by (window, key).

Every window kind emits its rows in one order, so the same input writes the same files whatever
the kind's state looks like inside: by window start, then by group key as Spark orders it (NULLs
first, NaN the largest float). A sliding window's start is its end less a fixed duration, so its
rows come by end as well.

>>> sorted_keys([("b",), (None,), ("a",)])
[(None,), ('a',), ('b',)]
>>> row_order([10, 0, 0], [("a",), ("b",), ("a",)])
[2, 1, 0]
"""

from __future__ import annotations

from itertools import chain, groupby
from typing import Any, Iterable, Sequence

import numpy as np

from ematix_dagster.streaming.aggregators import order_key
from ematix_dagster.streaming.emitted import GroupKey
from state_store.int_key_column import IntKeyColumn


def key_order(key: GroupKey) -> tuple[Any, ...]:
    """Sort key for group keys as Spark orders them, NULLs first (keys may mix None and values)."""
    return tuple((v is not None, order_key(v) if v is not None else 0) for v in key)


def _plain(keys: Sequence[GroupKey]) -> bool:
    """Whether ``keys`` hold no NaN: without one (and without None) tuples compare in Spark's order.

    NaN, the only value unequal to itself, is a float: keys without floats skip the look for it.
    """
    return float not in set(map(type, chain.from_iterable(keys))) or not any(v != v for key in keys for v in key)


def sorted_keys(keys: Iterable[GroupKey]) -> list[GroupKey]:
    """``keys`` in Spark's order (:func:`key_order`).

    Keys without None or NaN compare as tuples in that order already, which sorts several times
    faster than building a :func:`key_order` per key (a batch sorts every key of each window it
    emits); a None makes the comparison fail, a NaN makes it wrong, and both take the slow path.
    """
    keys = list(keys)
    if _plain(keys):
        try:
            return sorted(keys)
        except TypeError:  # None beside values
            pass
    return sorted(keys, key=key_order)


def row_order(starts: Sequence[int] | np.ndarray, keys: Sequence[GroupKey]) -> Sequence[int]:
    """The positions of rows ``(starts[i], keys[i])`` sorted by window start, then key (no two rows
    share both: a kind emits one row per window and group).

    By start first (a stable sort of ints, nearly free when a fixed window's rows come in runs of
    one start), then each run of one start by key: comparing keys alone costs a third of comparing
    (start, key) pairs, and a window emits tens of thousands of groups at once. Int keys (the
    common session or sliding key, a window's rows mostly of distinct starts) take one NumPy sort.
    Rows in order already come back as a ``range``, so a caller can skip reordering them.
    """
    if not len(starts):
        return range(0)
    first = np.asarray(starts, dtype=np.int64)  # window starts are µs: always in int64
    steps = np.diff(first)
    if (steps >= 0).all() and np.count_nonzero(steps == 0) * 8 < len(starts):
        return _ties_by_key(steps, keys)
    ints = _by_ints(first, keys)
    if ints is not None:
        return ints
    starts = first.tolist()
    distinct = len(set(starts))
    plain = _plain(keys)
    if distinct <= 1:  # one window's rows (a fixed window closing)
        return _by_key(list(range(len(keys))), keys, plain)
    by_start = sorted(range(len(starts)), key=starts.__getitem__)
    if distinct == len(starts):  # no two rows share a start (sessions, sliding windows: mostly)
        return by_start
    out: list[int] = []
    for _, run in groupby(by_start, key=starts.__getitem__):
        rows = list(run)
        if len(rows) > 1:
            rows = _by_key(rows, keys, plain)
        out += rows
    return out


def _by_ints(first: np.ndarray, keys: Sequence[GroupKey]) -> list[int] | None:
    """:func:`row_order` (``first``: the starts as int64) in one NumPy sort when every key is a
    tuple of one width of ints within int64 (a session's or a sliding window's user id): no
    Python comparison per row. None otherwise."""
    if isinstance(keys, IntKeyColumn):
        return np.lexsort([keys.ids, first]).tolist()
    if not keys or len(set(map(len, keys))) != 1:
        return None
    flat = list(chain.from_iterable(keys))  # one list of every key's values: no column per width
    if set(map(type, flat)) != {int}:
        return None
    try:
        columns = np.array(flat, dtype=np.int64).reshape(len(keys), -1).T
    except OverflowError:
        return None
    return np.lexsort([*columns[::-1], first]).tolist()  # the last column given sorts first


def _ties_by_key(steps: np.ndarray, keys: Sequence[GroupKey]) -> Sequence[int]:
    """:func:`row_order` of rows already by start (``steps``: from each start to the next, none
    negative) where few share one (a sliding window's rows come by end): only those are sorted."""
    ends = np.flatnonzero(np.diff(np.concatenate(([False], steps == 0, [False])).astype(np.int8)))
    if not len(ends):
        return range(len(keys))
    out = list(range(len(keys)))
    for first, last in zip(ends[::2].tolist(), ends[1::2].tolist()):  # a run of one start: rows first..last
        out[first:last + 1] = _by_key(out[first:last + 1], keys, _plain(keys[first:last + 1]))
    return out


def _by_key(rows: list[int], keys: Sequence[GroupKey], plain: bool) -> list[int]:
    if plain:
        try:
            return sorted(rows, key=keys.__getitem__)
        except TypeError:  # None beside values
            pass
    return sorted(rows, key=lambda i: key_order(keys[i]))
