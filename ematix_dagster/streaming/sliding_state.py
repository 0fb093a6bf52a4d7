"""Sliding window state on the driver (SPEC.md §9): each key's partials by event time.

Spark pre-aggregates one partial per (key, event time) of a batch's accepted rows; the driver
folds them into the key's time-ordered partials and computes each window ``[t - D, t]`` from them
when it is emitted, sliding a :class:`~ematix_dagster.streaming.two_stacks.TwoStacks` over the
key's partials instead of merging every partial in range for every window. Only partials are
stored: window values are derived, so a late row is merged once, into its own event time, and
every window it reaches sees it.

Which windows exist and which were emitted is not stored either. Every retained partial at
``t >= W - retention`` has its window: it was accepted in a batch whose threshold
(``W_prev - retention``, with an older ``W_prev``) it passed, and windows below that threshold
are evicted. A window was emitted exactly when ``t < W``. The partials older than any window
that may still be created or changed needs (``t < W - retention - D``) leave state.

>>> from ematix_dagster.streaming.aggregators import Count
>>> from ematix_dagster.streaming.windows.sliding import SlidingWindows
>>> state = SlidingState("p", [Count()], ["n"], 10, SlidingWindows(duration=10, max_events=100))
>>> touched = state.merge([0, 5, 5, 20], [("a",)] * 4, [[1, 1, 1, 1]])
>>> [(row.start, row.end, row.values, row.kind) for row in state.emit(None, 21, touched, retention=0)]
[(-10, 0, (1,), 'final'), (-5, 5, (3,), 'final'), (10, 20, (1,), 'final')]
>>> sorted(state.keys[("a",)])  # 20 may still be in a window created at 21 or later: [11, 21]
[20]
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, insort
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, NoReturn, Sequence

from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.streaming.aggregators import Aggregator, PartialRowError, merge_partials
from ematix_dagster.streaming.two_stacks import TwoStacks
from ematix_dagster.streaming.window_state import EmittedRow, GroupKey, key_order
from ematix_dagster.streaming.windows.sliding import SlidingWindows

Accumulators = list[Any]


@dataclass
class SlidingState:
    """Every key's retained partials, by event time, for one pipeline."""

    pipeline: str
    aggregators: Sequence[Aggregator]
    aliases: Sequence[str]
    max_groups_per_window: int  # keys holding retained partials at once
    rules: SlidingWindows
    #: key -> event time -> accumulators (the partials of that event time, merged)
    keys: dict[GroupKey, dict[int, Accumulators]] = field(default_factory=dict)
    #: key -> its retained event times, ascending
    times: dict[GroupKey, list[int]] = field(default_factory=dict)
    # since the last commit: partials to upsert, (event time, key) rows to delete
    _dirty: dict[tuple[int, GroupKey], None] = field(default_factory=dict, init=False, repr=False)
    _dropped: dict[tuple[int, GroupKey], None] = field(default_factory=dict, init=False, repr=False)
    # (event time, sequence, key) of partials whose window is not final yet, and of every
    # retained partial (for eviction): emission finds its work without scanning every key
    _unfinal: list[tuple[int, int, GroupKey]] = field(default_factory=list, init=False, repr=False)
    _retained: list[tuple[int, int, GroupKey]] = field(default_factory=list, init=False, repr=False)
    _seq: Iterator[int] = field(default_factory=itertools.count, init=False, repr=False)

    @property
    def window_kind(self) -> SlidingWindows:
        return self.rules

    @property
    def group_count(self) -> int:
        """Keys holding partials (what ``max_groups_per_window`` caps)."""
        return len(self.keys)

    @property
    def window_count(self) -> int:
        """Retained event times over all keys."""
        return sum(map(len, self.times.values()))

    @property
    def state_rows(self) -> int:
        """Rows the store holds for this state: one per retained (event time, key)."""
        return self.window_count

    @property
    def flush_watermark(self) -> int | None:
        """The watermark at which every window is final (final is ``t < W``)."""
        newest = max((times[-1] for times in self.times.values() if times), default=None)
        return None if newest is None else newest + 1

    def open_windows(self, watermark: int | None) -> int:
        """Windows not emitted yet: one per retained event time at or after ``W``."""
        if watermark is None:
            return self.window_count
        return sum(len(times) - bisect_left(times, watermark) for times in self.times.values())

    def describe(self, start: int) -> str:
        """The window ending at ``start``, for messages."""
        return self.rules.describe(self.rules.bounds(start))

    # -- merge ----------------------------------------------------------------------------------

    def merge(self, starts: Sequence[int], keys: Sequence[GroupKey], partials: Sequence[Sequence[Any]]) -> dict[int, set[GroupKey]]:
        """Fold one batch of partials in (row r: event time ``starts[r]`` of ``keys[r]``); returns
        the event times touched, with their keys (what :meth:`emit` re-emits windows for)."""
        touched: dict[int, set[GroupKey]] = {}
        width, cap, events_cap = len(self.aggregators), self.max_groups_per_window, self.rules.max_events
        held, times_of = self.keys, self.times
        states: list[Accumulators] = []
        for t, key in zip(starts, keys):
            events = held.get(key)
            if events is None:
                if len(held) >= cap:
                    raise StateCapExceeded(
                        f"sliding window state cap hit: max_groups_per_window={cap} keys already hold rows when "
                        f"group {key!r:.200} arrives with window {self.describe(t)} for pipeline {self.pipeline}")
                events = held[key] = {}
                times_of[key] = []
            accs = events.get(t)
            if accs is None:
                times = times_of[key]
                if len(times) >= events_cap:
                    raise StateCapExceeded(
                        f"sliding window state cap hit: max_events_per_group={events_cap} distinct event times "
                        f"retained for group {key!r:.200} when window {self.describe(t)} arrives, for pipeline "
                        f"{self.pipeline}")
                accs = events[t] = [None] * width
                if not times or t > times[-1]:
                    times.append(t)
                else:
                    insort(times, t)
                entry = (t, next(self._seq), key)
                heapq.heappush(self._unfinal, entry)
                heapq.heappush(self._retained, entry)
            states.append(accs)
            touched.setdefault(t, set()).add(key)
            self._dirty[(t, key)] = None
        try:
            merge_partials(self.aggregators, states, partials)
        except PartialRowError as failed:
            self._fail(failed.error, keys[failed.row], starts[failed.row], failed.index)
        return touched

    def _fail(self, exc: StateCapExceeded | AggregationOverflow | CorruptState, key: GroupKey, t: int,
              index: int | None = None) -> NoReturn:
        alias = "" if index is None else f" ({self.aliases[index]})"
        where = f"on window {self.describe(t)} group {key!r:.200}{alias} for pipeline {self.pipeline}"
        if isinstance(exc, StateCapExceeded):
            raise StateCapExceeded(f"sliding window state cap hit: {exc} {where}") from None
        raise type(exc)(f"{exc} {where}") from None

    # -- emission and eviction ------------------------------------------------------------------

    def emit(self, before: int | None, watermark: int | None, touched: dict[int, set[GroupKey]],
             retention: int) -> list[EmittedRow]:
        """Finals for windows with ``before <= t < W``, corrections for emitted windows (and
        windows created behind ``before``) that a partial of this batch reaches; then eviction."""
        targets: dict[GroupKey, dict[int, str]] = {}
        unfinal = self._unfinal
        while unfinal and watermark is not None and unfinal[0][0] < watermark:
            t, _, key = heapq.heappop(unfinal)
            if (before is None or t >= before) and t in self.keys.get(key, ()):
                targets.setdefault(key, {})[t] = "final"
        if before is not None:
            self._corrections(before - retention, before, touched, targets)
        rows: list[EmittedRow] = []
        for key in sorted(targets, key=key_order):
            rows.extend(self._rows(key, targets[key]))
        rows.sort(key=lambda row: row.end)  # by window, then key (sorted is stable)
        self._evict(self.rules.needed_from(watermark, retention))
        return rows

    def _corrections(self, held_from: int, before: int, touched: dict[int, set[GroupKey]],
                     targets: dict[GroupKey, dict[int, str]]) -> None:
        """Emitted windows (``held_from <= t < before``) holding a partial of this batch."""
        duration = self.rules.duration
        by_key: dict[GroupKey, list[int]] = {}
        for t, keys in touched.items():
            if t + duration >= held_from and t < before:  # may reach a retained, emitted window
                for key in keys:
                    by_key.setdefault(key, []).append(t)
        for key, changed in by_key.items():
            changed.sort()
            times = self.times[key]
            lo = bisect_left(times, max(changed[0], held_from))
            hi = bisect_left(times, min(changed[-1] + duration + 1, before))
            mine = targets.setdefault(key, {})
            for t in times[lo:hi]:
                # a changed event time in [t - D, t]
                i = bisect_left(changed, t - duration)
                if i < len(changed) and changed[i] <= t:
                    mine[t] = "correction"

    def _rows(self, key: GroupKey, wanted: dict[int, str]) -> list[EmittedRow]:
        """The key's windows ending at ``wanted``'s times, computed in one pass over its partials."""
        duration, aggs = self.rules.duration, self.aggregators
        events, times = self.keys[key], self.times[key]

        def merge(a: Accumulators | None, b: Accumulators | None) -> Accumulators | None:
            if a is None:
                return b
            if b is None:
                return a
            return [agg.merge(x, y) for agg, x, y in zip(aggs, a, b)]

        queue: TwoStacks[Accumulators] = TwoStacks(merge)
        lo = hi = 0  # the queue holds times[lo:hi]
        out: list[EmittedRow] = []
        for t in sorted(wanted):
            first = t - duration
            try:
                if hi <= lo or times[hi - 1] < first:  # nothing held is in this window: start afresh
                    queue = TwoStacks(merge)
                    lo = hi = bisect_left(times, first)
                while hi < len(times) and times[hi] <= t:
                    queue.push(events[times[hi]])
                    hi += 1
                while times[lo] < first:
                    queue.pop()
                    lo += 1
                accs = queue.total()
            except (StateCapExceeded, AggregationOverflow, CorruptState) as exc:
                self._fail(exc, key, t)
            values = tuple(agg.result(acc) for agg, acc in zip(aggs, accs))
            out.append(EmittedRow(first, t, key, values, wanted[t]))
        return out

    def _evict(self, needed_from: int | None) -> None:
        """Partials no window that may still be created or changed can contain leave state."""
        if needed_from is None:
            return
        retained, keys = self._retained, set()
        while retained and retained[0][0] < needed_from:
            keys.add(heapq.heappop(retained)[2])
        for key in keys:
            times = self.times.get(key)
            if not times:
                continue
            cut = bisect_left(times, needed_from)
            events = self.keys[key]
            for t in times[:cut]:
                del events[t]
                self._dirty.pop((t, key), None)
                self._dropped[(t, key)] = None
            del times[:cut]
            if not times:
                del self.keys[key], self.times[key]

    # -- durable state ----------------------------------------------------------------------------

    def take_changes(self) -> tuple[list[tuple[int, GroupKey, Accumulators]], list[tuple[int, GroupKey]]]:
        """Partials changed and (event time, key) rows gone since the last call (what a store writes)."""
        upserts = [(t, key, self.keys[key][t]) for t, key in self._dirty]
        deletes = list(self._dropped)
        self._dirty, self._dropped = {}, {}
        return upserts, deletes

    def restore(self, groups: Iterable[tuple[int, GroupKey, Accumulators]]) -> None:
        """Load partials a store returned (as :meth:`take_changes` wrote them) into empty state."""
        if self.keys:
            raise RuntimeError("restore needs an empty SlidingState")
        for t, key, accs in groups:
            self.keys.setdefault(key, {})[t] = accs
        for key, events in self.keys.items():
            self.times[key] = sorted(events)
            for t in events:
                entry = (t, next(self._seq), key)
                self._unfinal.append(entry)
                self._retained.append(entry)
        heapq.heapify(self._unfinal)
        heapq.heapify(self._retained)
