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
from operator import itemgetter
from typing import Any, Iterable, NamedTuple, Sequence

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.streaming.aggregators import Aggregator, PartialRowError, merge_partials, order_key
from ematix_dagster.streaming.windows import WindowKind

GroupKey = tuple[Any, ...]


class EmittedRow(NamedTuple):
    """One output row before it becomes Arrow: window bounds, group key, finished values.

    A named tuple: a batch emits one per (window, group), often tens of thousands.
    """

    start: int
    end: int
    key: GroupKey
    values: tuple[Any, ...]
    kind: str  # "final" | "correction"


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
    if not any(v != v for key in keys for v in key):  # NaN is the only value unequal to itself
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

        Groups are found (or created, within the cap) row by row, then each aggregator merges its
        whole column of partials at once. Partials come in runs of one window start (the batch
        sorts them), so the window's dict and touched set are looked up once per run.
        """
        touched: dict[int, set[GroupKey]] = {}
        width, cap, windows = len(self.aggregators), self.max_groups_per_window, self.windows
        states: list[list[Any]] = []
        current: int | None = None
        groups: dict[GroupKey, list[Any]] = {}
        seen: set[GroupKey] = set()
        for start, key in zip(starts, keys):
            if start != current:
                current = start
                groups = windows.setdefault(start, {})
                seen = touched.setdefault(start, set())
            accs = groups.get(key)
            if accs is None:
                if len(groups) >= cap:
                    raise StateCapExceeded(
                        f"window state cap hit: max_groups_per_window={cap} reached on window "
                        f"{self.describe(start)} for pipeline {self.pipeline}"
                    )
                accs = groups[key] = [None] * width
            states.append(accs)
            seen.add(key)
        for start, keys_ in touched.items():
            self.dirty.setdefault(start, set()).update(keys_)
        try:
            merge_partials(self.aggregators, states, partials)
        except PartialRowError as failed:
            exc, start, key, alias = failed.error, starts[failed.row], keys[failed.row], self.aliases[failed.index]
            raise type(exc)(
                f"window state cap hit: {exc} on window {self.describe(start)} "
                f"group {key!r} ({alias}) for pipeline {self.pipeline}"
                if isinstance(exc, StateCapExceeded)
                else f"{exc}: {alias} on window {self.describe(start)} group {key!r} for pipeline {self.pipeline}"
            ) from None
        return touched

    def take_changes(self) -> tuple[dict[int, set[GroupKey]], list[int]]:
        """The changed groups of each held window and the windows evicted since the last call (what
        a store must write)."""
        changed = {start: keys for start, keys in self.dirty.items() if start in self.windows}
        evicted = sorted(self.evicted)
        self.dirty, self.evicted = {}, set()
        return changed, evicted

    def _rows(self, start: int, keys: Iterable[GroupKey], kind: str) -> list[EmittedRow]:
        groups = self.windows[start]
        end = self.window_kind.bounds(start).end
        ordered = sorted_keys(keys)
        states = [groups[key] for key in ordered]
        # one aggregator at a time over the window's groups, then one tuple per group
        columns = [list(map(agg.result, map(itemgetter(i), states))) for i, agg in enumerate(self.aggregators)]
        return [EmittedRow(start, end, key, values, kind) for key, values in zip(ordered, zip(*columns))]

    def emit(self, before: int | None, watermark: int | None, touched: dict[int, set[GroupKey]],
             retention: int) -> list[EmittedRow]:
        """Finals for windows that became final between the watermarks ``before`` and ``watermark``,
        corrections for windows emitted earlier (final at ``before``) and touched again; emitted
        windows are evicted by the kind's rule."""
        out: list[EmittedRow] = []
        rules = self.window_kind
        for start in sorted(self.windows):
            bounds = rules.bounds(start)
            if rules.is_final(bounds, before):
                if start in touched:
                    out.extend(self._rows(start, touched[start], "correction"))
            elif rules.is_final(bounds, watermark):
                out.extend(self._rows(start, self.windows[start].keys(), "final"))
        for start in [s for s in self.windows if rules.is_evicted(rules.bounds(s), watermark, retention)]:
            del self.windows[start]
            self.evicted.add(start)
        return out

    def open_windows(self, watermark: int | None) -> int:
        """Windows not emitted yet at ``watermark`` (retained windows under reopen were)."""
        rules = self.window_kind
        return sum(1 for start in self.windows if not rules.is_final(rules.bounds(start), watermark))
