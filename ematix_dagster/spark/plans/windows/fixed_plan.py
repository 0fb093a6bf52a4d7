"""Tumbling and hopping windows in Spark: each row's open window starts, exploded, pre-aggregated.

Lateness is decided per (row, window) against the watermark before the batch (docs/contract/windows.md): with
``closed_before`` the end at or below which windows are closed, a row's open starts are the
multiples of the hop in ``(max(t - D, closed_before - D), t]``; a row with none is late. This is
:meth:`~ematix_dagster.streaming.kinds.FixedWindows.row_windows` as column arithmetic.
"""

from __future__ import annotations

from typing import Callable, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ematix_dagster.columns import (
    CLASS,
    CLOSED_BEFORE,
    COPY_INDEX,
    EMITTED_BEFORE,
    EVENT_TS,
    FIRST,
    FIRST_OPEN,
    LAST,
    LATE_ASSIGNMENTS,
    PRIMARY,
    REASON,
    REOPENED,
    ROWS,
    SLOT,
    TS,
    WINDOW_START,
)
from ematix_dagster.spark.plans.windows.kind_plan import (
    Aggregates,
    WindowedFrames,
    class_slot,
    dead_letter_rows,
    slot_outputs,
    with_inputs,
)
from ematix_dagster.spec import Window
from ematix_dagster.streaming.kinds import FixedWindows

#: the plan's own columns, dropped from dead-letter rows
HELPERS = (TS, LAST, FIRST, FIRST_OPEN, PRIMARY, WINDOW_START, SLOT)


class FixedPlan:
    """A run's tumbling or hopping plan; ``has_reason``: the rows come with a ``_reason`` column.

    Lateness is decided here, against the batch values; a tumbling plan that leaves it to the
    driver is ``spark.plans.windows.driver_late``'s.
    """

    start_column = WINDOW_START
    last_column: str | None = None
    sort_by_start = False  # FixedState.merge sorts the starts itself: no copy of the partials table

    def __init__(self, window: Window, aggregates: Callable[[Column], Aggregates], has_reason: bool) -> None:
        kind = FixedWindows.for_window(window)
        duration, hop = kind.duration, kind.hop
        self.tumbling = hop == duration
        ts = F.unix_micros(EVENT_TS)
        # Integer arithmetic throughout (pmod is a floor modulo): doubles would misplace rows near a
        # window bound once timestamps exceed 2^53 µs.
        last = ts - F.pmod(ts, F.lit(hop))

        def first_start(t: Column) -> Column:  # streaming.kinds.first_start(t, D, hop)
            before = t - F.lit(duration)
            return before - F.pmod(before, F.lit(hop)) + F.lit(hop)

        reason = F.col(REASON) if has_reason else F.lit(None).cast("string")
        first = last if self.tumbling else first_start(ts)  # a tumbling row's only window is its last
        # NULL closed_before (no watermark yet) leaves ``first``: greatest skips NULLs
        first_open = F.greatest(first, first_start(F.col(CLOSED_BEFORE)))
        cls = F.coalesce(reason, F.when(first_open > last, F.lit("late")))
        self.assigned = [ts.alias(TS), last.alias(LAST), first.alias(FIRST), first_open.alias(FIRST_OPEN),
                         cls.alias(CLASS)]
        windowed = F.col(CLASS).isNull()
        if self.tumbling:  # a row is its only copy: assigned in the same projection
            self.assigned += [F.lit(True).alias(PRIMARY), class_slot(cls, last).alias(SLOT)]
        else:
            starts = F.when(windowed, F.sequence(F.col(FIRST_OPEN), F.col(LAST), F.lit(hop).cast("bigint"))) \
                .otherwise(F.array(F.lit(None).cast("bigint")))
            self.copies = [F.posexplode(starts).alias(COPY_INDEX, WINDOW_START)]
            self.copied = {PRIMARY: F.col(COPY_INDEX) == 0, SLOT: class_slot(F.col(CLASS), F.col(WINDOW_START))}
        counted = F.col(PRIMARY) & windowed
        hidden = [F.count_if(F.col(PRIMARY)).alias(ROWS)]
        if not self.tumbling:
            hidden.append(F.sum(F.when(counted, F.expr(f"({FIRST_OPEN} - {FIRST}) div {hop}"))).alias(LATE_ASSIGNMENTS))
        if window.late_data == "reopen":
            hidden.append(F.count_if(counted & (F.col(FIRST_OPEN) + duration <= F.col(EMITTED_BEFORE))).alias(REOPENED))
        self.keys = [F.col(SLOT)] + [F.when(windowed, F.col(g)).alias(g) for g in window.group_by]
        found = aggregates(windowed)
        self.inputs = found.inputs
        self.aggregates = [*slot_outputs(WINDOW_START), *found.columns, *hidden]

    def frames(self, out: DataFrame, batch_id: int) -> WindowedFrames:
        # As few steps as can be: each DataFrame step is analysed on the driver, every batch.
        out = rows = out.select("*", *self.assigned)
        if self.tumbling:
            rows = with_inputs(rows, self.inputs)
        else:
            rows = out.select("*", *self.copies, *self.inputs).withColumns(self.copied)
        partials = rows.groupBy(*self.keys).agg(*self.aggregates)

        def class_rows(classes: Sequence[str]) -> DataFrame:
            return dead_letter_rows(out, classes, batch_id, HELPERS)

        return WindowedFrames(partials, class_rows, out)
