"""How a batch's session partials join the held sessions, decided before any column changes.

Most partials open a session of their own (after everything their key holds, and apart from the
key's other partials of the batch) or extend the latest session of their key (its only partial,
starting inside that session). Those are decided for the whole batch at once (:func:`plan_merge`),
with no Python per partial. The rest (partials of one key that join each other, or one that
reaches back further into what its key holds: a late row under ``reopen``, a partial bridging two
sessions) are joined key by key as before: per cap bucket, held sessions and partials swept by
start, each run of overlapping items one session. The plan lists what leaves (the held rows of
every run a partial joined) and what enters (one row per run, carrying its first held row's
stored start, flag and the run's held accumulators merged); the state applies it to its columns
in one step. The merge reads the state through :class:`HeldSessions` (what ``session_state``'s
``SessionState`` holds), so this module does not import the state that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, NoReturn, Protocol, Sequence

import numpy as np

from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.streaming.aggregators import Aggregator
from ematix_dagster.streaming.emitted import GroupKey
from ematix_dagster.streaming.kinds.sessions.session_rules import SessionWindows
from ematix_dagster.streaming.kinds.state_columns import NOT_STORED, run_rows


class HeldSessions(Protocol):
    """What a merge reads of the held sessions (``session_state.SessionState``): columns sorted by
    (key id, start), one accumulator column per aggregator."""

    pipeline: str
    aggregators: Sequence[Aggregator]
    kind: SessionWindows
    kid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    stored: np.ndarray
    emitted: np.ndarray
    accs: list[np.ndarray]

    def failed_merge(self, exc: Exception, index: int | None, key: GroupKey, start: int) -> NoReturn: ...


#: a swept item: (start, end, held row or -1, partial row or -1)
Item = tuple[int, int, int, int]
#: an end no session has: what a key holding none holds as its latest end
NONE = np.iinfo(np.int64).min


@dataclass
class MergePlan:
    """The rows a batch adds (one per new or rebuilt session) and removes, and where each partial goes."""

    width: int
    kids: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    emitted: list[bool] = field(default_factory=list)
    stored: list[int] = field(default_factory=list)
    accs: list[list[Any]] = field(default_factory=list)  # per aggregator, one value per added row
    removed: list[int] = field(default_factory=list)
    #: per partial row of the batch, the added row it folds into
    target: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: whether two partials fold into one added row (then they fold in batch order)
    shared: bool = False
    #: (key, start) of held sessions that were rebuilt: a row written under that start may be gone
    moved: list[tuple[GroupKey, int]] = field(default_factory=list)
    #: (stored start, key) of held sessions merged into another one: the store deletes their rows
    dropped: list[tuple[int, GroupKey]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accs = [[] for _ in range(self.width)]

    def add(self, kid: int, start: int, end: int, emitted: bool, stored: int, accs: list[Any]) -> int:
        self.kids.append(kid)
        self.starts.append(start)
        self.ends.append(end)
        self.emitted.append(emitted)
        self.stored.append(stored)
        for column, acc in zip(self.accs, accs):
            column.append(acc)
        return len(self.kids) - 1

    def add_rows(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray, emitted: list[bool],
                 stored: list[int], accs: list[list[Any]]) -> np.ndarray:
        """Many rows at once (``accs``: one list per aggregator); returns their positions."""
        at = len(self.kids)
        self.kids += kids.tolist()
        self.starts += starts.tolist()
        self.ends += ends.tolist()
        self.emitted += emitted
        self.stored += stored
        for column, more in zip(self.accs, accs):
            column += more
        return np.arange(at, len(self.kids))


class BatchKeys(NamedTuple):
    """The keys a batch brings (distinct, sorted) and what their held runs say, found by a search
    per key rather than a pass over every held session: the cap check and the plan share them."""

    kids: np.ndarray
    #: per key, its first row in the batch, its partials in the batch, whether it holds a session
    #: and the latest end it holds (int64's minimum: none)
    first: np.ndarray
    counts: np.ndarray
    holds: np.ndarray
    held_end: np.ndarray
    #: per batch row, its key's position in :attr:`kids`
    inverse: np.ndarray
    #: per key, its last held row (the latest start; -1: none) and the latest end of the others
    #: (int64's minimum: none)
    last: np.ndarray
    before_last_end: np.ndarray


def batch_keys(held_kids: np.ndarray, held_ends: np.ndarray, kids: np.ndarray) -> BatchKeys:
    """:class:`BatchKeys` of the batch rows' key ids ``kids`` against the held sessions' columns."""
    distinct, first, inverse, counts = np.unique(kids, return_index=True, return_inverse=True, return_counts=True)
    rows, offset, lengths = run_rows(held_kids, distinct)
    holds = lengths > 0
    ends = np.cumsum(lengths)  # where each run ends among ``rows``
    held_end = np.full(len(distinct), NONE, dtype=np.int64)
    before_last_end = held_end.copy()
    if len(rows):
        held_end[holds] = np.maximum.reduceat(held_ends[rows], (ends - lengths)[holds])
        several = lengths > 1
        if several.any():  # the runs less their last rows: each run begins one row earlier per run before it
            others = np.ones(len(rows), bool)
            others[ends[holds] - 1] = False
            begins = ends - lengths - (np.cumsum(holds) - holds)
            before_last_end[several] = np.maximum.reduceat(held_ends[rows[others]], begins[several])
    last = np.where(holds, offset + ends - 1, -1)
    return BatchKeys(distinct, first, counts, holds, held_end, inverse.reshape(-1), last, before_last_end)


def plan_merge(state: HeldSessions, batch: BatchKeys, kids: np.ndarray, keys: list[GroupKey], firsts: np.ndarray,
               lasts: np.ndarray) -> MergePlan:
    """What folding the batch's partials (row r: ``keys[r]`` with id ``kids[r]``, event times
    ``firsts[r]`` to ``lasts[r]``; ``batch``: their keys) into ``state`` adds and removes. Raises
    ValueError, before anything changes, for a partial that is not one ordered run inside one cap
    bucket."""
    rules, n = state.kind, len(kids)
    buckets = firsts // rules.cap
    valid = (lasts >= firsts) & (lasts // rules.cap == buckets)
    first_pos = batch.first[batch.inverse]  # per row, its key's first row in the batch
    if not valid.all():
        bad = np.flatnonzero(~valid)
        r = int(bad[np.lexsort((bad, first_pos[bad]))[0]])  # the first key's first bad partial
        raise ValueError(f"session partial [{int(firsts[r])}, {int(lasts[r])}] of group {keys[r]!r:.200} is not one "
                         f"ordered run inside one cap bucket (pipeline {state.pipeline})")
    ends = np.minimum(lasts + rules.gap, (buckets + 1) * rules.cap)
    alone = batch.counts[batch.inverse] == 1
    common = _apart(batch, kids, firsts, ends, buckets)[batch.inverse]
    plan = MergePlan(len(state.aggregators))
    target = np.empty(n, dtype=np.int64)
    own = np.flatnonzero(common)
    if len(own):  # the common case: partials after everything their key holds, each opening a session
        target[own] = plan.add_rows(kids[own], firsts[own], ends[own], [False] * len(own),
                                    [int(NOT_STORED)] * len(own), [[None] * len(own) for _ in range(plan.width)])
    common |= _extend_last(state, plan, target, batch, np.flatnonzero(alone & ~common), keys, firsts, ends, buckets)
    rest = np.flatnonzero(~common)
    if len(rest):
        _plan_keys(state, plan, target, rest[np.lexsort((rest, first_pos[rest]))], kids, keys,
                   firsts.tolist(), ends.tolist(), buckets.tolist())
    plan.target = target
    return plan


def _apart(batch: BatchKeys, kids: np.ndarray, firsts: np.ndarray, ends: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """Per key of ``batch``, whether each of its partials opens a session of its own: all start
    after every end the key holds, and none reaches the next one of its bucket (a sweep would
    leave each alone)."""
    apart = np.ones(len(batch.kids), bool)
    apart[batch.inverse[firsts <= batch.held_end[batch.inverse]]] = False
    order = np.lexsort((ends, firsts, kids))
    kids, firsts, ends, buckets = kids[order], firsts[order], ends[order], buckets[order]
    joins = (kids[1:] == kids[:-1]) & (buckets[1:] == buckets[:-1]) & (firsts[1:] <= ends[:-1])
    apart[batch.inverse[order[1:][joins]]] = False
    return apart


def _extend_last(state: HeldSessions, plan: MergePlan, target: np.ndarray, batch: BatchKeys, rows: np.ndarray,
                 keys: list[GroupKey], firsts: np.ndarray, ends: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """The next common case, for the whole batch at once: a key's only partial (of ``rows``) that
    starts inside the latest session it holds, in its bucket, when every other session of the key
    ends before that one starts (the sweep would join the two alone: the session keeps its start,
    flag, stored start and accumulators, and takes the later end). Returns a mask of the rows
    planned."""
    planned = np.zeros(len(target), bool)
    key_of = batch.inverse[rows]
    rows, key_of = rows[batch.holds[key_of]], key_of[batch.holds[key_of]]
    held = batch.last[key_of]
    start, end = state.start[held], state.end[held]
    fits = ((firsts[rows] >= start) & (firsts[rows] <= end) & (buckets[rows] == start // state.kind.cap)
            & (batch.before_last_end[key_of] < start))
    rows, held, start, end = rows[fits], held[fits], start[fits], end[fits]
    if not len(rows):
        return planned
    target[rows] = plan.add_rows(state.kid[held], start, np.maximum(end, ends[rows]), state.emitted[held].tolist(),
                                 state.stored[held].tolist(), [column[held].tolist() for column in state.accs])
    plan.removed += held.tolist()
    plan.moved += zip(map(keys.__getitem__, rows.tolist()), start.tolist())
    planned[rows] = True
    return planned


def _plan_keys(state: HeldSessions, plan: MergePlan, target: np.ndarray, rows: np.ndarray, kids: np.ndarray,
               keys: list[GroupKey], firsts: list[int], ends: list[int], buckets: list[int]) -> None:
    """Key by key (in order of first appearance), its partials ``rows`` (grouped by key, in batch
    order) joined with what it holds."""
    row_kids = kids[rows]
    lo = np.searchsorted(state.kid, row_kids, "left").tolist()
    hi = np.searchsorted(state.kid, row_kids, "right").tolist()
    held_starts, held_ends, cap = state.start, state.end, state.kind.cap
    at, rows_list, n = 0, rows.tolist(), len(rows)
    while at < n:
        kid, stop = int(row_kids[at]), at + 1
        while stop < n and row_kids[stop] == kid:
            stop += 1
        key_rows = rows_list[at:stop]
        by_bucket: dict[int, list[int]] = {}
        for r in key_rows:
            by_bucket.setdefault(buckets[r], []).append(r)
        held = range(lo[at], hi[at])
        starts, held_end = held_starts[held.start:held.stop].tolist(), held_ends[held.start:held.stop].tolist()
        for bucket, brows in by_bucket.items():
            items: list[Item] = [(s, e, h, -1) for h, s, e in zip(held, starts, held_end) if s // cap == bucket]
            items += [(firsts[r], ends[r], -1, r) for r in brows]
            items.sort(key=lambda item: (item[0], item[1]))
            run: list[Item] = []
            run_end = 0
            for item in items:
                if run and item[0] > run_end:
                    _join(state, plan, target, kid, keys[key_rows[0]], run)
                    run = []
                run_end = item[1] if not run else max(run_end, item[1])
                run.append(item)
            _join(state, plan, target, kid, keys[key_rows[0]], run)
        at = stop


def _join(state: HeldSessions, plan: MergePlan, target: np.ndarray, kid: int, key: GroupKey,
          run: list[Item]) -> None:
    """One session from a run of held sessions and partials (sorted by start): the first held one
    survives, taking the others' accumulators and flags; an untouched held session stays as it is."""
    olds = [item[2] for item in run if item[3] < 0]
    rows = [item[3] for item in run if item[3] >= 0]
    if not rows:  # held sessions never join each other
        return
    start, end = run[0][0], max(item[1] for item in run)
    if olds:
        survivor = olds[0]
        accs = [column[survivor] for column in state.accs]
        emitted = bool(state.emitted[survivor])
        for other in olds[1:]:
            for i, agg in enumerate(state.aggregators):
                try:
                    accs[i] = agg.merge(accs[i], state.accs[i][other])
                except (StateCapExceeded, AggregationOverflow, CorruptState) as exc:
                    state.failed_merge(exc, i, key, start)
            emitted = emitted or bool(state.emitted[other])
            if state.stored[other] != NOT_STORED:
                plan.dropped.append((int(state.stored[other]), key))
        stored = int(state.stored[survivor])
        plan.moved += [(key, int(state.start[h])) for h in olds]
        plan.removed += olds
    else:
        accs, emitted, stored = [None] * plan.width, False, int(NOT_STORED)
    j = plan.add(kid, start, end, emitted, stored, accs)
    plan.shared = plan.shared or len(rows) > 1
    target[rows] = j
