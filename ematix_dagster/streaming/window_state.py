"""Window state on the driver: accumulators per (window start, group key), caps and emission.

State is a dict of windows, each a dict of groups, so the per-window group cap and "emit every
final window" are both cheap. When a window is final and when it is evicted is its kind's rule
(``ematix_dagster.streaming.windows``).

Whether a window was already emitted is not stored: for fixed-size windows it is exactly "final
at the watermark before this batch" (the watermark never goes back, and every window that became
final was emitted in that batch), so late rows reaching a retained window make corrections, not
second finals, and a restart knows the same from the committed watermark alone. A commit writes
the groups that changed, or the whole window when most of its groups did
(``streaming.durable.batch_commit``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, compress, groupby, repeat
from operator import is_, itemgetter, not_
from typing import Any, Iterable, Sequence

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.streaming.aggregators import Aggregator, PartialRowError, order_key
from ematix_dagster.streaming.emitted import Emitted, GroupKey
from ematix_dagster.streaming.windows import WindowKind


def key_order(key: GroupKey) -> tuple[Any, ...]:
    """Sort key for group keys as Spark orders them, NULLs first (keys may mix None and values)."""
    return tuple((v is not None, order_key(v) if v is not None else 0) for v in key)


def sorted_keys(keys: Iterable[GroupKey]) -> list[GroupKey]:
    """``keys`` in Spark's order (:func:`key_order`).

    Keys without None or NaN compare as tuples in that order already, which sorts several times
    faster than building a :func:`key_order` per key (a batch sorts every key of each window it
    emits); a None makes the comparison fail, a NaN makes it wrong, and both take the slow path.
    """
    keys = list(keys)
    # NaN, the only value unequal to itself, is a float: keys without floats skip the look for it
    if float not in set(map(type, chain.from_iterable(keys))) or not any(v != v for key in keys for v in key):
        try:
            return sorted(keys)
        except TypeError:  # None beside values
            pass
    return sorted(keys, key=key_order)


@dataclass
class WindowState:
    """All open (and, under ``reopen``, retained) windows of one pipeline."""

    pipeline: str
    aggregators: Sequence[Aggregator]
    aliases: Sequence[str]
    max_groups_per_window: int
    window_kind: WindowKind
    windows: dict[int, dict[GroupKey, list[Any]]] = field(default_factory=dict)
    # Changes since the last durable commit: groups to upsert (per window), windows evicted whole.
    dirty: dict[int, set[GroupKey]] = field(default_factory=dict)
    evicted: set[int] = field(default_factory=set)

    def describe(self, start: int) -> str:
        """The window that starts at ``start``, for messages."""
        return self.window_kind.describe(self.window_kind.bounds(start))

    @property
    def flush_watermark(self) -> int | None:
        """The watermark at which every window is final (final is ``end <= W``)."""
        return max(self.window_kind.bounds(s).end for s in self.windows) if self.windows else None

    @property
    def group_count(self) -> int:
        return sum(len(groups) for groups in self.windows.values())

    @property
    def window_count(self) -> int:
        return len(self.windows)

    @property
    def state_rows(self) -> int:
        """The state's size as reported (``state_groups``): one per (window, group), though the store
        may keep a window's groups in one row (``streaming.durable.fixed_window_rows``)."""
        return self.group_count

    def merge(self, starts: Sequence[int], keys: Sequence[GroupKey], partials: Sequence[Sequence[Any]]) -> dict[int, set[GroupKey]]:
        """Fold one batch of partials in; returns the groups touched per window.

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
        for start, keys_ in touched.items():
            if start in self.dirty:
                self.dirty[start].update(keys_)
            else:  # the batch's set itself (it is not changed after the merge)
                self.dirty[start] = keys_
        return touched

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
            raise StateCapExceeded(
                f"window state cap hit: max_groups_per_window={self.max_groups_per_window} reached on window "
                f"{self.describe(start)} for pipeline {self.pipeline}"
            )
        if 0 < new < len(olds):  # groups new to the window beside held ones: each part column by column
            fresh = list(map(is_, olds, repeat(None)))
            held = list(map(not_, fresh))
            self._merge_columns(groups, start, list(compress(keys, fresh)),
                                [list(compress(column, fresh)) for column in partials], None)
            self._merge_columns(groups, start, list(compress(keys, held)),
                                [list(compress(column, held)) for column in partials], list(compress(olds, held)))
        else:
            self._merge_columns(groups, start, keys, partials, None if new else olds)

    def _merge_columns(self, groups: dict[GroupKey, list[Any]], start: int, keys: Sequence[GroupKey],
                       partials: Sequence[Sequence[Any]], olds: list[list[Any]] | None) -> None:
        """Fold ``partials`` into the groups ``keys`` of one window: all of them held (``olds``, their
        accumulators) or all new to it (None)."""
        width = len(self.aggregators)
        columns = [[None] * len(keys)] * width if olds is None else [list(map(itemgetter(i), olds)) for i in range(width)]
        merged = []
        for i, (agg, accs, column) in enumerate(zip(self.aggregators, columns, partials)):
            try:
                merged.append(agg.merge_column(accs, column))
            except PartialRowError as failed:
                exc, key, alias = failed.error, keys[failed.row], self.aliases[i]
                raise type(exc)(
                    f"window state cap hit: {exc} on window {self.describe(start)} "
                    f"group {key!r} ({alias}) for pipeline {self.pipeline}"
                    if isinstance(exc, StateCapExceeded)
                    else f"{exc}: {alias} on window {self.describe(start)} group {key!r} for pipeline {self.pipeline}"
                ) from None
        if olds is None:
            groups.update(zip(keys, map(list, zip(*merged))))
        else:  # in place: no new lists, and no second lookup of keys arriving in random order
            for i, column in enumerate(merged):
                for accs, acc in zip(olds, column):
                    accs[i] = acc

    def take_changes(self) -> tuple[dict[int, set[GroupKey]], list[int]]:
        """The changed groups of each held window and the windows evicted since the last call (what
        a store must write)."""
        changed = {start: keys for start, keys in self.dirty.items() if start in self.windows}
        evicted = sorted(self.evicted)
        self.dirty, self.evicted = {}, set()
        return changed, evicted

    def _add(self, out: Emitted, start: int, keys: Iterable[GroupKey], kind: str) -> None:
        """The rows of window ``start``'s groups ``keys`` (sorted as Spark would), one aggregator
        at a time over the window's groups."""
        groups = self.windows[start]
        ordered = sorted_keys(keys)
        states = list(map(groups.__getitem__, ordered))
        columns = [agg.result_column(list(map(itemgetter(i), states))) for i, agg in enumerate(self.aggregators)]
        out.add_window(start, self.window_kind.bounds(start).end, ordered, columns, kind)

    def emit(self, before: int | None, watermark: int | None, touched: dict[int, set[GroupKey]],
             retention: int) -> Emitted:
        """Finals for windows that became final between the watermarks ``before`` and ``watermark``,
        corrections for windows emitted earlier (final at ``before``) and touched again; emitted
        windows are evicted by the kind's rule."""
        out = Emitted()
        rules = self.window_kind
        for start in sorted(self.windows):
            bounds = rules.bounds(start)
            if rules.is_final(bounds, before):
                if start in touched:
                    self._add(out, start, touched[start], "correction")
            elif rules.is_final(bounds, watermark):
                self._add(out, start, self.windows[start].keys(), "final")
        for start in [s for s in self.windows if rules.is_evicted(rules.bounds(s), watermark, retention)]:
            del self.windows[start]
            self.evicted.add(start)
        return out

    def open_windows(self, watermark: int | None) -> int:
        """Windows not emitted yet at ``watermark`` (retained windows under reopen were)."""
        rules = self.window_kind
        return sum(1 for start in self.windows if not rules.is_final(rules.bounds(start), watermark))
