"""Window state on the driver: accumulators per (window start, group key), caps and emission.

State is a dict of windows, each a dict of groups, so the per-window group cap and "emit every
window with end <= W" are both cheap. Windows that were emitted but are retained for ``reopen``
are remembered in ``emitted`` so late rows for them produce corrections, not second finals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.streaming.aggregators import Aggregator, order_key
from ematix_dagster.streaming.windows import format_window

GroupKey = tuple[Any, ...]


@dataclass(frozen=True)
class EmittedRow:
    """One output row before it becomes Arrow: window bounds, group key, finished values."""

    start: int
    end: int
    key: GroupKey
    values: tuple[Any, ...]
    kind: str  # "final" | "correction"


def _key_order(key: GroupKey) -> tuple[Any, ...]:
    return tuple((v is not None, order_key(v) if v is not None else 0) for v in key)


@dataclass
class WindowState:
    """All open (and, under ``reopen``, retained) windows of one pipeline."""

    pipeline: str
    duration: int
    aggregators: Sequence[Aggregator]
    aliases: Sequence[str]
    max_groups_per_window: int
    windows: dict[int, dict[GroupKey, list[Any]]] = field(default_factory=dict)
    emitted: set[int] = field(default_factory=set)
    # Changes since the last durable commit: groups to upsert, windows evicted whole.
    dirty: set[tuple[int, GroupKey]] = field(default_factory=set)
    evicted: set[int] = field(default_factory=set)

    @property
    def max_end(self) -> int | None:
        return max(self.windows) + self.duration if self.windows else None

    @property
    def group_count(self) -> int:
        return sum(len(groups) for groups in self.windows.values())

    def merge(self, starts: Sequence[int], keys: Sequence[GroupKey], partials: Sequence[Sequence[Any]]) -> dict[int, set[GroupKey]]:
        """Fold one batch of partials in; returns the groups touched per window."""
        touched: dict[int, set[GroupKey]] = {}
        aggs = list(enumerate(self.aggregators))
        cap = self.max_groups_per_window
        for row, (start, key) in enumerate(zip(starts, keys)):
            groups = self.windows.get(start)
            if groups is None:
                groups = self.windows[start] = {}
            accs = groups.get(key)
            if accs is None:
                if len(groups) >= cap:
                    raise StateCapExceeded(
                        f"window state cap hit: max_groups_per_window={cap} reached on window "
                        f"{format_window(start, start + self.duration)} for pipeline {self.pipeline}"
                    )
                accs = groups[key] = [None] * len(aggs)
            for i, agg in aggs:
                try:
                    accs[i] = agg.merge(accs[i], partials[i][row])
                except (StateCapExceeded, AggregationOverflow, CorruptState) as exc:
                    raise type(exc)(
                        f"window state cap hit: {exc} on window {format_window(start, start + self.duration)} "
                        f"group {key!r} ({self.aliases[i]}) for pipeline {self.pipeline}"
                        if isinstance(exc, StateCapExceeded)
                        else f"{exc}: {self.aliases[i]} on window {format_window(start, start + self.duration)} "
                        f"group {key!r} for pipeline {self.pipeline}"
                    ) from None
            touched.setdefault(start, set()).add(key)
            self.dirty.add((start, key))
        return touched

    def take_changes(self) -> tuple[list[tuple[int, GroupKey, list[Any]]], list[int]]:
        """Groups changed and windows evicted since the last call (what a store must write)."""
        upserts = [(start, key, self.windows[start][key]) for start, key in self.dirty if start in self.windows]
        evicted = sorted(self.evicted)
        self.dirty, self.evicted = set(), set()
        return upserts, evicted

    def _rows(self, start: int, keys: Iterable[GroupKey], kind: str) -> list[EmittedRow]:
        groups = self.windows[start]
        end = start + self.duration
        return [
            EmittedRow(start, end, key, tuple(a.result(acc) for a, acc in zip(self.aggregators, groups[key])), kind)
            for key in sorted(keys, key=_key_order)
        ]

    def emit(self, watermark: int | None, touched: dict[int, set[GroupKey]], retention: int) -> list[EmittedRow]:
        """Finals for windows whose end <= W, corrections for retained windows touched again.

        State is evicted at ``end + retention <= W``.
        """
        out: list[EmittedRow] = []
        for start in sorted(self.windows):
            end = start + self.duration
            if start in self.emitted:
                if start in touched:
                    out.extend(self._rows(start, touched[start], "correction"))
            elif watermark is not None and end <= watermark:
                out.extend(self._rows(start, self.windows[start].keys(), "final"))
                self.emitted.add(start)
        for start in [s for s in self.windows if s in self.emitted]:
            if watermark is not None and start + self.duration + retention <= watermark:
                del self.windows[start]
                self.emitted.discard(start)
                self.evicted.add(start)
        return out
