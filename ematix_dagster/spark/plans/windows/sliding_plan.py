"""Sliding windows in Spark (docs/contract/windows.md): one partial per (group key, event time) of a batch.

A row at ``x`` belongs to every window of its key ending in ``[x, x + D]``, which only the driver
knows (windows exist where the key has rows), so Spark does not assign windows: it pre-aggregates
the batch's accepted rows per (key, event time), ``_ws`` being the event time in µs, and the
driver's :class:`~ematix_dagster.streaming.kinds.sliding.sliding_state.SlidingState` derives the windows. The
late rule is :meth:`~ematix_dagster.streaming.kinds.SlidingWindows.is_late` as a column: a row is
late iff ``x + D < closed_before``. ``REOPENED`` counts the rows accepted behind the previous
watermark under ``reopen`` (they can only reach emitted windows or create one behind it).
"""

from __future__ import annotations

from typing import Callable, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ematix_dagster.columns import (
    CLASS,
    CLOSED_BEFORE,
    EMITTED_BEFORE,
    EVENT_TS,
    PRIMARY,
    REASON,
    REOPENED,
    ROWS,
    TS,
    WINDOW_START,
)
from ematix_dagster.spark.plans.windows.kind_plan import Aggregates, WindowedFrames, dead_letter_rows, with_inputs
from ematix_dagster.spec import Window
from ematix_dagster.streaming.kinds import SlidingWindows


class SlidingPlan:
    """A run's sliding plan; ``has_reason``: the rows come with a ``_reason`` column."""

    start_column = WINDOW_START
    last_column: str | None = None
    sort_by_start = True

    def __init__(self, window: Window, aggregates: Callable[[Column], Aggregates], has_reason: bool) -> None:
        duration = SlidingWindows.for_window(window).duration
        ts = F.unix_micros(EVENT_TS)
        reason = F.col(REASON) if has_reason else F.lit(None).cast("string")
        late = F.when(ts + F.lit(duration) < F.col(CLOSED_BEFORE), F.lit("late"))
        # A NULL event time out of a SQL (its input had valid ones) has no window: a class of its own.
        cls = F.coalesce(reason, F.when(ts.isNull(), F.lit("invalid_event_time")), late)
        self.assigned = [ts.alias(TS), cls.alias(CLASS), F.lit(True).alias(PRIMARY)]
        windowed = F.col(CLASS).isNull()
        hidden = [F.count_if(F.col(PRIMARY)).alias(ROWS)]
        if window.retention_ms:  # reopen, with an allowance
            hidden.append(F.count_if(windowed & (F.col(TS) < F.col(EMITTED_BEFORE))).alias(REOPENED))
        self.keys = [F.col(CLASS), F.when(windowed, F.col(TS)).alias(WINDOW_START)] + \
            [F.when(windowed, F.col(g)).alias(g) for g in window.group_by]
        found = aggregates(windowed)
        self.inputs = found.inputs
        self.aggregates = [*found.columns, *hidden]

    def frames(self, out: DataFrame, batch_id: int) -> WindowedFrames:
        # One projection (each DataFrame step is analysed on the driver, every batch).
        rows = out.select("*", *self.assigned)
        partials = with_inputs(rows, self.inputs).groupBy(*self.keys).agg(*self.aggregates)

        def class_rows(classes: Sequence[str]) -> DataFrame:
            return dead_letter_rows(rows, classes, batch_id, (TS, PRIMARY))

        return WindowedFrames(partials, class_rows, rows)
