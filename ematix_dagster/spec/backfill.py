"""``[backfill]``: how a pipeline's windows of a past time range are recomputed (docs/contract/backfill.md).

A backfill rewrites every window that *starts* in a range of whole partitions (hours or days,
UTC) from archived input, beside the streaming run. The table says how the range is cut into
partitions, where the first one starts, and where each source's archive lives when it is not
the streaming path.

>>> b = Backfill(partition="daily", start="2024-01-01")
>>> b.validate(); b.partition_us, b.start_us
(86400000000, 1704067200000000)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ematix_dagster.spec.rules import _fail, _listed_as_tuple

#: partition name -> its length in µs
PARTITIONS = {"hourly": 3_600_000_000, "daily": 86_400_000_000}
#: partition name -> what one is, in messages
PARTITION_UNITS = {"hourly": "an hour", "daily": "a day"}


def parse_instant(text: str, key: str) -> int:
    """An ISO-8601 date or date-time as µs since the epoch; naive values are UTC."""
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except (TypeError, ValueError):
        _fail(key, f"{text!r} is not an ISO-8601 date or date-time",
              'write e.g. "2024-01-01" or "2024-01-01T13:00:00Z" (UTC when no offset is given)')
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    delta = parsed - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def start_datetime(us: int) -> dt.datetime:
    """µs since the epoch as a UTC ``datetime`` (Dagster's partitions start at one)."""
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)


def _text(us: int) -> str:
    """A boundary as this module's messages show it (``streaming.kinds.time_units.format_us`` is above the spec)."""
    return start_datetime(us).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class BackfillSource:
    """Where a files source's archived input lives for backfills (another path than the stream's)."""

    name: str
    path: str


@dataclass(frozen=True)
class Backfill:
    """``[backfill]``: partitions of ``partition`` length from ``start`` (UTC), and archive paths."""

    partition: str
    start: str
    sources: tuple[BackfillSource, ...] = ()

    def __post_init__(self) -> None:
        _listed_as_tuple(self, "sources")

    @property
    def partition_us(self) -> int:
        return PARTITIONS[self.partition]

    @property
    def start_us(self) -> int:
        return parse_instant(self.start, "backfill.start")

    def validate(self, key: str = "backfill") -> None:
        if self.partition not in PARTITIONS:
            _fail(f"{key}.partition", f"unknown partition {self.partition!r}",
                  " or ".join(f'"{name}"' for name in PARTITIONS))
        if self.start_us % self.partition_us:
            _fail(f"{key}.start", f"{self.start!r} is not the start of {PARTITION_UNITS[self.partition]} (UTC)",
                  f"use {_text(self.start_us - self.start_us % self.partition_us)} or a later boundary")
        names = [s.name for s in self.sources]
        for i, source in enumerate(self.sources):
            if names.index(source.name) != i:
                _fail(f"{key}.sources[{i}].name", f"{source.name!r} is named twice", "name each source once")
            if not source.path.strip():
                _fail(f"{key}.sources[{i}].path", "is empty", "give the directory holding the source's archived files")


__all__ = ["PARTITIONS", "PARTITION_UNITS", "Backfill", "BackfillSource", "parse_instant", "start_datetime"]
