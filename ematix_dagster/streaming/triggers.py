"""When an emit trigger writes a window's ``early`` row (docs/contract/emission.md).

``final`` and ``correction`` follow from a window's flags alone (``streaming.emission``); whether an
open, never-emitted group gets an ``early`` row is the trigger's call:

- ``every_batch``: every group that changed in the batch;
- ``count``: a changed group whose hidden row count crossed a multiple of N in the batch
  (``streaming.aggregators.trigger_rows``: its mark is the count at the end of the last batch);
- ``interval``: one timer per pipeline, due in the first batch whose batch time is at least the
  last firing + N (the first batch fires). Then every group changed since the last firing (its
  count passed its mark) gets a row, and the timer restarts from that batch time, even when no
  group changed. The batch time is the one recorded in ``offsets/N``, so a replay fires exactly
  as the original did; the last firing is stored with the state.

>>> clock = TriggerClock(EmitTrigger(kind="interval", interval_ms=10))
>>> clock.scope(0), clock.scope(5_000)
('open', 'open')
>>> clock.fired(0); clock.scope(5_000), clock.scope(10_000)
('closing', 'open')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ematix_dagster.spec.trigger import COUNT, EVERY_BATCH, INTERVAL, EmitTrigger
from ematix_dagster.streaming.kinds.kind_state import CHANGED, CLOSING, OPEN
from ematix_dagster.streaming.kinds.time_units import MICROS_PER_MS


@dataclass
class TriggerClock:
    """A pipeline's emit trigger and, for ``interval``, the batch time it last fired at (µs)."""

    trigger: EmitTrigger
    fired_at_us: int | None = None

    def scope(self, batch_time_us: int) -> str:
        """Which open groups the batch's report must include (``streaming.kinds.kind_state``)."""
        kind = self.trigger.kind
        if kind in (EVERY_BATCH, COUNT):
            return CHANGED
        if kind == INTERVAL and (self.fired_at_us is None
                                 or batch_time_us >= self.fired_at_us + self.interval_us):
            return OPEN
        return CLOSING

    @property
    def interval_us(self) -> int:
        return (self.trigger.interval_ms or 0) * MICROS_PER_MS

    def fired(self, batch_time_us: int) -> None:
        self.fired_at_us = batch_time_us

    def fires(self, changed: Sequence[bool], counts: Sequence[Any]) -> list[bool]:
        """Which open, never-emitted groups get an ``early`` row (``counts``: their hidden
        ``(rows, mark)``, where the trigger keeps them)."""
        kind = self.trigger.kind
        if kind == EVERY_BATCH:
            return list(changed)
        if kind == COUNT:
            n = self.trigger.count or 1
            return [c and rows // n > mark // n for c, (rows, mark) in zip(changed, counts)]
        return [rows > mark for rows, mark in counts]
