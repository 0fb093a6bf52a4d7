"""Window state held as columns: group keys as ints (``streaming.kinds.state_keys``), per-row fields as NumPy arrays.

A kind that holds hundreds of thousands of small windows (a session per key) spent most of its
driver time on one Python object per window: created, indexed, walked by every report, eviction
and commit. Held as columns, a batch's merge, report, eviction and commit are a few whole-array
operations, and Python runs over what the batch brings or emits rather than over every held row.

Times, flags and key ids are NumPy arrays. Accumulators stay Python values (BIGINT checks,
decimals, sets and sketches are the aggregators' own) in NumPy *object* arrays, one per
aggregator, so a permutation or a selection moves them all at C speed; a fixed window's counts
and float sums are typed arrays while their partials arrive as one (``state.fixed.HeldWindow``)
(docs/decisions.md, "Columnar driver state").

>>> objects([(1, 2), None], 2)[0]
(1, 2)
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence, cast

import numpy as np

from ematix_dagster.streaming.aggregators import Aggregator, PartialRowError

I64 = np.int64
#: a stored start of a row no commit has written yet
NOT_STORED = np.iinfo(np.int64).min


def objects(values: Iterable[Any], n: int) -> np.ndarray:
    """``values`` as a NumPy object array of length ``n``, each value one element (a tuple or a
    list stays one accumulator; ``np.array`` would spread it over a second dimension)."""
    return np.fromiter(values, dtype=object, count=n)


def ints(values: Iterable[int], n: int) -> np.ndarray:
    return np.fromiter(values, dtype=I64, count=n)


def accumulator_rows(accs: Sequence[np.ndarray], at: Any = slice(None)) -> list[list[Any]]:
    """The accumulator lists of the rows ``at`` (an index array or a slice), one list per row as
    the emission and the commit take them, from the per-aggregator columns."""
    return [list(row) for row in zip(*[column[at].tolist() for column in accs])]


def fold_partials(aggregators: Sequence[Aggregator], accs: Sequence[np.ndarray], targets: np.ndarray,
                  partials: Sequence[Sequence[Any]], failed: Callable[[PartialRowError, int], Any],
                  shared: Optional[bool] = None) -> np.ndarray:
    """Each aggregator folds its column of a batch's partials into the rows ``targets`` of its
    accumulator column; returns the rows changed. Partials of distinct rows merge as one column
    (``merge_column``); several partials of one row (``shared``, found out when not given) fold
    in batch order, and only those: a batch where a few rows take several partials folds the
    others as one column still (a fold row by row costs several times more). ``failed(error,
    aggregator index)`` is told of a partial no accumulator takes, the first in batch order. A
    typed column (fixed windows, ``HeldWindow.align``) folds its array of partials in one call."""
    rows = targets
    if shared is None or shared:
        rows, inverse, counts = np.unique(targets, return_inverse=True, return_counts=True)
        shared = len(rows) < len(targets)
        several = counts[inverse.reshape(-1)] > 1
        alone, together = np.flatnonzero(~several), np.flatnonzero(several)
        folded, into = np.unique(targets[together], return_inverse=True)
        into_list, alone_list, together_list = into.reshape(-1).tolist(), alone.tolist(), together.tolist()
    for i, agg in enumerate(aggregators):
        column = accs[i]
        if column.dtype != object:  # a typed column: its partials are an array of its type
            agg.fold_array(column, targets, cast(np.ndarray, partials[i]))
            continue
        try:
            if not shared:
                column[targets] = objects(agg.merge_column(column[targets].tolist(), partials[i]), len(targets))
                continue
            part = partials[i]
            try:
                lone = agg.merge_column(column[targets[alone]].tolist(), list(map(part.__getitem__, alone_list)))
                slots = [[acc] for acc in column[folded].tolist()]
                agg.merge_batch([slots[j] for j in into_list], 0, list(map(part.__getitem__, together_list)))
            except PartialRowError:  # named by its row in the whole batch, the first in batch order
                slots = [[acc] for acc in column[rows].tolist()]
                agg.merge_batch([slots[j] for j in inverse.reshape(-1).tolist()], 0, part)
                raise
            column[targets[alone]] = objects(lone, len(alone))
            column[folded] = objects((slot[0] for slot in slots), len(folded))
        except PartialRowError as error:
            failed(error, i)
    return rows


def run_count(kids: np.ndarray) -> int:
    """How many runs of one key id a column sorted by key id holds (the keys holding rows)."""
    return int(np.count_nonzero(kids[1:] != kids[:-1])) + 1 if len(kids) else 0


def run_starts(kids: np.ndarray) -> np.ndarray:
    """Where each run of one key id begins in a column sorted by key id."""
    if not len(kids):
        return np.zeros(0, dtype=I64)
    return np.flatnonzero(np.concatenate(([True], kids[1:] != kids[:-1])))


def run_rows(kids: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of the runs of key ids ``wanted`` (distinct, sorted) in ``kids`` (sorted), run after
    run, found by a search rather than a pass over every row; and per run, its first row less
    where it begins among those rows (row ``r`` of the run is at ``r - offset``) and its length
    (0: the key holds none).

    >>> rows, offset, lengths = run_rows(np.array([0, 0, 1, 3, 3, 3]), np.array([0, 2, 3]))
    >>> rows.tolist(), offset.tolist(), lengths.tolist()
    ([0, 1, 3, 4, 5], [0, 1, 1], [2, 0, 3])
    """
    first = np.searchsorted(kids, wanted, "left")
    lengths = np.searchsorted(kids, wanted, "right") - first
    offset = first - (np.cumsum(lengths) - lengths)
    return np.arange(int(lengths.sum()), dtype=I64) + np.repeat(offset, lengths), offset, lengths


