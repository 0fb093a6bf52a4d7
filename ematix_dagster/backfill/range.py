"""The range a backfill rewrites: whole partitions, the windows starting in them, the input they need.

A backfill of [a, b) rewrites every window that *starts* in it. Tumbling and hopping windows start
at multiples of the hop, so those are the starts from the first multiple at or after ``a`` to the
last one before ``b``; together they read the event times from the first start to the last
start + duration. The streaming run must be done with all of them (each window's end plus its
allowed lateness at or before the stored watermark), or the two would write the same rows.

>>> from ematix_dagster.spec import Window, Aggregation
>>> w = Window(kind="hopping", duration_ms=600_000, hop_ms=300_000, max_groups_per_window=10,
...            aggregations=(Aggregation("count", "n"),))
>>> r = BackfillRange(3_600_000_000, 7_200_000_000)
>>> [s // 60_000_000 for s in (r.first_start(w), r.last_start(w))], r.input_us(w)
([60, 115], (3600000000, 7500000000))
"""

from __future__ import annotations

from dataclasses import dataclass

from ematix_dagster.errors import BackfillRefused
from ematix_dagster.spec import PipelineSpec, Window
from ematix_dagster.spec.backfill import PARTITION_UNITS, Backfill, parse_instant
from ematix_dagster.streaming.kinds.time_units import format_us

_US_PER_MS = 1_000


@dataclass(frozen=True)
class BackfillRange:
    """[start_us, end_us): whole partitions of the pipeline's ``[backfill]``."""

    start_us: int
    end_us: int

    @classmethod
    def parse(cls, backfill: Backfill, start: str, end: str) -> "BackfillRange":
        """The range from the command line or Dagster; refused unless it is whole partitions from
        ``[backfill] start`` on."""
        a, b = parse_instant(start, "--from"), parse_instant(end, "--to")
        size = backfill.partition_us
        for name, value in (("--from", a), ("--to", b)):
            if value % size:
                raise BackfillRefused(name, f"{format_us(value)} is not the start of "
                                      f"{PARTITION_UNITS[backfill.partition]} (UTC): [backfill] partition = "
                                      f"{backfill.partition!r}",
                                      f"use {format_us(value - value % size)} or "
                                              f"{format_us(value - value % size + size)}")
        if b <= a:
            raise BackfillRefused("--to", f"the range {cls(a, b)} is empty",
                                  "give --to after --from")
        if a < backfill.start_us:
            raise BackfillRefused("--from", f"the range starts at {format_us(a)}, before [backfill] start = "
                                  f"{format_us(backfill.start_us)} (the first partition)",
                                  "backfill from the start on, or move [backfill] start back")
        return cls(a, b)

    def __str__(self) -> str:
        return f"[{format_us(self.start_us)}, {format_us(self.end_us)})"

    def partitions(self, backfill: Backfill) -> int:
        return (self.end_us - self.start_us) // backfill.partition_us

    def first_start(self, window: Window) -> int:
        hop = window.hop * _US_PER_MS
        return -(-self.start_us // hop) * hop

    def last_start(self, window: Window) -> int:
        hop = window.hop * _US_PER_MS
        return (self.end_us - 1) // hop * hop

    def has_windows(self, window: Window) -> bool:
        return self.first_start(window) <= self.last_start(window)

    def input_us(self, window: Window) -> tuple[int, int]:
        """[lo, hi): the event times the range's windows contain."""
        return self.first_start(window), self.last_start(window) + window.duration_ms * _US_PER_MS  # type: ignore[operator]

    def refuse_unless_closed(self, spec: PipelineSpec, watermark_us: int | None) -> None:
        """Refuse a range whose windows the streaming state may still change (docs/contract/backfill.md:
        a window leaves state when the watermark passes its end plus its allowed lateness)."""
        window = spec.window
        last_end = self.last_start(window) + window.duration_ms * _US_PER_MS  # type: ignore[operator]
        closed_at = last_end + window.retention_ms * _US_PER_MS
        if watermark_us is None:
            raise BackfillRefused("--from", f"pipeline {spec.pipeline_name}: the state store holds no watermark, so the "
                                  f"streaming run has not passed the range {self} yet and would write its windows too",
                                  "run the pipeline first, until its watermark is past the range")
        if closed_at > watermark_us:
            raise BackfillRefused(
                "--to", f"pipeline {spec.pipeline_name}: the streaming state still holds windows of the range {self}: "
                f"its last window ends at {format_us(last_end)}, held until {format_us(closed_at)}, and the "
                f"stored watermark is {format_us(watermark_us)}",
                "backfill an earlier range, or wait until the watermark has passed this one")


__all__ = ["BackfillRange"]
