"""Tumbling and hopping windows: ``[start, start + duration)`` at every multiple of the hop.

A timestamp ``t`` belongs to the starts that are multiples of ``hop`` in ``(t - duration, t]``.
The tempting ``[t - D + hop, t]`` misses windows when D is not a multiple of the hop; this one does
not. A tumbling window is a hopping window whose hop is its duration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ematix_dagster.spec.rules import _fail, _positive
from ematix_dagster.streaming.state.fixed import FixedState
from ematix_dagster.streaming.windows.base import KeyedByStart, WindowBounds
from ematix_dagster.streaming.windows.units import MICROS_PER_MS, format_span_ms

if TYPE_CHECKING:
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

    state_class = FixedState

    def __init__(self, duration: int, hop: int) -> None:
        self.duration = duration
        self.hop = hop

    @classmethod
    def for_window(cls, window: Window) -> FixedWindows:
        assert window.duration_ms is not None  # validated
        return cls(window.duration_ms * MICROS_PER_MS, window.hop * MICROS_PER_MS)

    @classmethod
    def validate(cls, window: Window, key: str) -> None:
        window.validate_duration(key, "the window's length")
        assert window.duration_ms is not None
        if window.kind == "hopping":
            if window.hop_ms is None:
                _fail(f"{key}.hop_ms", "is required for hopping windows",
                      "set hop_ms (the distance between window starts), <= duration_ms")
            _positive(f"{key}.hop_ms", window.hop_ms)
            if window.hop_ms > window.duration_ms:
                _fail(f"{key}.hop_ms", f"{window.hop_ms} is larger than duration_ms={window.duration_ms}",
                      "use hop_ms <= duration_ms (gaps between windows would drop rows)")
        elif window.hop_ms is not None:
            _fail(f"{key}.hop_ms", f"hop_ms = {window.hop_ms!r} only applies to hopping windows, not {window.kind!r}",
                  'remove it or use kind = "hopping"')

    @classmethod
    def shape(cls, window: Window) -> str:
        assert window.duration_ms is not None
        every = f" every {format_span_ms(window.hop)}" if window.kind == "hopping" else ""
        return f"{window.kind} windows of {format_span_ms(window.duration_ms)}{every}"

    @classmethod
    def fingerprint(cls, window: Window) -> dict[str, Any]:
        return {"window.duration_ms": window.duration_ms, "window.hop_ms": window.hop_ms}

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
