"""Time units and human-readable times: state and Spark count microseconds, specs count milliseconds."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

MICROS_PER_MS = 1_000
#: the instants Python's datetime holds (years 1..9999), µs since the epoch
DATETIME_MIN_US, DATETIME_MAX_US = -62_135_596_800_000_000, 253_402_300_799_999_999


def format_us(us: int | None) -> str:
    """ISO-8601 UTC text for a microsecond timestamp, for messages a human reads."""
    if us is None:
        return "-inf"
    if not DATETIME_MIN_US <= us <= DATETIME_MAX_US:  # years Python's datetime cannot hold
        return f"{np.datetime_as_string(np.datetime64(us, 'us'), unit='us')}Z"
    dt = datetime.fromtimestamp(us / 1_000_000, tz=timezone.utc)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    frac = us % 1_000_000
    if frac:
        text += f".{frac:06d}".rstrip("0")
    return text + "Z"


def format_window(start: int, end: int) -> str:
    return f"[{format_us(start)}, {format_us(end)})"
