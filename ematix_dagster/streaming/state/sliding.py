"""Sliding window state on the driver (docs/contract/windows.md): each key's partials by event time.

Spark pre-aggregates one partial per (key, event time) of a batch's accepted rows; the driver
folds them into the key's time-ordered partials and computes each window ``[t - D, t]`` from them
when it is emitted, in one pass over the key's partials instead of merging every partial in range
for every window: a difference of prefix sums when every aggregator is additive (counts, sums,
averages: ``Aggregator.additive_parts``), else a
:class:`~ematix_dagster.streaming.two_stacks.TwoStacks` slid over the partials. Only partials are
stored: window values are derived, so a late row is merged once, into its own event time, and
every window it reaches sees it.

Which windows exist and which were emitted is not stored either. Every retained partial at
``t >= W - retention`` has its window: it was accepted in a batch whose threshold
(``W_prev - retention``, with an older ``W_prev``) it passed, and windows below that threshold
are evicted. A window was emitted exactly when ``t < W``. The partials older than any window
that may still be created or changed needs (``t < W - retention - D``) leave state.

>>> from ematix_dagster.streaming.aggregators import Count
>>> from ematix_dagster.streaming.emission import emit
>>> from ematix_dagster.streaming.windows import SlidingWindows
>>> state = SlidingState("p", [Count()], ["n"], 10, SlidingWindows(duration=10, max_events=100))
>>> state.merge([0, 5, 5, 20], [("a",)] * 4, [[1, 1, 1, 1]])
>>> [(row.start, row.end, row.values, row.kind) for row in emit(state, None, 21, retention=0).rows]
[(-10, 0, (1,), 'final'), (-5, 5, (3,), 'final'), (10, 20, (1,), 'final')]
>>> sorted(state.keys[("a",)])  # 20 may still be in a window created at 21 or later: [11, 21]
[20]
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.streaming.aggregators import Aggregator, PartialRowError, merge_partials
from ematix_dagster.streaming.emitted import GroupKey
from ematix_dagster.streaming.state.base import (
    CLOSING,
    Accumulators,
    Report,
    StateBase,
    StoreChanges,
    StoredGroup,
)
from ematix_dagster.streaming.two_stacks import TwoStacks

if TYPE_CHECKING:
    from ematix_dagster.streaming.windows.sliding import SlidingWindows


#: a partial without its accumulators: its slot in the key's dict of event times and in the key's
#: sorted times, the accumulator list (measured by ``tests/streaming/test_state_size.py``)
SLIDING_PARTIAL_BYTES = 130
#: each prefix sum an additive aggregator keeps per partial and accumulator part
PREFIX_PART_BYTES = 30


def _additive(aggregators: Sequence[Aggregator]) -> bool:
    """Every aggregator subtracts (counts, sums, averages): windows are differences of prefix sums."""
    return all(agg.additive_parts for agg in aggregators)


@dataclass
class SlidingState(StateBase):
    """Every key's retained partials, by event time, for one pipeline.

    ``max_groups_per_window`` caps the keys holding retained partials at once.
    """

    kind: SlidingWindows
    #: key -> event time -> accumulators (the partials of that event time, merged)
    keys: dict[GroupKey, dict[int, Accumulators]] = field(default_factory=dict)
    #: key -> its retained event times, ascending
    times: dict[GroupKey, list[int]] = field(default_factory=dict)
    # since the last commit: partials to upsert, and the event time every older row is evicted before
    _dirty: dict[tuple[int, GroupKey], None] = field(default_factory=dict, init=False, repr=False)
    # since the last report: the event times the batch's partials landed in, with their keys
    _touched: dict[int, set[GroupKey]] = field(default_factory=dict, init=False, repr=False)
    _evicted_before: int | None = field(default=None, init=False, repr=False)
    # additive aggregators: key -> per accumulator part, the prefix sums over the key's partials
    # (``[0, p0, p0 + p1, ...]``, one longer than its times), extended as partials are appended,
    # rebased as old ones leave, dropped when a partial lands among older ones (rebuilt when needed)
    _prefix: dict[GroupKey, list[list[Any]]] = field(default_factory=dict, init=False, repr=False)
    _additive: bool = field(default=False, init=False, repr=False)

    @staticmethod
    def bytes_per_group(aggregators: Sequence[Aggregator], key_width: int) -> int:
        """One retained (key, event time) partial: the key itself is shared by its partials."""
        prefix_sums = sum(a.additive_parts for a in aggregators) if _additive(aggregators) else 0
        return SLIDING_PARTIAL_BYTES + sum(a.state_bytes for a in aggregators) + PREFIX_PART_BYTES * prefix_sums

    def __post_init__(self) -> None:
        self._additive = _additive(self.aggregators)

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

    # -- merge ----------------------------------------------------------------------------------

    def merge(self, starts: Sequence[int], keys: Sequence[GroupKey], partials: Sequence[Sequence[Any]],
              lasts: Sequence[int] = ()) -> None:
        """Fold one batch of partials in (row r: event time ``starts[r]`` of ``keys[r]``); the event
        times touched, with their keys, are what the next report re-emits windows for."""
        touched = self._touched
        width, cap, events_cap = len(self.aggregators), self.max_groups_per_window, self.kind.max_events
        held, times_of, prefix = self.keys, self.times, self._prefix
        states: list[Accumulators] = []
        appended: dict[GroupKey, list[int]] = {}  # keys whose cached prefix sums grow at the end
        for t, key in zip(starts, keys):
            events = held.get(key)
            if events is None:
                if len(held) >= cap:
                    raise self.cap_hit(f"max_groups_per_window={cap}", "keys already hold rows", key, t)
                events = held[key] = {}
                times_of[key] = []
            accs = events.get(t)
            if accs is None:
                times = times_of[key]
                if len(times) >= events_cap:
                    raise self.cap_hit(f"max_events_per_group={events_cap}",
                                       "distinct event times are already retained for the group", key, t)
                accs = events[t] = [None] * width
                if not times or t > times[-1]:
                    times.append(t)
                    if key in prefix:
                        appended.setdefault(key, []).append(t)
                else:
                    insort(times, t)
                    prefix.pop(key, None)
            elif key in prefix:  # an older partial changes: every later prefix sum does
                del prefix[key]
            states.append(accs)
            touched.setdefault(t, set()).add(key)
            self._dirty[(t, key)] = None
        try:
            merge_partials(self.aggregators, states, partials)
        except PartialRowError as failed:
            self.failed_merge(failed.error, failed.index, keys[failed.row], starts[failed.row])
        for key, new in appended.items():
            if key in prefix:
                self._extend_prefix(prefix[key], [held[key][t] for t in new])

    # -- emission and eviction ------------------------------------------------------------------

    def report(self, before: int | None, watermark: int | None, retention: int, scope: str = CLOSING) -> Report:
        """Finals for windows with ``before <= t < W``, and the windows emitted (or created behind
        ``before``) that a partial of this batch reaches. Sliding windows fire on the watermark
        only (docs/contract/windows.md): windows still open are not looked at, and a closing window's ``changed``
        is not looked for.

        Finals are found by a bisection per key holding partials (keys hold partials only while a
        window may still need them), not by an index per partial.
        """
        targets: dict[GroupKey, dict[int, bool]] = {}  # key -> window end -> emitted (a correction)
        if watermark is not None:
            for key, times in self.times.items():
                lo = 0 if before is None else bisect_left(times, before)
                hi = bisect_left(times, watermark, lo)
                if lo < hi:
                    targets[key] = dict.fromkeys(times[lo:hi], False)
        if before is not None:
            self._corrections(before - retention, before, self._touched, targets)
        self._touched = {}
        # a key's rows in one run, by end: a row's handle is its key's run, computed in one pass
        ends: list[int] = []
        keys: list[GroupKey] = []
        runs: list[tuple[int, int]] = []
        emitted: list[bool] = []
        for key, windows in targets.items():
            at = len(ends)
            if len(windows) == 1:  # most keys: one window a batch
                for t, flag in windows.items():
                    ends.append(t)
                    keys.append(key)
                    runs.append((at, at + 1))
                    emitted.append(flag)
            else:
                times = sorted(windows)
                ends += times
                keys += repeat(key, len(times))
                runs += repeat((at, at + len(times)), len(times))
                emitted += map(windows.__getitem__, times)
        duration = self.kind.duration
        return Report(starts=[t - duration for t in ends], ends=ends, keys=keys, changed=emitted,
                      emitted=list(emitted), closed=[True] * len(ends), handles=runs)

    def _corrections(self, held_from: int, before: int, touched: dict[int, set[GroupKey]],
                     targets: dict[GroupKey, dict[int, bool]]) -> None:
        """Emitted windows (``held_from <= t < before``) holding a partial of this batch."""
        duration = self.kind.duration
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
            for t in times[lo:hi]:
                # a changed event time in [t - D, t]
                i = bisect_left(changed, t - duration)
                if i < len(changed) and changed[i] <= t:
                    targets.setdefault(key, {})[t] = True

    def accumulators(self, report: Report, rows: Sequence[int]) -> list[Accumulators]:
        """Each window's accumulators, computed per key in one pass over its partials (a report row's
        handle is its key's run of rows, sorted by end)."""
        found: list[Accumulators] = [[]] * len(report)
        for lo, hi in dict.fromkeys(map(report.handles.__getitem__, rows)):
            key, ends = report.keys[lo], report.ends[lo:hi]
            try:
                found[lo:hi] = self._by_prefix_sums(key, ends) if self._additive else self._by_two_stacks(key, ends)
            except (StateCapExceeded, AggregationOverflow, CorruptState) as exc:
                self.failed_merge(exc, None, key, ends[0])
        return list(map(found.__getitem__, rows))

    def mark_emitted(self, report: Report, rows: Sequence[int]) -> None:
        """Nothing to keep: a sliding window was emitted exactly when ``t`` was before the last W."""

    def touch(self, report: Report, rows: Sequence[int]) -> None:
        """Nothing changes in place: sliding windows emit on the watermark only and keep no written
        rows (``retractions`` is refused under ``reopen``, where alone a row could be superseded)."""

    def _by_prefix_sums(self, key: GroupKey, ends: list[int]) -> list[list[Any]]:
        """Each window's accumulators as differences of the key's prefix sums."""
        duration, aggs, times = self.kind.duration, self.aggregators, self.times[key]
        prefixes = self._prefix.get(key)
        if prefixes is None:
            prefixes = self._prefix[key] = [[0] for agg in aggs for _ in range(agg.additive_parts)]
            self._extend_prefix(prefixes, [self.keys[key][t] for t in times])
        out: list[list[Any]] = []
        for t in ends:
            lo, hi = bisect_left(times, t - duration), bisect_right(times, t)
            diffs = [prefix[hi] - prefix[lo] for prefix in prefixes]
            window, at = [], 0
            for agg in aggs:
                window.append(agg.from_parts(diffs[at:at + agg.additive_parts]))
                at += agg.additive_parts
            out.append(window)
        return out

    def _extend_prefix(self, prefixes: list[list[Any]], partials: list[Accumulators]) -> None:
        """Append the running sums of ``partials`` (the key's newest, in time order) to its prefix sums."""
        at = 0
        for i, agg in enumerate(self.aggregators):
            parts = [agg.to_parts(accs[i]) for accs in partials]
            for j in range(agg.additive_parts):
                prefix = prefixes[at]
                prefix += accumulate((p[j] for p in parts), initial=prefix[-1])
                del prefix[-len(parts) - 1]  # accumulate repeats its initial value first
                at += 1

    def _by_two_stacks(self, key: GroupKey, ends: list[int]) -> list[list[Any]]:
        """Each window's accumulators from a two-stack queue slid over the key's partials (for
        aggregators that cannot subtract: min, max, distinct sets, sketches, first, last)."""
        duration, aggs = self.kind.duration, self.aggregators
        events, times = self.keys[key], self.times[key]

        def merge(a: Accumulators | None, b: Accumulators | None) -> Accumulators | None:
            if a is None:
                return b
            if b is None:
                return a
            return [agg.merge(x, y) for agg, x, y in zip(aggs, a, b)]

        queue: TwoStacks[Accumulators] = TwoStacks(merge)
        lo = hi = 0  # the queue holds times[lo:hi]
        out: list[list[Any]] = []
        for t in ends:
            first = t - duration
            if hi <= lo or times[hi - 1] < first:  # nothing held is in this window: start afresh
                queue = TwoStacks(merge)
                lo = hi = bisect_left(times, first)
            while hi < len(times) and times[hi] <= t:
                queue.push(events[times[hi]])
                hi += 1
            while times[lo] < first:
                queue.pop()
                lo += 1
            out.append(queue.total())
        return out

    def evict(self, watermark: int | None, retention: int) -> None:
        """Partials no window that may still be created or changed can contain leave state."""
        needed_from = self.kind.needed_from(watermark, retention)
        if needed_from is None:
            return
        for key in [key for key, times in self.times.items() if times[0] < needed_from]:
            times, events = self.times[key], self.keys[key]
            cut = bisect_left(times, needed_from)
            for t in times[:cut]:
                del events[t]
                self._dirty.pop((t, key), None)
            del times[:cut]
            if not times:
                del self.keys[key], self.times[key]
                self._prefix.pop(key, None)
            elif key in self._prefix:  # rebased on the oldest kept partial: sums stay window-sized
                self._prefix[key] = [[v - prefix[cut] for v in prefix[cut:]] for prefix in self._prefix[key]]
        self._evicted_before = needed_from

    # -- durable state ----------------------------------------------------------------------------

    def take_changes(self) -> StoreChanges:
        """Partials changed since the last call, one row per (event time, key) stored with
        start = end = its event time, and the event time before which every stored row is gone
        (eviction is by event time: one range delete)."""
        upserts = [StoredGroup(t, t, key, self.keys[key][t]) for t, key in self._dirty]
        evicted_before, self._dirty, self._evicted_before = self._evicted_before, {}, None
        return StoreChanges(upserts=upserts, deleted_before=evicted_before)

    def restore(self, groups: Iterable[StoredGroup], watermark: int | None) -> None:
        """Load partials a store returned (as :meth:`take_changes` wrote them) into empty state."""
        if self.keys:
            raise RuntimeError("restore needs an empty SlidingState")
        for t, _end, key, accs, _emitted in groups:
            self.keys.setdefault(key, {})[t] = accs
        for key, events in self.keys.items():
            self.times[key] = sorted(events)
