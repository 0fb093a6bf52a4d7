"""Which windows a timestamp belongs to, in microseconds since the epoch (UTC).

Windows are ``[start, start + duration)``. A hopping window starts at every multiple of the hop,
so a timestamp ``t`` belongs to the starts that are multiples of ``hop`` in ``(t - duration, t]``.
Seed 000's formula (``[t - D + hop, t]``) misses windows when D is not a multiple of the hop; this
one does not.

>>> list(window_starts(125, duration=100, hop=40))
[40, 80, 120]
>>> list(window_starts(60, duration=60, hop=60))
[60]
"""

from __future__ import annotations

from datetime import datetime, timezone

MICROS_PER_MS = 1_000


def last_start(t: int, hop: int) -> int:
    """The latest window start at or before ``t``."""
    return (t // hop) * hop


def first_start(t: int, duration: int, hop: int) -> int:
    """The earliest window start whose window still contains ``t``."""
    return ((t - duration) // hop) * hop + hop


def window_starts(t: int, duration: int, hop: int) -> range:
    """Every window start whose window contains ``t``, oldest first."""
    return range(first_start(t, duration, hop), last_start(t, hop) + 1, hop)


def format_us(us: int | None) -> str:
    """ISO-8601 UTC text for a microsecond timestamp, for messages a human reads."""
    if us is None:
        return "-inf"
    dt = datetime.fromtimestamp(us / 1_000_000, tz=timezone.utc)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    frac = us % 1_000_000
    if frac:
        text += f".{frac:06d}".rstrip("0")
    return text + "Z"


def format_window(start: int, end: int) -> str:
    return f"[{format_us(start)}, {format_us(end)})"
