"""Tumbling and hopping window state: accumulators per (window start, group key).

State is a dict of windows, each a dict of groups, so the per-window group cap and "every group
of a window that closes" are both cheap. Whether a window was already emitted is not stored: for
fixed-size windows it is exactly "final at the watermark before this batch" (the watermark never
goes back, and every window that became final was emitted in that batch), so late rows reaching a
retained window make corrections, not second finals, and a restart knows the same from the
committed watermark alone. A commit writes the groups that changed, or the whole window when most
of its groups did (``streaming.durable``).

>>> from ematix_dagster.streaming.aggregators import Count
>>> from ematix_dagster.streaming.windows import FixedWindows
>>> state = FixedState("p", [Count()], ["n"], 10, FixedWindows(duration=10, hop=10))
>>> state.merge([0, 0, 10], [("a",), ("b",), ("a",)], [[1, 2, 3]])
>>> report = state.report(before=None, watermark=10, retention=0, scope=CHANGED)
>>> list(zip(report.starts, report.keys, report.closed))
[(0, ('a',), True), (0, ('b',), True), (10, ('a',), False)]
>>> state.merge([10], [("b",)], [[1]])
>>> report = state.report(before=10, watermark=10, retention=0)  # the watermark trigger: open windows wait
>>> len(report)
0
>>> report = state.report(before=10, watermark=10, retention=0, scope=OPEN)  # an interval trigger firing
>>> list(zip(report.starts, report.keys, report.changed))
[(10, ('a',), False), (10, ('b',), False)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress, groupby, repeat
from operator import is_, itemgetter, not_
from typing import TYPE_CHECKING, Any, Iterable, Sequence, cast

from ematix_dagster.streaming.aggregators import PartialRowError
from ematix_dagster.streaming.emitted import GroupKey
from ematix_dagster.streaming.state.base import (
    CHANGED,
    CLOSING,
    OPEN,
    Accumulators,
    Report,
    StateBase,
    StoreChanges,
    StoredGroup,
)

if TYPE_CHECKING:
    from ematix_dagster.streaming.windows.fixed import FixedWindows


@dataclass
class FixedState(StateBase):
    """All open (and, under ``reopen``, retained) fixed-size windows of one pipeline."""

    kind: FixedWindows
    windows: dict[int, dict[GroupKey, Accumulators]] = field(default_factory=dict)
    # the groups the batch changed, per window (what the next report is about)
    touched: dict[int, set[GroupKey]] = field(default_factory=dict, repr=False)
    # since the last commit: groups to upsert (per window), windows evicted whole
    dirty: dict[int, set[GroupKey]] = field(default_factory=dict, repr=False)
    evicted: set[int] = field(default_factory=set, repr=False)

    @property
    def flush_watermark(self) -> int | None:
        """The watermark at which every window is final (final is ``end <= W``)."""
        return max(self.kind.bounds(s).end for s in self.windows) if self.windows else None

    @property
    def group_count(self) -> int:
        return sum(len(groups) for groups in self.windows.values())

    @property
    def window_count(self) -> int:
        return len(self.windows)

    @property
    def state_rows(self) -> int:
        """One per (window, group), though the store may keep a window's groups in one row."""
        return self.group_count

    def open_windows(self, watermark: int | None) -> int:
        """Windows not emitted yet at ``watermark`` (retained windows under reopen were)."""
        kind = self.kind
        return sum(1 for start in self.windows if not kind.is_final(kind.bounds(start), watermark))

    # -- merge ----------------------------------------------------------------------------------

    def merge(self, starts: Sequence[int], keys: Sequence[GroupKey], partials: Sequence[Sequence[Any]],
              lasts: Sequence[int] = ()) -> None:
        """Fold one batch of partials in.

        A batch from Spark holds one partial per (window start, group), in runs of one window start
        (the batch sorts them). Each run is merged column by column: its groups' accumulators are
        looked up at once, each aggregator folds its whole column (``Aggregator.merge_column``),
        new groups enter in one dict update and held ones take their new accumulators in place.
        """
        touched: dict[int, set[GroupKey]] = {}
        row = 0
        for start, run in groupby(starts):
            end = row + len(list(run))
            self._merge_run(start, keys[row:end], [column[row:end] for column in partials], touched)
            row = end
        # A set may be shared by the report's and the commit's changes: both only ever grow by the
        # same merges until the report or the commit takes them.
        for changes in (self.touched, self.dirty):
            for start, keys_ in touched.items():
                held = changes.get(start)
                if held is None:
                    changes[start] = keys_
                elif held is not keys_:
                    held.update(keys_)

    def _merge_run(self, start: int, keys: Sequence[GroupKey], partials: list[Sequence[Any]],
                   touched: dict[int, set[GroupKey]]) -> None:
        """Merge the partials of one window start."""
        groups = self.windows.get(start)
        if groups is None:
            groups = self.windows[start] = {}
        seen = touched.setdefault(start, set())
        before = len(seen)
        seen.update(keys)
        if len(seen) - before != len(keys) and len(set(keys)) != len(keys):  # a group twice: row by row, in order
            for row in range(len(keys)):
                self._merge_run(start, keys[row:row + 1], [column[row:row + 1] for column in partials], touched)
            return
        olds = list(map(groups.get, keys))
        new = olds.count(None)
        if new and len(groups) + new > self.max_groups_per_window:
            first_new = keys[olds.index(None)]
            raise self.cap_hit(f"max_groups_per_window={self.max_groups_per_window}", "groups already in the window",
                               first_new, start)
        if 0 < new < len(olds):  # groups new to the window beside held ones: each part column by column
            fresh = list(map(is_, olds, repeat(None)))
            held = list(map(not_, fresh))
            self._merge_columns(groups, start, list(compress(keys, fresh)),
                                [list(compress(column, fresh)) for column in partials], None)
            self._merge_columns(groups, start, list(compress(keys, held)),
                                [list(compress(column, held)) for column in partials],
                                cast("list[Accumulators]", list(compress(olds, held))))  # held: none is None
        else:
            self._merge_columns(groups, start, keys, partials, None if new else cast("list[Accumulators]", olds))

    def _merge_columns(self, groups: dict[GroupKey, Accumulators], start: int, keys: Sequence[GroupKey],
                       partials: Sequence[Sequence[Any]], olds: list[Accumulators] | None) -> None:
        """Fold ``partials`` into the groups ``keys`` of one window: all of them held (``olds``, their
        accumulators) or all new to it (None)."""
        width = len(self.aggregators)
        columns = [[None] * len(keys)] * width if olds is None else [list(map(itemgetter(i), olds)) for i in range(width)]
        merged = []
        for i, (agg, accs, column) in enumerate(zip(self.aggregators, columns, partials)):
            try:
                merged.append(agg.merge_column(accs, column))
            except PartialRowError as failed:
                self.failed_merge(failed.error, i, keys[failed.row], start)
        if olds is None:
            groups.update(zip(keys, map(list, zip(*merged))))
        else:  # in place: no new lists, and no second lookup of keys arriving in random order
            for i, column in enumerate(merged):
                for accs, acc in zip(olds, column):
                    accs[i] = acc

    # -- emission -------------------------------------------------------------------------------

    def report(self, before: int | None, watermark: int | None, retention: int, scope: str = CLOSING) -> Report:
        """Every group of a window that closes at ``watermark``; the changed groups of windows
        emitted before (final at ``before``); of open ones, as ``scope`` says."""
        out = Report()
        kind, touched = self.kind, self.touched
        for start in sorted(self.windows):
            bounds = kind.bounds(start)
            groups = self.windows[start]
            changed = touched.get(start)
            if kind.is_final(bounds, before):
                if changed:
                    keys = list(changed)
                    out.add(start, bounds.end, keys, list(map(groups.__getitem__, keys)), True, True, True)
            elif kind.is_final(bounds, watermark) or scope == OPEN:
                keys = list(groups)
                flags = True if changed is not None and len(changed) == len(keys) \
                    else list(map((changed or set()).__contains__, keys))
                out.add(start, bounds.end, keys, list(groups.values()), flags, False, kind.is_final(bounds, watermark))
            elif changed and scope == CHANGED:
                keys = list(changed)
                out.add(start, bounds.end, keys, list(map(groups.__getitem__, keys)), True, False, False)
        self.touched = {}
        return out

    def accumulators(self, report: Report, rows: Sequence[int]) -> list[Accumulators]:
        return list(map(report.handles.__getitem__, rows))

    def values(self, report: Report, rows: Sequence[int]) -> list[list[Any]]:
        return self.value_columns(self.accumulators(report, rows))

    def set_marks(self, report: Report, rows: Sequence[int], marks: Sequence[Any]) -> None:
        handles = report.handles  # the held accumulator lists
        for r, mark in zip(rows, marks):
            handles[r][-1] = mark

    def mark_emitted(self, report: Report, rows: Sequence[int]) -> None:
        """Nothing to keep: a fixed window was emitted exactly when it was final at the last W."""

    def touch(self, report: Report, rows: Sequence[int]) -> None:
        dirty, starts, keys = self.dirty, report.starts, report.keys
        for r in rows:
            held = dirty.get(starts[r])
            if held is None:
                dirty[starts[r]] = {keys[r]}
            else:
                held.add(keys[r])

    def evict(self, watermark: int | None, retention: int) -> None:
        kind = self.kind
        for start in [s for s in self.windows if kind.is_evicted(kind.bounds(s), watermark, retention)]:
            del self.windows[start]
            self.written.pop(start, None)
            self.evicted.add(start)

    # -- durable state ----------------------------------------------------------------------------

    def take_changes(self) -> StoreChanges:
        """The changed groups of each held window (a store may write a window whole) and the
        windows evicted whole."""
        windows = [(start, self.kind.bounds(start).end, self.windows[start], keys)
                   for start, keys in self.dirty.items() if start in self.windows]
        evicted = sorted(self.evicted)
        self.dirty, self.evicted = {}, set()
        return StoreChanges(windows=windows, deleted_windows=evicted)

    def restore(self, groups: Iterable[StoredGroup], watermark: int | None) -> None:
        windows = self.windows
        for start, _end, key, accs, _emitted in groups:
            group = windows.get(start)
            if group is None:
                group = windows[start] = {}
            group[key] = accs
