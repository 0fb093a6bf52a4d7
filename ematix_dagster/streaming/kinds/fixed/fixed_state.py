"""Tumbling and hopping window state: accumulators per (window start, group key), held as columns.

Each window is a few arrays sorted by key id (``streaming.kinds.state_keys``: the key itself for one
integer column): the per-window group cap and "every group of a window that closes" stay cheap,
a batch's run of one window merges by one search and one fold per aggregator, and a commit hands
the changed rows over as columns (one segment, ``state_store.segments``). Whether a window was
already emitted is not stored: for fixed-size windows it is exactly "final at the watermark
before this batch" (the watermark never goes back, and every window that became final was emitted
in that batch), so late rows reaching a retained window make corrections, not second finals, and
a restart knows the same from the committed watermark alone. Windows end in start order, so an
eviction is one range delete in the store (every start below the last evicted one).

>>> from ematix_dagster.streaming.aggregators import Count
>>> from ematix_dagster.streaming.kinds import FixedWindows
>>> state = FixedState("p", [Count()], ["n"], 10, FixedWindows(duration=10, hop=10))
>>> state.merge([0, 0, 10], [("a",), ("b",), ("a",)], [[1, 2, 3]])
>>> report = state.report(before=None, watermark=10, retention=0, scope=CHANGED)
>>> list(zip(report.starts.tolist(), report.keys, report.closed.tolist()))
[(0, ('a',), True), (0, ('b',), True), (10, ('a',), False)]
>>> state.merge([10], [("b",)], [[1]])
>>> report = state.report(before=10, watermark=10, retention=0)  # the watermark trigger: open windows wait
>>> len(report)
0
>>> report = state.report(before=10, watermark=10, retention=0, scope=OPEN)  # an interval trigger firing
>>> list(zip(report.starts.tolist(), report.keys, report.changed.tolist()))
[(10, ('a',), False), (10, ('b',), False)]
>>> state.groups
{0: {('a',): [1], ('b',): [2]}, 10: {('a',): [3], ('b',): [1]}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Iterator, Sequence

import numpy as np

from ematix_dagster.streaming.aggregators import Aggregator
from ematix_dagster.streaming.emitted import Column, GroupKey
from ematix_dagster.streaming.kinds.fixed.fixed_rules import FixedWindows
from ematix_dagster.streaming.kinds.kind_state import (
    CHANGED,
    CLOSING,
    KEY_VALUE_BYTES,
    OPEN,
    Accumulators,
    ColumnChanges,
    Report,
    StateBase,
    StoredColumns,
)
from ematix_dagster.streaming.kinds.state_columns import (
    I64,
    accumulator_rows,
    fold_partials,
    ints,
    objects,
    run_starts,
)
from ematix_dagster.streaming.kinds.state_keys import INDEXED_KEY_BYTES, IntKeys, KeyCodes, to_index
from state_store.int_key_column import taken

#: one held group without its accumulators: its key id and two flags (measured by
#: ``tests/streaming/test_state_size.py``), and a slot per aggregator
FIXED_ROW_BYTES = 10
ACC_SLOT_BYTES = 8


@dataclass(eq=False)
class HeldWindow:
    """One window's groups as columns sorted by key id: ``changed`` since the last report,
    ``dirty`` since the last commit, one column of accumulators per aggregator.

    An accumulator column is a typed NumPy array (counts, float sums) while the batches' partials
    for it arrive as one (``Aggregator.array_partials``): the merge is then one vectorised fold.
    Otherwise, and from the first batch whose partials come as Python values (a NULL among them),
    it is an object column. Either way ``tolist`` gives the same Python values.
    """

    kid: np.ndarray
    accs: list[np.ndarray]
    changed: np.ndarray
    dirty: np.ndarray

    @classmethod
    def empty(cls, width: int) -> HeldWindow:
        return cls(np.zeros(0, I64), [objects((), 0) for _ in range(width)], np.zeros(0, bool), np.zeros(0, bool))

    def __len__(self) -> int:
        return len(self.kid)

    def align(self, aggregators: Sequence[Aggregator], partials: list[Sequence[Any]]) -> list[Sequence[Any]]:
        """Each accumulator column typed or of objects for this merge (an empty column takes its
        partials' type; a typed one meeting Python values becomes objects); returns the partials
        as each column folds them."""
        out: list[Sequence[Any]] = []
        for i, (agg, part) in enumerate(zip(aggregators, partials)):
            column = self.accs[i]
            if isinstance(part, np.ndarray) and agg.array_empty is not None and (
                    column.dtype == part.dtype or not len(column)):
                self.accs[i] = column.astype(part.dtype, copy=False)
                out.append(part)
                continue
            if column.dtype != object:
                self.accs[i] = column.astype(object)
            out.append(part.tolist() if isinstance(part, np.ndarray) else part)
        return out

    def insert(self, kids: np.ndarray, aggregators: Sequence[Aggregator]) -> None:
        """New groups ``kids`` (distinct, sorted, none held) in where they sort, with empty
        accumulators (None; in a typed column, its aggregator's ``array_empty``)."""
        where = np.searchsorted(self.kid, kids)
        self.kid = np.insert(self.kid, where, kids)
        self.accs = [np.insert(column, where, objects([None] * len(kids), len(kids)) if column.dtype == object
                               else agg.array_empty) for agg, column in zip(aggregators, self.accs)]
        self.changed = np.insert(self.changed, where, False)
        self.dirty = np.insert(self.dirty, where, False)

    def take(self, rows: np.ndarray) -> None:
        """Keep the rows ``rows`` (positions in order), as when its key ids were renumbered."""
        self.kid, self.changed, self.dirty = self.kid[rows], self.changed[rows], self.dirty[rows]
        self.accs = [column[rows] for column in self.accs]


@dataclass
class FixedState(StateBase):
    """All open (and, under ``reopen``, retained) fixed-size windows of one pipeline."""

    kind: FixedWindows
    windows: dict[int, HeldWindow] = field(default_factory=dict, repr=False)
    codes: KeyCodes = field(default_factory=IntKeys, repr=False)
    # the windows with groups changed since the last report, and since the last commit
    _changed: set[int] = field(default_factory=set, init=False, repr=False)
    _dirty: set[int] = field(default_factory=set, init=False, repr=False)
    # every window starting before this was evicted since the last commit
    _evicted_before: int | None = field(default=None, init=False, repr=False)
    #: counts and float sums come as arrays, held in typed columns (:class:`HeldWindow`)
    typed_partials: ClassVar[bool] = True

    @staticmethod
    def bytes_per_group(aggregators: Sequence[Aggregator], key_width: int) -> int:
        """One held group: its row in the columns plus its accumulators, and its key's cost where
        keys are not one integer column (a key index entry; a key held in several windows is
        counted in each)."""
        return (FIXED_ROW_BYTES + INDEXED_KEY_BYTES + KEY_VALUE_BYTES * key_width
                + sum(ACC_SLOT_BYTES + a.state_bytes for a in aggregators))

    @property
    def groups(self) -> dict[int, dict[GroupKey, Accumulators]]:
        """Each window's groups and their accumulators (a snapshot: for messages and tests)."""
        return {start: dict(zip(self.codes.keys_of(held.kid), accumulator_rows(held.accs)))
                for start, held in sorted(self.windows.items())}

    @property
    def flush_watermark(self) -> int | None:
        """The watermark at which every window is final (final is ``end <= W``)."""
        return self.kind.bounds(max(self.windows)).end if self.windows else None

    @property
    def group_count(self) -> int:
        return sum(map(len, self.windows.values()))

    @property
    def window_count(self) -> int:
        return len(self.windows)

    @property
    def state_rows(self) -> int:
        """One per (window, group)."""
        return self.group_count

    def open_windows(self, watermark: int | None) -> int:
        """Windows not emitted yet at ``watermark`` (retained windows under reopen were)."""
        kind = self.kind
        return sum(1 for start in self.windows if not kind.is_final(kind.bounds(start), watermark))

    # -- merge ----------------------------------------------------------------------------------

    def merge(self, starts: Sequence[int], keys: Sequence[GroupKey], partials: Sequence[Sequence[Any]],
              lasts: Sequence[int] = ()) -> None:
        """Fold one batch of partials in.

        A batch from Spark holds one partial per (window start, group), in hash order. Sorted by
        window start here (the starts, then a permutation of each column: no copy of Spark's table
        with its sketches in it), each run of one start is merged column by column (its groups
        found by one search, new ones inserted where they sort, each aggregator folding its whole
        column). Several partials of one group fold in batch order (``fold_partials``).
        """
        n = len(keys)
        if not n:
            return
        column = starts if isinstance(starts, np.ndarray) else ints(starts, n)
        if np.any(column[1:] < column[:-1]):  # Spark's come in hash order: sorted, batch order kept within a start
            order = self._start_order(column)
            at = order.tolist() if not all(isinstance(part, np.ndarray) for part in partials) else []
            keys, column = taken(keys, order), column[order]
            partials = [part[order] if isinstance(part, np.ndarray) else list(map(part.__getitem__, at))
                        for part in partials]
        kids = self._ids(keys)
        bounds = [*run_starts(column).tolist(), n]
        for lo, hi in zip(bounds, bounds[1:]):
            self._merge_run(int(column[lo]), kids[lo:hi], keys[lo:hi], [part[lo:hi] for part in partials])

    def _start_order(self, starts: np.ndarray) -> np.ndarray:
        """A stable order of the starts: counted in hops from the first they fit 16 bits, which
        NumPy sorts by radix (twice as fast as int64); starts off one grid keep the int64 sort."""
        hops, off_grid = np.divmod(starts - starts.min(), self.kind.hop)
        if hops.max() < 1 << 16 and not off_grid.any():
            return np.argsort(hops.astype(np.uint16), kind="stable")
        return np.argsort(starts, kind="stable")

    def _ids(self, keys: Sequence[GroupKey]) -> np.ndarray:
        ids = self.codes.ids_of(keys)
        if ids is None:  # a key that is not one integer: every held key moves to an index
            kept = list(self.windows.values())
            index, columns = to_index(self.codes, [held.kid for held in kept])
            for held, kid in zip(kept, columns):
                held.kid = kid
                held.take(np.argsort(kid, kind="stable"))
            self.codes = index
            ids = index.ids_of(keys)
        return ids

    def _merge_run(self, start: int, kids: np.ndarray, keys: Sequence[GroupKey], partials: list[Sequence[Any]]) -> None:
        """Merge the partials of one window start."""
        held = self.windows.get(start)
        if held is None:
            held = self.windows[start] = HeldWindow.empty(len(self.aggregators))
        partials = held.align(self.aggregators, partials)
        # Searched in key order: NumPy's search runs several times faster over sorted queries, the
        # new keys come out sorted, and a run with no two partials of one group shows it without a
        # second sort. The fold keeps batch order itself, so this sort need not be stable.
        order = np.argsort(kids)
        in_order = kids[order]
        shared = bool((in_order[1:] == in_order[:-1]).any())
        at = np.empty(len(kids), I64)
        at[order] = np.searchsorted(held.kid, in_order)
        new = at >= len(held)
        new[~new] = held.kid[at[~new]] != kids[~new]
        if new.any():
            fresh = in_order[new[order]]
            if shared:
                fresh = np.unique(fresh)
            if len(held) + len(fresh) > self.max_groups_per_window:
                if not len(held):
                    del self.windows[start]
                raise self.cap_hit(f"max_groups_per_window={self.max_groups_per_window}", "groups already in the window",
                                   keys[int(np.argmax(new))], start)
            held.insert(fresh, self.aggregators)
            at[order] = np.searchsorted(held.kid, in_order)
        fold_partials(self.aggregators, held.accs, at, partials, shared=shared,
                      failed=lambda error, i: self.failed_merge(error.error, i, keys[error.row], start))
        held.changed[at] = True
        held.dirty[at] = True
        self._changed.add(start)
        self._dirty.add(start)

    # -- emission -------------------------------------------------------------------------------

    def report(self, before: int | None, watermark: int | None, retention: int, scope: str = CLOSING) -> Report:
        """Every group of a window that closes at ``watermark``; the changed groups of windows
        emitted before (final at ``before``); of open ones, as ``scope`` says. A row's handle is
        its position in its window."""
        kind, touched = self.kind, self._changed
        parts: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray, bool, bool]] = []
        for start in sorted(self.windows):
            held, bounds = self.windows[start], self.kind.bounds(start)
            changed = held.changed if start in touched else None
            picked: tuple[np.ndarray, np.ndarray, bool, bool] | None = None  # rows, changed, emitted, closed
            if kind.is_final(bounds, before):
                if changed is not None:
                    rows = np.flatnonzero(changed)
                    picked = rows, np.ones(len(rows), bool), True, True
            elif kind.is_final(bounds, watermark) or scope == OPEN:
                flags = changed.copy() if changed is not None else np.zeros(len(held), bool)
                picked = np.arange(len(held)), flags, False, kind.is_final(bounds, watermark)
            elif changed is not None and scope == CHANGED:
                rows = np.flatnonzero(changed)
                picked = rows, np.ones(len(rows), bool), False, False
            if picked is not None:
                rows, flags, emitted, closed = picked
                parts.append((start, bounds.end, rows, held.kid[rows], flags, emitted, closed))
            if changed is not None:
                changed[:] = False
        self._changed = set()
        if not parts:
            return Report()
        counts = [len(part[2]) for part in parts]
        starts, ends, handles, kids, changed_flags, emitted_flags, closed_flags = zip(*parts)
        return Report(starts=np.repeat(ints(starts, len(parts)), counts), ends=np.repeat(ints(ends, len(parts)), counts),
                      keys=self.codes.key_column(np.concatenate(kids)), changed=np.concatenate(changed_flags),
                      emitted=np.repeat(np.array(emitted_flags, bool), counts),
                      closed=np.repeat(np.array(closed_flags, bool), counts), handles=np.concatenate(handles))

    def _rows(self, report: Report, rows: np.ndarray) -> Iterator[tuple[int, HeldWindow, np.ndarray, np.ndarray]]:
        """``report``'s rows ``rows`` per window: its start, the window, the rows' positions in it
        and their places in ``rows``."""
        starts, positions = report.starts[rows], report.handles[rows]
        order = np.argsort(starts, kind="stable")
        for run in np.split(order, run_starts(starts[order])[1:]) if len(rows) else ():
            start = int(starts[run[0]])
            yield start, self.windows[start], positions[run], run

    def _gathered(self, report: Report, rows: np.ndarray, wanted: Iterable[int]) -> list[np.ndarray]:
        """The accumulator columns ``wanted`` (aggregator indexes) of ``report``'s rows ``rows``, in
        that order: typed where every window's column is of one type, else of objects."""
        wanted = list(wanted)
        runs = list(self._rows(report, rows))
        out = []
        for i in wanted:
            dtypes = {held.accs[i].dtype for _, held, _, _ in runs}
            column = np.empty(len(rows), dtype=dtypes.pop() if len(dtypes) == 1 else object)
            for _, held, positions, places in runs:
                column[places] = held.accs[i][positions]
            out.append(column)
        return out

    def accumulators(self, report: Report, rows: np.ndarray) -> list[Accumulators]:
        return accumulator_rows(self._gathered(report, rows, range(len(self.aggregators))))

    def values(self, report: Report, rows: np.ndarray) -> list[Column]:
        """Finished from the accumulator columns, without a list of accumulators per row; a typed
        column (a count, a float sum: ``HeldWindow``) is its own result and stays an array."""
        shown = [i for i, agg in enumerate(self.aggregators) if not agg.hidden]
        gathered = dict(zip(shown, self._gathered(report, rows, shown)))
        out: list[Column] = []
        for i in shown:
            column = gathered[i]
            out.append(column if column.dtype != object else self.aggregators[i].result_column(column.tolist()))
        return out

    def set_marks(self, report: Report, rows: np.ndarray, marks: Sequence[Any]) -> None:
        column = objects(marks, len(rows))
        for _, held, positions, places in self._rows(report, rows):
            held.accs[-1][positions] = column[places]

    def mark_emitted(self, report: Report, rows: np.ndarray) -> None:
        """Nothing to keep: a fixed window was emitted exactly when it was final at the last W."""

    def touch(self, report: Report, rows: np.ndarray) -> None:
        for start, held, positions, _ in self._rows(report, rows):
            held.dirty[positions] = True
            self._dirty.add(start)

    def evict(self, watermark: int | None, retention: int) -> None:
        kind = self.kind
        gone = [s for s in self.windows if kind.is_evicted(kind.bounds(s), watermark, retention)]
        if not gone:
            return
        for start in gone:
            del self.windows[start]
            self.written.pop(start, None)
        bound = max(gone) + 1
        self._evicted_before = bound if self._evicted_before is None else max(self._evicted_before, bound)
        kept = list(self.windows.values())
        for held, kid in zip(kept, self.codes.compacted([held.kid for held in kept])):
            held.kid = kid

    # -- durable state ----------------------------------------------------------------------------

    def take_column_changes(self, everything: bool = False) -> ColumnChanges:
        """Groups changed (``everything``: every group) since the last call, and the range delete
        of the windows evicted since (a store deletes first, then upserts)."""
        starts = sorted(self.windows) if everything else sorted(self._dirty.intersection(self.windows))
        parts = []
        for start in starts:
            held = self.windows[start]
            rows = np.arange(len(held)) if everything else np.flatnonzero(held.dirty)
            parts.append((start, held.kid[rows], [column[rows] for column in held.accs]))
            held.dirty[:] = False
        deleted_before = None if everything else self._evicted_before
        self._dirty, self._evicted_before = set(), None
        counts = [len(kids) for _, kids, _ in parts]
        width = len(self.aggregators)
        return ColumnChanges(
            starts=np.repeat(ints((s for s, _, _ in parts), len(parts)), counts),
            ends=np.repeat(ints((self.kind.bounds(s).end for s, _, _ in parts), len(parts)), counts),
            keys=self.codes.key_column(np.concatenate([kids for _, kids, _ in parts]) if parts else np.zeros(0, I64)),
            accs=[np.concatenate([accs[i] for _, _, accs in parts]) if parts else objects((), 0) for i in range(width)],
            deleted_before=deleted_before)

    def restore(self, groups: StoredColumns, watermark: int | None) -> None:
        """Load groups a store returned into empty state: ordered by (start, key id) in one sort,
        each start's run of rows is its window."""
        if self.windows:
            raise RuntimeError("restore needs an empty FixedState")
        n = len(groups)
        if not n:
            return
        kids, starts = self._ids(groups.keys), ints(groups.starts, n)
        order = np.lexsort((kids, starts))
        kids, starts = kids[order], starts[order]
        accs = [objects(column, n)[order] for column in groups.accs]
        bounds = [*run_starts(starts).tolist(), n]
        for lo, hi in zip(bounds, bounds[1:]):
            self.windows[int(starts[lo])] = HeldWindow(kids[lo:hi].copy(), [column[lo:hi].copy() for column in accs],
                                                       np.zeros(hi - lo, bool), np.zeros(hi - lo, bool))
