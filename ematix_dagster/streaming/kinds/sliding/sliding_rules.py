"""Sliding windows (docs/contract/windows.md, KIP-450): one window ``[t - D, t]`` per distinct event time of a key.

Both bounds are inclusive, so a row exactly ``D`` before ``t`` is in window ``t``. Which windows
exist depends on the key's rows (a window per distinct event time), so the driver keeps each key's
time-ordered partials in :mod:`ematix_dagster.streaming.kinds.sliding.sliding_state` and this module holds the
rules that need no state. Windows and the partials they are computed from are both keyed by an
event time ``t``: ``bounds(t)`` is the window ending at ``t``. Times are microseconds since the
epoch (UTC).

>>> rules = SlidingWindows(duration=10, max_events=100)
>>> rules.bounds(25)
WindowBounds(start=15, end=25)
>>> rules.is_late(14, closed_before=25), rules.is_late(15, closed_before=25)  # 14 + 10 < 25
(True, False)
>>> rules.is_final(rules.bounds(25), watermark=25), rules.is_final(rules.bounds(25), watermark=26)
(False, True)
>>> rules.needed_from(watermark=100, retention=5)  # a window may still be created at 95: rows from 85
85
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ematix_dagster.streaming.kinds.kind import KeyedByStart, WindowBounds
from ematix_dagster.streaming.kinds.time_units import MICROS_PER_MS, format_us

if TYPE_CHECKING:
    from typing import Self

    from ematix_dagster.spec import Window


class SlidingWindows(KeyedByStart):
    """Windows ``[t - duration, t]``; ``max_events`` caps the distinct event times a key retains.

    The late rule is the window's, not the row's: a row at ``x`` counts in the windows ending in
    ``[x, x + D]``, so it is late only when the newest of them was closed before the batch
    (``x + D < closed_before``). It creates its own window only when that window is itself still
    open (``x >= closed_before``). A window is final once ``t < W`` and, under ``reopen``,
    retained until ``t + retention < W``.
    """

    held = "event times per key (max_events_per_group)"
    rows_per_key = "events"

    def __init__(self, duration: int, max_events: int) -> None:
        if duration <= 0 or max_events <= 0:
            raise ValueError(f"sliding windows need duration > 0 and max_events > 0, got {duration}, {max_events}")
        self.duration = duration
        self.max_events = max_events

    @classmethod
    def for_window(cls, window: Window) -> Self:
        assert window.duration_ms is not None and window.max_events_per_group is not None
        return cls(window.duration_ms * MICROS_PER_MS, window.max_events_per_group)

    def is_late(self, t: int, closed_before: int | None) -> bool:
        """No window the row at ``t`` belongs to can still be open or created."""
        return closed_before is not None and t + self.duration < closed_before

    def needed_from(self, watermark: int | None, retention: int) -> int | None:
        """The oldest event time a window that may still be created or changed can contain; older
        partials leave state (None: keep everything)."""
        evicted_before = self.evicted_before(watermark, retention)
        return None if evicted_before is None else evicted_before - self.duration

    # -- the WindowKind interface -----------------------------------------------------------------

    def bounds(self, start: int) -> WindowBounds:
        """The window ending at event time ``start`` (windows are keyed by their inclusive end)."""
        return WindowBounds(start - self.duration, start)

    def row_windows(self, t: int, closed_before: int | None) -> list[WindowBounds]:
        """The row's own window, or none if the row is late. Besides, the row counts in every window
        the key holds that ends in ``[t, t + D]``; its own window exists only when ``t >=
        closed_before`` (:class:`~ematix_dagster.streaming.kinds.sliding.sliding_state.SlidingState` derives that
        from the watermark)."""
        return [] if self.is_late(t, closed_before) else [self.bounds(t)]

    def is_final(self, window: WindowBounds, watermark: int | None) -> bool:
        return watermark is not None and window.end < watermark

    def evicted_before(self, watermark: int | None, retention: int) -> int | None:
        """Evicted once ``end + retention < W``: a later batch still accepts rows that count in a
        window ending at ``W - retention`` (its end is inclusive)."""
        return None if watermark is None else watermark - retention

    def expected_open_windows(self, lateness: int, retention: int) -> int:
        """A key holds at most ``max_events`` partials (one per retained event time); windows are
        computed from them, never stored."""
        return self.max_events

    def describe(self, window: WindowBounds) -> str:
        return f"[{format_us(window.start)}, {format_us(window.end)}]"  # the end is inclusive
