"""Time units and human-readable times: state and Spark count microseconds, specs count milliseconds."""

from __future__ import annotations

from datetime import datetime, timezone

MICROS_PER_MS = 1_000


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
