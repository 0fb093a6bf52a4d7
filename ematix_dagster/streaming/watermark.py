"""Per-source and pipeline watermarks (docs/contract/time-and-watermarks.md), driven only by batch time.

Every clock here is the batch timestamp Spark recorded in ``offsets/N``, never the wall clock, so
a replayed batch makes exactly the decisions the original made.

>>> wm = Watermarks(lateness=10, idleness=100, sources=("a", "b"))
>>> wm.start_run(batch_time=0)
>>> wm.observe("a", rows=3, max_event_ts=50, batch_time=0)
>>> wm.advance(batch_time=0) is None   # "b" was never seen and is not idle yet
True
>>> wm.observe("a", rows=1, max_event_ts=50, batch_time=101)
>>> wm.advance(batch_time=101)         # now "b" is idle (and "a" is not): W = 50 - 10
40
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ematix_dagster.spec.rules import WatermarkKeys
from ematix_dagster.streaming.kinds.time_units import MICROS_PER_MS


@dataclass
class SourceClock:
    """What the pipeline knows about one source's progress."""

    max_event_ts: int | None = None
    last_arrival: int | None = None

    def watermark(self, lateness: int) -> int | None:
        return None if self.max_event_ts is None else self.max_event_ts - lateness


@dataclass
class Watermarks:
    """Tracks ``wm_s = max(event_ts) - lateness`` per source and the monotone global ``W``."""

    lateness: int
    idleness: int
    sources: tuple[str, ...]
    processing_time: bool = False
    global_wm: int | None = None
    clocks: dict[str, SourceClock] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.sources:
            self.clocks.setdefault(name, SourceClock())

    @classmethod
    def of(cls, keys: WatermarkKeys, sources: Sequence[str]) -> Watermarks:
        """The watermarks a pipeline's keys set (a window's or a row pipeline's), in µs."""
        return cls(lateness=keys.lateness_ms * MICROS_PER_MS, idleness=keys.source_idleness_ms * MICROS_PER_MS,
                   sources=tuple(sources), processing_time=keys.time_mode == "processing")

    def restore(self, global_wm: int | None, sources: dict[str, tuple[int | None, int | None]]) -> None:
        """Continue from a commit: the global watermark and each source's (max event time, last
        arrival); a source the pipeline no longer reads is left out."""
        self.global_wm = global_wm
        for name, (max_ts, last_arrival) in sources.items():
            if name in self.clocks:
                clock = self.clocks[name]
                clock.max_event_ts, clock.last_arrival = max_ts, last_arrival

    def start_run(self, batch_time: int) -> None:
        """A (re)started query: every source counts as just arrived, so none is idle at once."""
        for clock in self.clocks.values():
            clock.last_arrival = batch_time

    def observe(self, source: str, rows: int, max_event_ts: int | None, batch_time: int) -> None:
        clock = self.clocks[source]
        if rows:
            clock.last_arrival = batch_time
        if max_event_ts is not None and (clock.max_event_ts is None or max_event_ts > clock.max_event_ts):
            clock.max_event_ts = max_event_ts

    def is_idle(self, source: str, batch_time: int) -> bool:
        last = self.clocks[source].last_arrival
        return last is not None and batch_time - last > self.idleness

    def advance(self, batch_time: int) -> int | None:
        """Move ``W`` forward (never back) and return it."""
        candidate = self.candidate(batch_time)
        if candidate is not None and (self.global_wm is None or candidate > self.global_wm):
            self.global_wm = candidate
        return self.global_wm

    def candidate(self, batch_time: int) -> int | None:
        """What the sources' progress alone puts ``W`` at now (None: held back), before ``W``'s own floor:
        ``[emit] sql`` releases by it, since a flush's :meth:`raise_to` must not move WATERMARK_TS()."""
        if self.processing_time:
            return batch_time - self.lateness
        active = [self.clocks[s].watermark(self.lateness) for s in self.sources if not self.is_idle(s, batch_time)]
        # A non-idle source that has never produced a valid row holds W back (it is -inf).
        return None if not active or any(w is None for w in active) else min(active)  # type: ignore[type-var]

    def raise_to(self, value: int) -> None:
        """Close everything up to ``value`` (``end_of_input = "flush"``)."""
        if self.global_wm is None or value > self.global_wm:
            self.global_wm = value

    def source_watermarks(self) -> dict[str, int | None]:
        return {s: self.clocks[s].watermark(self.lateness) for s in self.sources}
