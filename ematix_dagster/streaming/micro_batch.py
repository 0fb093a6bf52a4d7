"""One micro-batch of the windowed transform as a pure function of (state, partials, batch time).

Spark does the row-level work (validity, lateness per (row, window), partial aggregates) and hands
the driver a :class:`BatchInput`. :meth:`Engine.process` merges it, advances the watermarks and
returns what to emit. Nothing here touches Spark, a file or the clock, which is what makes replays
deterministic and lets the rules be tested on their own.

>>> from ematix_dagster.spec import Aggregation, Window
>>> w = Window(kind="tumbling", duration_ms=60_000, max_groups_per_window=10,
...            aggregations=(Aggregation("count", "n"),), group_by=("k",))
>>> eng = Engine.for_window("p", w, sources=("s",), integral=(False,))
>>> r = eng.process(BatchInput(batch_id=0, batch_time=0,
...     sources={"s": SourceStats(rows=2, max_event_ts=120_000_000)},
...     starts=[0], keys=[("a",)], partials=[[2]]))
>>> [(row.start, row.key, row.values) for row in r.rows]
[(0, ('a',), (2,))]
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ematix_dagster.spec import Window
from ematix_dagster.streaming.aggregators import make_aggregator
from ematix_dagster.streaming.watermark import Watermarks
from ematix_dagster.streaming.window_state import EmittedRow, GroupKey, WindowState
from ematix_dagster.streaming.windows import MICROS_PER_MS


@dataclass
class SourceStats:
    """What one source delivered in a batch, measured before the SQL."""

    rows: int = 0
    max_event_ts: int | None = None  # over rows with a valid, non-future event time
    invalid: int = 0
    future: int = 0
    malformed: int = 0


@dataclass
class BatchInput:
    """Everything the driver needs from Spark for one batch (times in microseconds)."""

    batch_id: int
    batch_time: int
    sources: dict[str, SourceStats]
    starts: Sequence[int] = ()
    keys: Sequence[GroupKey] = ()
    partials: Sequence[Sequence[Any]] = ()
    late_rows: int = 0  # rows with no open assignment (dropped / dead-lettered)
    late_assignments: int = 0  # closed assignments of rows that had open ones
    reopened_rows: int = 0  # rows that reached an already-emitted, retained window
    dead_letters: dict[str, int] = field(default_factory=dict)


@dataclass
class BatchResult:
    batch_id: int
    rows: list[EmittedRow]
    watermark_before: int | None
    watermark: int | None
    source_watermarks: dict[str, int | None]
    idle_sources: list[str]
    windows_open: int
    groups: int

    @property
    def finals(self) -> int:
        return sum(1 for r in self.rows if r.kind == "final")

    @property
    def corrections(self) -> int:
        return sum(1 for r in self.rows if r.kind == "correction")


@dataclass
class Engine:
    """The driver's whole view of a pipeline: window state, watermarks and counters."""

    window: Window
    state: WindowState
    watermarks: Watermarks
    counters: Counter[str] = field(default_factory=Counter)
    last_batch_id: int | None = None
    running: bool = False

    @classmethod
    def for_window(cls, pipeline: str, window: Window, sources: Sequence[str], integral: Sequence[bool]) -> "Engine":
        """``integral[i]`` says whether aggregation i sums integers (BIGINT rules)."""
        aggs = [make_aggregator(a, integral[i], window.hll_precision) for i, a in enumerate(window.aggregations)]
        state = WindowState(
            pipeline=pipeline,
            duration=window.duration_ms * MICROS_PER_MS,
            aggregators=aggs,
            aliases=[a.as_ for a in window.aggregations],
            max_groups_per_window=window.max_groups_per_window,
        )
        marks = Watermarks(
            lateness=window.lateness_ms * MICROS_PER_MS,
            idleness=window.source_idleness_ms * MICROS_PER_MS,
            sources=tuple(sources),
            processing_time=window.time_mode == "processing",
        )
        return cls(window=window, state=state, watermarks=marks)

    def restore(self, last_batch_id: int | None, watermark: int | None,
                sources: dict[str, tuple[int | None, int | None]], counters: dict[str, int], emitted: Iterable[int],
                groups: Iterable[tuple[int, GroupKey, list[Any]]]) -> None:
        """Continue from durable state; ``sources`` maps name -> (max event time, last arrival)."""
        self.last_batch_id = last_batch_id
        self.watermarks.global_wm = watermark
        for name, (max_ts, last_arrival) in sources.items():
            if name in self.watermarks.clocks:
                clock = self.watermarks.clocks[name]
                clock.max_event_ts, clock.last_arrival = max_ts, last_arrival
        self.counters.update(counters)
        for start, key, accs in groups:
            self.state.windows.setdefault(start, {})[key] = accs
        self.state.emitted = {s for s in emitted if s in self.state.windows}

    @property
    def retention(self) -> int:
        return self.window.retention_ms * MICROS_PER_MS

    def closed_before(self) -> int | None:
        """Assignments to windows with end <= this value are closed (late) in the next batch."""
        w = self.watermarks.global_wm
        return None if w is None else w - self.retention

    def emitted_before(self) -> int | None:
        """Windows with end <= this value have already been emitted."""
        return self.watermarks.global_wm

    def process(self, batch: BatchInput) -> BatchResult:
        if not self.running:
            self.watermarks.start_run(batch.batch_time)
            self.running = True
        before = self.watermarks.global_wm
        touched = self.state.merge(batch.starts, batch.keys, batch.partials)
        if before is not None:
            # A window whose end W had passed is emitted (closed) even if it held no rows then: rows
            # that reach it now (reopen, within allowance) make corrections, never a late "final".
            self.state.emitted.update(s for s in touched if s + self.state.duration <= before)
        for name, stats in batch.sources.items():
            self.watermarks.observe(name, stats.rows, stats.max_event_ts, batch.batch_time)
            self._count(name, stats)
        self.watermarks.advance(batch.batch_time)
        rows = self.state.emit(self.watermarks.global_wm, touched, self.retention)
        self.counters["late_rows_dropped"] += batch.late_rows
        self.counters["late_assignments_dropped"] += batch.late_assignments
        self.counters["late_rows_reopened"] += batch.reopened_rows
        for reason, n in batch.dead_letters.items():
            self.counters[f"dead_letter_rows:{reason}"] += n
        return self._result(batch.batch_id, rows, before, batch.batch_time)

    def flush(self, batch_id: int, batch_time: int) -> BatchResult:
        """``end_of_input = "flush"``: emit every open window and close it for good."""
        before = self.watermarks.global_wm
        end = self.state.max_end
        if end is not None:
            self.watermarks.raise_to(end)
        rows = self.state.emit(self.watermarks.global_wm, {}, self.retention)
        return self._result(batch_id, rows, before, batch_time)

    def _count(self, name: str, stats: SourceStats) -> None:
        self.counters[f"rows_consumed:{name}"] += stats.rows
        self.counters[f"invalid_event_time_rows:{name}"] += stats.invalid
        self.counters[f"future_rows:{name}"] += stats.future
        self.counters[f"malformed_rows:{name}"] += stats.malformed

    def _result(self, batch_id: int, rows: list[EmittedRow], before: int | None, batch_time: int) -> BatchResult:
        self.last_batch_id = batch_id
        result = BatchResult(
            batch_id=batch_id,
            rows=rows,
            watermark_before=before,
            watermark=self.watermarks.global_wm,
            source_watermarks=self.watermarks.source_watermarks(),
            idle_sources=[s for s in self.watermarks.sources if self.watermarks.is_idle(s, batch_time)],
            windows_open=len(self.state.windows),
            groups=self.state.group_count,
        )
        self.counters["windows_emitted"] += result.finals
        self.counters["window_corrections"] += result.corrections
        return result