def _searched(column: np.ndarray, queries: np.ndarray, side: str) -> np.ndarray:
    """``np.searchsorted`` of ``queries`` in order: NumPy's search starts each query where the
    last one ended, so in order it runs several times faster than in a random order, sorting
    included."""
    if (queries[1:] >= queries[:-1]).all():
        return np.searchsorted(column, queries, side)  # type: ignore[call-overload]
    order = np.argsort(queries, kind="stable")
    out = np.empty(len(queries), dtype=I64)
    out[order] = np.searchsorted(column, queries[order], side)  # type: ignore[call-overload]
    return out


def search_pairs(kids: np.ndarray, times: np.ndarray, qkids: np.ndarray, qtimes: np.ndarray,
                 side: str = "left") -> np.ndarray:
    """Where each (key id, time) query sorts in columns sorted by (key id, time), as
    ``np.searchsorted`` does for one column: one search for every query instead of a bisection
    per key.

    The pair is searched as one int64 (``kid * span + time``) when that cannot overflow. Ids that
    are keys' own integers (``IntKeys``: a user id of ten digits) are ranked first: a held id is
    twice its rank among the held ids, another one falls between them, so the pair keeps its
    order in a few bits. Times whose span leaves no room even then: each query key's run is
    searched on its own.

    >>> kids, times = np.array([0, 0, 1, 1]), np.array([5, 9, 2, 7])
    >>> search_pairs(kids, times, np.array([0, 1, 1, 2]), np.array([9, 0, 7, -1])).tolist()
    [1, 2, 3, 4]
    >>> search_pairs(kids, times, np.array([0, 1]), np.array([9, 7]), side="right").tolist()
    [2, 4]
    >>> big = np.array([10**15, 10**15, 10**17, 10**17])  # ids past what a pair holds: ranked
    >>> search_pairs(big, times, np.array([10**15, 10**16, 10**17, 10**18]), np.array([9, 0, 7, -1])).tolist()
    [1, 2, 3, 4]
    >>> far = np.array([-2**62, 9, 2, 2**62])  # a span no int64 pair holds: run by run
    >>> search_pairs(kids, far, np.array([0, 1, 1]), np.array([9, 2**62, 3])).tolist()
    [1, 3, 3]
    """
    if not len(kids) or not len(qkids):
        return np.full(len(qkids), 0, dtype=I64)
    low = min(int(times.min()), int(qtimes.min()))
    span = max(int(times.max()), int(qtimes.max())) - low + 1
    top = max(abs(int(kids[0])), abs(int(kids[-1])), abs(int(qkids.min())), abs(int(qkids.max()))) + 1
    if 2 * top * span < 1 << 62:
        return _searched(kids * span + (times - low), qkids * span + (qtimes - low), side)
    if (2 * len(kids) + 2) * span < 1 << 62:
        kids, qkids = _ranked(kids, qkids)
        return _searched(kids * span + (times - low), qkids * span + (qtimes - low), side)
    out = np.searchsorted(kids, qkids, side="left").astype(I64)
    ends = np.searchsorted(kids, qkids, side="right")
    for lo, hi, at in _query_runs(out, ends):
        out[at] = lo + np.searchsorted(times[lo:hi], qtimes[at], side)  # type: ignore[call-overload]
    return out


def _ranked(kids: np.ndarray, qkids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ids coded small with their order kept: a held id is twice its rank among the distinct held
    ids (``kids`` sorted), a query id no key holds is odd, between its neighbours."""
    firsts = run_starts(kids)
    distinct = kids[firsts]
    ranks = np.zeros(len(kids), dtype=I64)
    ranks[firsts[1:]] = 2
    at = np.searchsorted(distinct, qkids)
    held = distinct[np.minimum(at, len(distinct) - 1)] == qkids
    return np.cumsum(ranks), 2 * at - (~held)


def _query_runs(starts: np.ndarray, ends: np.ndarray) -> Iterable[tuple[int, int, np.ndarray]]:
    """Per distinct non-empty run ``[start, end)`` the queries that fall in it. A query whose key
    no row holds (an empty run) sorts where its run would begin, and may share that place with
    the run of the next key held: it is left out."""
    held = np.flatnonzero(ends > starts)
    order = held[np.argsort(starts[held], kind="stable")]
    for at in np.split(order, run_starts(starts[order])[1:]) if len(order) else ():
        yield int(starts[at[0]]), int(ends[at[0]]), at
