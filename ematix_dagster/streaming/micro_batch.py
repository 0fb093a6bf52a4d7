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
from functools import cached_property
from typing import Any, Iterable, NoReturn, Sequence

from ematix_dagster.columns import CORRECTION, EARLY, FINAL, RETRACT
from ematix_dagster.errors import CorruptState
from ematix_dagster.spec import Window
from ematix_dagster.streaming.aggregators import describe_value, window_aggregators, window_aliases
from ematix_dagster.streaming.emission import emit
from ematix_dagster.streaming.emitted import Emitted, EmittedRow, GroupKey
from ematix_dagster.streaming.kinds import MICROS_PER_MS, window_kind
from ematix_dagster.streaming.kinds.kind_state import KindState, StoredColumns, StoredGroup, WrittenRow
from ematix_dagster.streaming.triggers import TriggerClock
from ematix_dagster.streaming.watermark import Watermarks
from state_store.errors import RESTORE_OR_RESET


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
    starts: Sequence[int] = ()  # window starts (sessions: each partial's first event time; sliding: its event time)
    keys: Sequence[GroupKey] = ()
    partials: Sequence[Sequence[Any]] = ()
    lasts: Sequence[int] = ()  # session windows: each partial session's last event time
    late_rows: int = 0  # rows with no open assignment (dropped / dead-lettered)
    late_assignments: int = 0  # closed assignments of rows that had open ones
    reopened_rows: int = 0  # rows that reached an already-emitted, retained window
    rejected: dict[str, int] = field(default_factory=dict)  # rows no target or store can hold, by reason
    filtered: int = 0  # rows the SQL's WHERE left out
    dead_letters: dict[str, int] = field(default_factory=dict)



def source_counters(sources: dict[str, SourceStats], dead_letters: dict[str, int]) -> dict[str, int]:
    """What each source delivered and what went to the dead letters, by the stored counters' names: the
    same for a windowed pipeline (:func:`input_counters`) and a row pipeline."""
    counters: dict[str, int] = {}
    for name, stats in sources.items():
        counters[f"rows_consumed:{name}"] = stats.rows
        counters[f"invalid_event_time_rows:{name}"] = stats.invalid
        counters[f"future_rows:{name}"] = stats.future
        counters[f"malformed_rows:{name}"] = stats.malformed
    counters.update({f"dead_letter_rows:{reason}": n for reason, n in dead_letters.items()})
    return counters


def input_counters(batch: BatchInput) -> dict[str, int]:
    """What a batch's input adds to the stored counters, by their names: one function, so that a mode
    whose windows Spark aggregates (``spark.batch.executor_input``) counts its input as the driver does."""
    counters = source_counters(batch.sources, {})
    counters["late_rows_dropped"] = batch.late_rows
    counters["late_assignments_dropped"] = batch.late_assignments
    counters["late_rows_reopened"] = batch.reopened_rows
    counters["filtered_rows:where"] = batch.filtered
    counters.update({f"rejected_rows:{reason}": n for reason, n in batch.rejected.items()})
    counters.update({f"dead_letter_rows:{reason}": n for reason, n in batch.dead_letters.items()})
    return counters

@dataclass
class BatchResult:
    batch_id: int
    emitted: Emitted
    watermark_before: int | None
    watermark: int | None
    source_watermarks: dict[str, int | None]
    idle_sources: list[str]
    windows_open: int
    groups: int
    #: the first row's ``_emit_seq``: 0, or, for the end-of-input flush, the last batch's row count
    #: (the flush's file then continues that batch's numbering)
    first_seq: int = 0

    @cached_property
    def rows(self) -> list[EmittedRow]:
        return self.emitted.rows

    @property
    def finals(self) -> int:
        return self.emitted.count(FINAL)

    @property
    def corrections(self) -> int:
        return self.emitted.count(CORRECTION)

    @property
    def early(self) -> int:
        """``early`` rows (an emit trigger fired for open windows, docs/contract/emission.md)."""
        return self.emitted.count(EARLY)

    @property
    def retractions(self) -> int:
        """``retract`` rows (session windows under reopen: keys that disappeared, docs/contract/emission.md)."""
        return self.emitted.count(RETRACT)


