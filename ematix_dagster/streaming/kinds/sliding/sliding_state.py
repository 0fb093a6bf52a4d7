"""Sliding window state on the driver (docs/contract/windows.md): each key's partials by event time.

Spark pre-aggregates one partial per (key, event time) of a batch's accepted rows; the driver
folds them into the key's time-ordered partials and computes each window ``[t - D, t]`` from them
when it is emitted (``streaming.kinds.sliding.sliding_windows``: differences of prefix sums when every
aggregator is additive, else a two-stack queue slid over the key's partials). Only partials are
stored: window values are derived, so a late row is merged once, into its own event time, and
every window it reaches sees it.

Partials are held as columns (``streaming.kinds.state_columns``) sorted by key id and event time: a
batch is merged, its windows found and derived, evicted and committed as whole arrays
(docs/decisions.md, "Columnar driver state"); an emission of additive windows sums only the
emitted keys' runs.

Which windows exist and which were emitted is not stored either. Every retained partial at
``t >= W - retention`` has its window: it was accepted in a batch whose threshold
(``W_prev - retention``, with an older ``W_prev``) it passed, and windows below that threshold
are evicted. A window was emitted exactly when ``t < W``. The partials older than any window
that may still be created or changed needs (``t < W - retention - D``) leave state.

>>> from ematix_dagster.streaming.aggregators import Count
>>> from ematix_dagster.streaming.emission import emit
>>> from ematix_dagster.streaming.kinds import SlidingWindows
>>> state = SlidingState("p", [Count()], ["n"], 10, SlidingWindows(duration=10, max_events=100))
>>> state.merge([0, 5, 5, 20], [("a",)] * 4, [[1, 1, 1, 1]])
>>> [(row.start, row.end, row.values, row.kind) for row in emit(state, None, 21, retention=0).rows]
[(-10, 0, (1,), 'final'), (-5, 5, (3,), 'final'), (10, 20, (1,), 'final')]
>>> state.time.tolist()  # 20 may still be in a window created at 21 or later: [11, 21]
[20]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn, Sequence

import numpy as np

from ematix_dagster.streaming.aggregators import Aggregator
from ematix_dagster.streaming.emitted import GroupKey
from ematix_dagster.streaming.kinds.kind_state import (
    CLOSING,
    Accumulators,
    ColumnChanges,
    Report,
    StateBase,
    StoredColumns,
)
from ematix_dagster.streaming.kinds.sliding.sliding_rules import SlidingWindows
from ematix_dagster.streaming.kinds.sliding.sliding_windows import (
    WindowFailed,
    additive,
    by_prefix_sums,
    by_two_stacks,
    parts_of,
    put,
)
from ematix_dagster.streaming.kinds.state_columns import (
    I64,
    fold_partials,
    ints,
    objects,
    run_count,
    run_starts,
    search_pairs,
)
from ematix_dagster.streaming.kinds.state_keys import IntKeys, KeyCodes, coded

#: a partial without its accumulators, as ``tests/streaming/test_state_size.py`` measures it: key
#: id, event time and two flags (18 bytes of columns) plus an object slot per aggregator, less
#: the boxed value an aggregator's ``state_bytes`` counts and a small count or minimum does not
#: hold (40-45 bytes measured a partial with one such accumulator)
SLIDING_PARTIAL_BYTES = 10
#: each additive part a partial keeps beside its accumulators (its slot in the part's column)
PREFIX_PART_BYTES = 8


@dataclass
class SlidingState(StateBase):
    """Every key's retained partials, by key id and event time, for one pipeline.

    ``max_groups_per_window`` caps the keys holding retained partials at once. Row r of the
    columns is the partial of the key of id ``kid[r]`` at event time ``time[r]``; ``touched``:
    it took partials since the last report, ``dirty``: since the last commit.
    """

    kind: SlidingWindows
    codes: KeyCodes = field(default_factory=IntKeys, repr=False)
    kid: np.ndarray = field(init=False, repr=False)
    time: np.ndarray = field(init=False, repr=False)
    touched: np.ndarray = field(init=False, repr=False)
    dirty: np.ndarray = field(init=False, repr=False)
    #: one object column per aggregator, and (additive aggregators) one per part of each
    accs: list[np.ndarray] = field(init=False, repr=False)
    parts: list[np.ndarray] = field(init=False, repr=False)
    _evicted_before: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._additive = additive(self.aggregators)
        width = sum(agg.additive_parts for agg in self.aggregators) if self._additive else 0
        self._set(np.zeros(0, I64), np.zeros(0, I64), np.zeros(0, bool), np.zeros(0, bool),
                  [objects((), 0) for _ in self.aggregators], [objects((), 0) for _ in range(width)])

    def _set(self, kid: np.ndarray, time: np.ndarray, touched: np.ndarray, dirty: np.ndarray,
             accs: list[np.ndarray], parts: list[np.ndarray]) -> None:
        self.kid, self.time, self.touched, self.dirty, self.accs, self.parts = kid, time, touched, dirty, accs, parts

    def _take(self, rows: np.ndarray) -> None:
        self._set(self.kid[rows], self.time[rows], self.touched[rows], self.dirty[rows],
                  [c[rows] for c in self.accs], [c[rows] for c in self.parts])

    @staticmethod
    def bytes_per_group(aggregators: Sequence[Aggregator], key_width: int) -> int:
        """One retained (key, event time) partial: the key itself is shared by its partials."""
        prefix_parts = sum(a.additive_parts for a in aggregators) if additive(aggregators) else 0
        return SLIDING_PARTIAL_BYTES + sum(a.state_bytes for a in aggregators) + PREFIX_PART_BYTES * prefix_parts

    @property
    def group_count(self) -> int:
        """Keys holding partials (what ``max_groups_per_window`` caps)."""
        return run_count(self.kid)

    @property
    def window_count(self) -> int:
        """Retained event times over all keys."""
        return len(self.kid)

    @property
    def state_rows(self) -> int:
        """Rows the store holds for this state: one per retained (event time, key)."""
        return len(self.kid)

    @property
    def flush_watermark(self) -> int | None:
        """The watermark at which every window is final (final is ``t < W``)."""
        return int(self.time.max()) + 1 if len(self.time) else None

    def open_windows(self, watermark: int | None) -> int:
        """Windows not emitted yet: one per retained event time at or after ``W``."""
        if watermark is None:
            return len(self.time)
        return int(np.count_nonzero(self.time >= watermark))

    # -- merge ----------------------------------------------------------------------------------

    def merge(self, starts: Sequence[int], keys: Sequence[GroupKey], partials: Sequence[Sequence[Any]],
              lasts: Sequence[int] = ()) -> None:
        """Fold one batch of partials in (row r: event time ``starts[r]`` of ``keys[r]``); the event
        times touched are what the next report re-emits windows for.

        New (key, event time)s are inserted where they sort, every partial row then knows its row,
        and each aggregator folds its whole column at once (rows of one partial in batch order).
        """
        n = len(keys)
        if not n:
            return
        kids, times = self._ids(keys), ints(starts, n)  # keys themselves only name a row in an error
        order = np.lexsort((times, kids))  # the batch's pairs sorted once: searched and inserted in that order
        first = np.concatenate(([True], (np.diff(kids[order]) != 0) | (np.diff(times[order]) != 0)))
        pair = np.empty(n, I64)
        pair[order] = np.cumsum(first) - 1
        rows = order[first]  # each distinct pair's first row in batch order (a stable sort)
        at = search_pairs(self.kid, self.time, kids[rows], times[rows])
        found = at < len(self.kid)
        found[found] = (self.kid[at[found]] == kids[rows[found]]) & (self.time[at[found]] == times[rows[found]])
        new = np.flatnonzero(~found)
        if len(new):
            self._check_caps(rows[new], kids, keys, starts)
            where = at[new]
            self._insert(where, kids[rows[new]], times[rows[new]])
            at[found] += np.searchsorted(where, at[found], "right")  # np.insert puts new rows before ``where``
            at[new] = where + np.arange(len(new))
        self._fold(at[pair], keys, starts, partials, shared=len(rows) < n)

    def _ids(self, keys: Sequence[GroupKey]) -> np.ndarray:
        self.codes, self.kid, ids = coded(self.codes, self.kid, keys)
        return ids

    def _check_caps(self, firsts: np.ndarray, kids: np.ndarray, keys: Sequence[GroupKey], starts: Sequence[int]) -> None:
        """Refuse the batch before changing anything when its new keys or new event times would
        pass a cap, naming the first row (in batch order) that does."""
        key_cap, events_cap = self.max_groups_per_window, self.kind.max_events
        if len(self.kid) + len(firsts) <= events_cap and self.group_count + len(firsts) <= key_cap:
            return  # no key can pass either cap even if every new row were its
        firsts = np.sort(firsts)
        new_kids = kids[firsts]
        by_kid = np.argsort(new_kids, kind="stable")
        in_order = new_kids[by_kid]  # searched in order: several times faster than in batch order
        held = np.empty(len(firsts), I64)
        held[by_kid] = np.searchsorted(self.kid, in_order, "right") - np.searchsorted(self.kid, in_order, "left")
        rank = np.empty(len(firsts), I64)
        runs = run_starts(in_order)
        rank[by_kid] = np.arange(len(firsts)) - np.repeat(runs, np.diff(np.append(runs, len(firsts))))
        opening = (held == 0) & (rank == 0)
        over_keys = np.flatnonzero(opening & (np.cumsum(opening) + self.group_count > key_cap))
        over_events = np.flatnonzero(held + rank >= events_cap)
        if len(over_keys) and (not len(over_events) or over_keys[0] <= over_events[0]):
            r = int(firsts[over_keys[0]])
            raise self.cap_hit(f"max_groups_per_window={key_cap}", "keys already hold rows", keys[r], starts[r])
        if len(over_events):
            r = int(firsts[over_events[0]])
            raise self.cap_hit(f"max_events_per_group={events_cap}",
                               "distinct event times are already retained for the group", keys[r], starts[r])

    def _insert(self, where: np.ndarray, kids: np.ndarray, times: np.ndarray) -> None:
        """Empty partials for the new (key id, event time)s (sorted), before the rows ``where``:
        every column widened by one placement of old and new rows (``np.insert`` would place them
        anew for each column)."""
        m = len(kids)
        new = where + np.arange(m)
        old = np.ones(len(self.kid) + m, bool)
        old[new] = False

        def widened(column: np.ndarray, fill: Any) -> np.ndarray:
            out = np.empty(len(old), column.dtype)
            out[old], out[new] = column, fill
            return out

        self._set(widened(self.kid, kids), widened(self.time, times), widened(self.touched, False),
                  widened(self.dirty, False), [widened(c, None) for c in self.accs],
                  [widened(c, 0) for c in self.parts])  # the parts are overwritten by the fold

    def _fold(self, targets: np.ndarray, keys: Sequence[GroupKey], starts: Sequence[int],
              partials: Sequence[Sequence[Any]], shared: bool) -> None:
        """Each aggregator folds its column of partials into the rows ``targets`` (``shared``: some
        row takes several; Spark sends one partial per (key, event time) and source, so rarely)."""
        rows = fold_partials(self.aggregators, self.accs, targets, partials,
                             failed=lambda error, i: self.failed_merge(error.error, i, keys[error.row],
                                                                       starts[error.row]), shared=shared)
        if self._additive:
            fresh = parts_of(self.aggregators, self.accs, rows)
            self.parts = [put(column, rows, part) for column, part in zip(self.parts, fresh)]
        self.touched[rows] = True
        self.dirty[rows] = True

    # -- emission and eviction ------------------------------------------------------------------

    def report(self, before: int | None, watermark: int | None, retention: int, scope: str = CLOSING) -> Report:
        """Finals for windows with ``before <= t < W``, and the windows emitted (or created behind
        ``before``) that a partial of this batch reaches. Sliding windows fire on the watermark
        only (docs/contract/windows.md): windows still open are not looked at, and a closing
        window's ``changed`` is not looked for. A row's handle is its partial's row.
        """
        time = self.time
        final = np.zeros(len(time), bool) if watermark is None else time < watermark
        if before is not None:
            final &= time >= before
            corrected = self._corrections(before - retention, before)
        else:
            corrected = np.zeros(len(time), bool)
        self.touched[:] = False
        rows = np.flatnonzero(final | corrected)
        rows = rows[np.argsort(time[rows])]  # by start, as rows are written (the emission orders ties by key)
        ends = time[rows]
        emitted = corrected[rows]
        return Report(starts=ends - self.kind.duration, ends=ends, keys=self.codes.key_column(self.kid[rows]),
                      changed=emitted, emitted=emitted.copy(), closed=np.ones(len(rows), bool), handles=rows)

    def _corrections(self, held_from: int, before: int) -> np.ndarray:
        """Emitted windows (``held_from <= t < before``) holding a partial of this batch: those
        whose ``[t - D, t]`` counts a touched partial of their key."""
        out = np.zeros(len(self.time), bool)
        if not self.touched.any():
            return out
        rows = np.flatnonzero((self.time >= held_from) & (self.time < before))
        touched = np.concatenate(([0], np.cumsum(self.touched)))
        lo = search_pairs(self.kid, self.time, self.kid[rows], self.time[rows] - self.kind.duration)
        out[rows] = touched[rows + 1] > touched[lo]
        return out

    def accumulators(self, report: Report, rows: np.ndarray) -> list[Accumulators]:
        """Each window's accumulators, derived for all of ``rows`` at once (a row's handle is the
        partial its window ends at)."""
        lo, hi = self._bounds(report, rows)
        try:
            if self._additive:
                return list(map(list, zip(*by_prefix_sums(self.aggregators, self.kid, self.parts, lo, hi))))
            return by_two_stacks(self.aggregators, self.kid, self.accs, lo, hi)
        except WindowFailed as failed:
            self._failed(failed, hi)

    def values(self, report: Report, rows: np.ndarray) -> list[list[Any]]:
        """Additive windows' values straight from the columns of their prefix sums, without a list
        of accumulators per window."""
        if not self._additive:
            return self.value_columns(self.accumulators(report, rows))
        lo, hi = self._bounds(report, rows)
        try:
            return self.finished(by_prefix_sums(self.aggregators, self.kid, self.parts, lo, hi))
        except WindowFailed as failed:
            self._failed(failed, hi)

    def _bounds(self, report: Report, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The partials ``[lo, hi)`` of the windows of ``report``'s rows ``rows``."""
        hi = report.handles[rows] + 1
        return search_pairs(self.kid, self.time, self.kid[hi - 1], self.time[hi - 1] - self.kind.duration), hi

    def _failed(self, failed: WindowFailed, hi: np.ndarray) -> NoReturn:
        end = int(hi[failed.window]) - 1
        self.failed_merge(failed.error, None, self.codes.keys_of(self.kid[end:end + 1])[0], int(self.time[end]))

    def set_marks(self, report: Report, rows: np.ndarray, marks: Sequence[Any]) -> None:
        """Never called: no trigger that keeps a row count fires for sliding windows (they emit on
        the watermark only), and their accumulators are derived, not held."""

    def mark_emitted(self, report: Report, rows: np.ndarray) -> None:
        """Nothing to keep: a sliding window was emitted exactly when ``t`` was before the last W."""

    def touch(self, report: Report, rows: np.ndarray) -> None:
        """Nothing changes in place: sliding windows emit on the watermark only and keep no written
        rows (``retractions`` is refused under ``reopen``, where alone a row could be superseded)."""

    def evict(self, watermark: int | None, retention: int) -> None:
        """Partials no window that may still be created or changed can contain leave state."""
        needed_from = self.kind.needed_from(watermark, retention)
        if needed_from is None:
            return
        gone = self.time < needed_from
        if gone.any():
            self._take(~gone)
            self.kid, = self.codes.compacted([self.kid])
        self._evicted_before = needed_from

    # -- durable state ----------------------------------------------------------------------------

    def take_column_changes(self, everything: bool = False) -> ColumnChanges:
        """Partials changed (``everything``: every partial) since the last call, one row per (event
        time, key) stored with start = end = its event time, and the event time before which every
        stored row is gone (eviction is by event time: one range delete)."""
        at = np.arange(len(self.kid)) if everything else np.flatnonzero(self.dirty)
        times, kids = self.time[at], self.kid[at]
        self.dirty[:] = False
        evicted_before, self._evicted_before = self._evicted_before, None
        firsts = run_starts(kids)  # the rows are by key: each key once, its partials its run
        return ColumnChanges(starts=times, ends=times, keys=self.codes.key_column(kids[firsts]),
                             key_rows=np.repeat(np.arange(len(firsts)), np.diff(np.append(firsts, len(kids)))),
                             accs=[c[at] for c in self.accs], deleted_before=None if everything else evicted_before)

    def restore(self, groups: StoredColumns, watermark: int | None) -> None:
        """Load partials a store returned (as :meth:`take_column_changes` handed them over) into empty state."""
        if len(self.kid):
            raise RuntimeError("restore needs an empty SlidingState")
        n = len(groups)
        if not n:
            return
        times, keys = ints(groups.starts, n), groups.keys
        accs = [objects(column, n) for column in groups.accs]
        everything = np.arange(n)
        parts = parts_of(self.aggregators, accs, everything) if self._additive else []
        self._set(self._ids(keys), times, np.zeros(n, bool), np.zeros(n, bool), accs, parts)
        self._take(np.lexsort((self.time, self.kid)))

