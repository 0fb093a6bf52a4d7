"""What ``[run] window_state = "executors"`` refuses, and what behaves otherwise in it, key by key.

With window state on the executors the windowed aggregation is Spark's own stateful operator in
append mode (``spark.plans.executor_plan``): what the driver does with the window state between
batches (late corrections, early firings, idle sources, a flush at the end of the input, ``[emit]``)
has no counterpart there. ``validate`` refuses those keys (exit 2) and warns of the others, each
with its reason (docs/contract/window-state.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol

from ematix_dagster.spec.backfill import Backfill
from ematix_dagster.spec.emit import EmitRelease
from ematix_dagster.spec.run import Run
from ematix_dagster.spec.sinks import Target
from ematix_dagster.spec.sources import Source
from ematix_dagster.spec.window import Window

_KEY = "transform.window"
_DEFAULT_IDLENESS_MS = next(f.default for f in fields(Window) if f.name == "source_idleness_ms")


class RefusalInput(Protocol):
    """What the refusals read of a ``PipelineSpec`` (which validates with them)."""

    @property
    def window(self) -> Window: ...

    @property
    def sources(self) -> tuple[Source, ...]: ...

    @property
    def emit(self) -> EmitRelease | None: ...

    @property
    def run(self) -> Run: ...

    @property
    def target(self) -> Target: ...

    @property
    def backfill(self) -> Backfill | None: ...


@dataclass(frozen=True)
class Refusal:
    """A spec key this mode cannot honour (``refused``), or one that does not apply or behaves
    otherwise in it (a warning), with why: for ``validate`` to name."""

    key: str
    reason: str
    refused: bool = True


def executor_refusals(spec: RefusalInput) -> list[Refusal]:
    """What ``window_state = "executors"`` refuses or warns about for ``spec``, key by key."""
    window = spec.window
    found = [*_window_refusals(window), *_source_refusals(spec)]
    if spec.emit is not None:
        found.append(Refusal("emit", "[emit] holds a window's rows back on the driver until the watermark reaches a "
                             "time computed from them; Spark writes each window when it closes"))
    if spec.run.end_of_input == "flush":
        found.append(Refusal("run.end_of_input", '"flush" writes open windows at the end of the input; Spark writes '
                             "a window only once the watermark reaches its end"))
    if spec.window.max_groups_per_window is not None and spec.backfill is None:  # a backfill's run is the driver's
        found.append(Refusal(f"{_KEY}.max_groups_per_window", "does not apply: the windows' state is in RocksDB on "
                             "the executors, bounded by their disks, not by the driver's memory", refused=False))
    if spec.target.retractions:
        found.append(Refusal("target.retractions", "does not apply: every row is a final one, none supersedes "
                             "another", refused=False))
    return found


def _window_refusals(window: Window) -> list[Refusal]:
    found = []
    if window.kind == "sliding":
        found.append(Refusal(f"{_KEY}.kind", "sliding windows (one per distinct event time of a key) have no Spark "
                             "window function; their windows are derived from the driver's partials"))
    if window.kind == "session":
        found.append(Refusal(f"{_KEY}.kind", "session windows differ from the contract at its edges: Spark drops "
                             "a row when its own session [t, min(t + gap, cap bucket end)] ends at or before the "
                             "previous watermark, even if its batch's rows extend that session (the contract: "
                             "t < W_prev), and writes a session whose "
                             "end equals the watermark (the contract waits for end < W: a row at exactly that end "
                             "would still join)", refused=False))
    if window.late_data in ("reopen", "dlq"):
        found.append(Refusal(f"{_KEY}.late_data", f'"{window.late_data}" needs the late rows: Spark drops them inside '
                             "its state operator (no SQL function reads the watermark) and evicts a window once "
                             'written, so there is nothing to correct or dead-letter; use "drop"'))
    else:
        found.append(Refusal(f"{_KEY}.late_data", "Spark judges a batch's rows by the watermark in effect during "
                             "the batch before (its late-row watermark lags one batch) and writes a window one batch "
                             "after the driver would: a row of a window the previous batch's rows closed still counts "
                             "in it, where the driver drops it as late", refused=False))
    if window.emit_trigger.fires_early:
        found.append(Refusal(f"{_KEY}.emit_trigger", "append mode writes a window once, when the watermark "
                             'closes it: only "watermark" applies'))
    if window.time_mode != "event":
        found.append(Refusal(f"{_KEY}.time_mode", "Spark's watermark follows the rows' event times, not the "
                             "batch time the driver stamps in processing-time mode"))
    for i, agg in enumerate(window.aggregations):
        if agg.agg == "count_distinct" and agg.distinct_mode == "exact":
            found.append(Refusal(f"{_KEY}.aggregations[{i}].max_distinct_values_per_group",
                                 "is checked when the window is written, not as values arrive: the set may grow "
                                 "past it in the state store until then", refused=False))
    return found


def _source_refusals(spec: RefusalInput) -> list[Refusal]:
    found = []
    if len(spec.sources) > 1:  # refused when set to other than its default; else a warning
        found.append(Refusal(f"{_KEY}.source_idleness_ms", "Spark's min watermark has no idle sources: a source "
                             "without new rows holds every window open (and one without any row yet does not "
                             "hold them at all)", refused=spec.window.source_idleness_ms != _DEFAULT_IDLENESS_MS))
    for i, source in enumerate(spec.sources):
        if source.kind != "files":
            found.append(Refusal(f"sources[{i}].kind", f'a "{source.kind}" source cannot be read again from the '
                                 "checkpoint's offsets outside Spark's stream, and a batch's dead letters and counters "
                                 "are rebuilt that way to commit with its windows; only files sources run here"))
        elif source.skips_unreadable_files:
            found.append(Refusal(f"sources[{i}].on_unreadable_file", '"skip" needs the engine to read each batch\'s '
                                 "files itself inside foreachBatch, after Spark's stateful operator"))
        elif source.read_by_engine:
            found.append(Refusal(f"sources[{i}]", "a local parquet source is read by Spark's parquet stream here, "
                                 "not by the engine: no footer check naming a bad file, and TIMESTAMP(NANOS) "
                                 "columns are not truncated to microseconds", refused=False))
    return found