@dataclass
class Engine:
    """The driver's whole view of a pipeline: window state, watermarks and counters."""

    window: Window
    state: KindState
    watermarks: Watermarks
    clock: TriggerClock
    #: ``[target] retractions``: a row that supersedes a written one is preceded by its retraction
    retractions: bool = False
    counters: Counter[str] = field(default_factory=Counter)
    last_batch_id: int | None = None
    running: bool = False

    @classmethod
    def for_window(cls, pipeline: str, window: Window, sources: Sequence[str],
                   integral: Sequence[bool | None], retractions: bool = False) -> "Engine":
        """``integral[i]`` says whether aggregation i sums integers (BIGINT rules).

        ``None`` (not known without Spark's column types) is for vetting stored state only
        (``ematix-dagster check``): such a sum accepts integer, float and decimal accumulators.
        """
        state = window_kind(window).make_state(pipeline, window_aggregators(window, integral), window_aliases(window),
                                               window.groups_cap)
        state.keeps_written = state.keeps_written or retractions
        return cls(window=window, state=state, watermarks=Watermarks.of(window, sources), clock=TriggerClock(window.emit_trigger),
                   retractions=retractions)

    def restore(self, last_batch_id: int | None, watermark: int | None,
                sources: dict[str, tuple[int | None, int | None]], counters: dict[str, int],
                groups: StoredColumns | Iterable[StoredGroup], store: str | None = None, thorough: bool = False,
                written: dict[int, dict[GroupKey, WrittenRow]] | None = None,
                trigger_fired_at_us: int | None = None) -> None:
        """Continue from durable state; ``sources`` maps name -> (max event time, last arrival);
        ``written``: the rows last written per (window start, key) the state keeps; the interval
        trigger's last firing.

        The groups (as columns, as a store's segments hold them; rows are turned into columns
        once) are checked against the window's group_by and aggregations first: state that
        decodes but has another shape (another number of accumulators, a text where a count
        belongs, a pair of the wrong length, bytes that are not an HLL sketch) raises
        :class:`CorruptState` naming the pipeline, ``store``, the window, the group and what is
        wrong, and nothing is restored. The check is a few C-level scans per aggregation
        (see ``_check_groups``); ``thorough`` (``ematix-dagster check``) also opens every sketch.
        """
        columns = groups if isinstance(groups, StoredColumns) else StoredColumns.from_rows(groups)
        self._check_groups(columns, store, thorough)
        self.last_batch_id = last_batch_id
        self.watermarks.restore(watermark, sources)
        self.counters.update(counters)
        self.state.restore(columns, watermark)
        self.state.written = written or {}
        self.clock.fired_at_us = trigger_fired_at_us

    def _check_groups(self, groups: StoredColumns, store: str | None, thorough: bool) -> None:
        """Raise ``CorruptState`` for the first group whose key or accumulators do not fit the window.

        Cheap by construction (it runs on every start, for up to millions of groups): a few
        C-level scans (``map``/``set``) over the key column and each accumulator column, types
        first, then ``Aggregator.scan_contents`` for pairs and sketches. Only when a scan finds
        something are the groups made rows and walked one by one, to name the first offender.
        ``thorough`` walks every group with ``Aggregator.check_state`` (which also opens every
        HLL sketch).
        """
        if thorough:
            self._walk(groups.rows(), store, thorough)
            return
        aggs, keys = self.state.aggregators, groups.keys
        if not (not groups.ragged and len(groups.accs) == len(aggs) and set(map(type, keys)) <= {tuple}
                and set(map(len, keys)) <= {len(self.window.group_by)}
                and all(agg.scan_states(column) for agg, column in zip(aggs, groups.accs))):
            self._walk(groups.rows(), store, thorough)

    def _walk(self, groups: list[StoredGroup], store: str | None, thorough: bool) -> None:
        """Group by group: raise for the first one that does not fit (returns when none is found)."""
        aggs = self.state.aggregators
        width, key_width = len(aggs), len(self.window.group_by)
        for start, _end, key, accs, _emitted in groups:
            if len(accs) != width or type(key) is not tuple or len(key) != key_width:
                self._reject(store, start, key, accs)
            for i, (agg, acc) in enumerate(zip(aggs, accs)):
                if (agg.check_state(acc) is not None) if thorough else not agg.scan_states([acc]):
                    self._reject(store, start, key, accs, i)

    def _reject(self, store: str | None, start: int, key: Any, accs: list[Any], index: int | None = None) -> NoReturn:
        """Raise ``CorruptState`` for a restored group whose key or accumulators have the wrong shape."""
        names = list(self.state.aliases)
        group_by = list(self.window.group_by)
        if type(key) is not tuple or len(key) != len(group_by):
            problem = f"the group key does not have one value per group_by column {group_by}"
        elif len(accs) != len(names):
            problem = f"{len(accs)} accumulators are stored, but the pipeline has {len(names)} aggregations {names}"
        else:
            assert index is not None
            agg, specs = self.state.aggregators[index], self.window.aggregations
            wrong = agg.check_state(accs[index]) or f"expected {agg.expected}, got {describe_value(accs[index])}"
            what = specs[index].agg if index < len(specs) else "the emit trigger's row count"
            problem = f"aggregation {names[index]!r} ({what}): {wrong}"
        place = f"pipeline {self.state.pipeline!r}" + (f" in {store}" if store else "")
        window = repr(start) if type(start) is not int else self.state.describe(start, key)
        raise CorruptState(
            f"{place}: window {window} (window_start {start!r}), group {key!r:.200}: the stored state does not "
            f"match the pipeline's aggregations: {problem}",
            way_out=f"{RESTORE_OR_RESET} (deletes the state and the checkpoint, never the target)")

    @property
    def retention(self) -> int:
        return self.window.retention_ms * MICROS_PER_MS

    def closed_before(self) -> int | None:
        """The threshold the next batch judges lateness against (the window kind's late rule)."""
        w = self.watermarks.global_wm
        return None if w is None else w - self.retention

    def emitted_before(self) -> int | None:
        """The watermark the windows already emitted were judged final against."""
        return self.watermarks.global_wm

    def process(self, batch: BatchInput) -> BatchResult:
        if not self.running:
            self.watermarks.start_run(batch.batch_time)
            self.running = True
        before = self.watermarks.global_wm
        self.state.merge(batch.starts, batch.keys, batch.partials, batch.lasts)
        for name, stats in batch.sources.items():
            self.watermarks.observe(name, stats.rows, stats.max_event_ts, batch.batch_time)
        self.watermarks.advance(batch.batch_time)
        emitted = emit(self.state, before, self.watermarks.global_wm, self.retention, self.clock, batch.batch_time,
                       self.retractions)
        self.counters.update(input_counters(batch))
        return self._result(batch.batch_id, emitted, before, batch.batch_time)

    def flush(self, batch_id: int, batch_time: int) -> BatchResult:
        """``end_of_input = "flush"``: emit every open window and close it for good."""
        before = self.watermarks.global_wm
        flushed = self.state.flush_watermark
        if flushed is not None:
            self.watermarks.raise_to(flushed)
        emitted = emit(self.state, before, self.watermarks.global_wm, self.retention, retractions=self.retractions)
        return self._result(batch_id, emitted, before, batch_time)

    def open_windows(self) -> int:
        """Windows (sessions) not emitted yet."""
        return self.state.open_windows(self.watermarks.global_wm)

    def _result(self, batch_id: int, emitted: Emitted, before: int | None, batch_time: int) -> BatchResult:
        self.last_batch_id = batch_id
        result = BatchResult(
            batch_id=batch_id,
            emitted=emitted,
            watermark_before=before,
            watermark=self.watermarks.global_wm,
            source_watermarks=self.watermarks.source_watermarks(),
            idle_sources=[s for s in self.watermarks.sources if self.watermarks.is_idle(s, batch_time)],
            windows_open=self.state.window_count,
            groups=self.state.state_rows,
        )
        self.counters["windows_emitted"] += result.finals
        self.counters["window_corrections"] += result.corrections
        return result


def check_groups(pipeline: str, window: Window, groups: Sequence[StoredGroup],
                 store: str | None = None, integral: Sequence[bool | None] | None = None,
                 thorough: bool = False) -> None:
    """Raise ``CorruptState`` for the first decoded group that does not fit ``window`` (what
    :meth:`Engine.restore` checks), without restoring anything.

    Usable before Spark has analysed the query: with ``integral`` unknown (None), a sum accepts
    integer, float and decimal accumulators. ``thorough`` also opens every HLL sketch
    (``ematix-dagster check``).
    """
    integral = integral if integral is not None else (None,) * len(window.aggregations)
    engine = Engine.for_window(pipeline, window, (), integral)
    engine._check_groups(StoredColumns.from_rows(groups), store, thorough)
