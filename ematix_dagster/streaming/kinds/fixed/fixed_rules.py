"""Tumbling and hopping windows: ``[start, start + duration)`` at every multiple of the hop.

A timestamp ``t`` belongs to the starts that are multiples of ``hop`` in ``(t - duration, t]``.
The tempting ``[t - D + hop, t]`` misses windows when D is not a multiple of the hop; this one does
not. A tumbling window is a hopping window whose hop is its duration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ematix_dagster.streaming.kinds.kind import KeyedByStart, WindowBounds
from ematix_dagster.streaming.kinds.time_units import MICROS_PER_MS

if TYPE_CHECKING:
    from typing import Self

    from ematix_dagster.spec import Window


def last_start(t: int, hop: int) -> int:
    """The latest window start at or before ``t``."""
    return (t // hop) * hop


def first_start(t: int, duration: int, hop: int) -> int:
    """The earliest window start whose window still contains ``t``."""
    return ((t - duration) // hop) * hop + hop


def window_starts(t: int, duration: int, hop: int) -> range:
    """Every window start whose window contains ``t``, oldest first."""
    return range(first_start(t, duration, hop), last_start(t, hop) + 1, hop)


class FixedWindows(KeyedByStart):
    """Fixed-size windows; a window is closed, final and evicted by its exclusive end."""

    def __init__(self, duration: int, hop: int) -> None:
        self.duration = duration
        self.hop = hop

    @classmethod
    def for_window(cls, window: Window) -> Self:
        assert window.duration_ms is not None  # validated
        return cls(window.duration_ms * MICROS_PER_MS, window.hop * MICROS_PER_MS)

    def bounds(self, start: int) -> WindowBounds:
        return WindowBounds(start, start + self.duration)

    def row_windows(self, t: int, closed_before: int | None) -> list[WindowBounds]:
        first = first_start(t, self.duration, self.hop)
        if closed_before is not None:  # windows ending at or before closed_before are closed
            first = max(first, first_start(closed_before, self.duration, self.hop))
        return [self.bounds(s) for s in range(first, last_start(t, self.hop) + 1, self.hop)]

    def is_final(self, window: WindowBounds, watermark: int | None) -> bool:
        return watermark is not None and window.end <= watermark

    def evicted_before(self, watermark: int | None, retention: int) -> int | None:
        """Evicted once ``end + retention <= W``: a later batch accepts no row for a window ending
        at ``W - retention`` (its end is exclusive)."""
        return None if watermark is None else watermark - retention + 1

    def expected_open_windows(self, lateness: int, retention: int) -> int:
        return -(-(self.duration + lateness + retention) // self.hop)
