"""Tumbling and hopping windows in Spark: each row's open window starts, exploded, pre-aggregated.

Lateness is decided per (row, window) against the watermark before the batch (docs/contract/windows.md): with
``closed_before`` the end at or below which windows are closed, a row's open starts are the
multiples of the hop in ``(max(t - D, closed_before - D), t]``; a row with none is late. This is
:meth:`~ematix_dagster.streaming.windows.FixedWindows.row_windows` as column arithmetic.
"""

from __future__ import annotations

from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
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
from ematix_dagster.spark.windows.base import (
    Aggregates,
    WindowedFrames,
    class_slot,
    dead_letter_rows,
    slot_outputs,
    with_inputs,
)
from ematix_dagster.spec import Window
from ematix_dagster.streaming.windows import FixedWindows
from ematix_dagster.streaming.windows.fixed import first_start

#: the plan's own columns, dropped from dead-letter rows
HELPERS = (TS, LAST, FIRST, FIRST_OPEN, PRIMARY, WINDOW_START, SLOT)


class FixedPlan:
    """A run's tumbling or hopping plan; ``has_reason``: the rows come with a ``_reason`` column.

    ``late_in_spark=False`` (tumbling only) leaves lateness to the driver (:func:`late_windows`):
    a tumbling row is late exactly when its window is, so the plan needs no batch values.
    """

    start_column = WINDOW_START
    last_column: str | None = None
    sort_by_start = True

    def __init__(self, window: Window, aggregates: Callable[[Column], Aggregates], has_reason: bool,
                 late_in_spark: bool = True) -> None:
        kind = FixedWindows.for_window(window)
        duration, hop = kind.duration, kind.hop
        self.tumbling = hop == duration
        if not (late_in_spark or self.tumbling):
            raise ValueError("only a tumbling window's lateness is its window's")
        ts = F.unix_micros(EVENT_TS)
        # Integer arithmetic throughout (pmod is a floor modulo): doubles would misplace rows near a
        # window bound once timestamps exceed 2^53 µs.
        last = ts - F.pmod(ts, F.lit(hop))

        def first_start(t: Column) -> Column:  # streaming.windows.first_start(t, D, hop)
            before = t - F.lit(duration)
            return before - F.pmod(before, F.lit(hop)) + F.lit(hop)

        reason = F.col(REASON) if has_reason else F.lit(None).cast("string")
        self.assigned = [ts.alias(TS), last.alias(LAST)]
        if late_in_spark:
            first = last if self.tumbling else first_start(ts)  # a tumbling row's only window is its last
            # NULL closed_before (no watermark yet) leaves ``first``: greatest skips NULLs
            first_open = F.greatest(first, first_start(F.col(CLOSED_BEFORE)))
            cls = F.coalesce(reason, F.when(first_open > last, F.lit("late")))
            self.assigned += [first.alias(FIRST), first_open.alias(FIRST_OPEN)]
        else:  # the driver classes the closed windows' partials (:func:`late_windows`)
            cls = reason
        self.assigned.append(cls.alias(CLASS))
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
        if window.late_data == "reopen" and late_in_spark:
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

        return WindowedFrames(partials, class_rows)


def late_windows(window: Window, table: pa.Table, closed_before: int | None,
                 emitted_before: int | None) -> pa.Table:
    """The partials of a tumbling plan made with ``late_in_spark=False``, classed as Spark would
    have: the groups of closed windows become ``late`` class rows (their partials are not merged;
    their rows, per source, count as late), and under ``reopen`` ``REOPENED`` counts the rows of
    windows emitted before the batch. Same rule as the Spark plan: a row is late when its window
    starts before the first open one, ``first_start(closed_before)``.
    """
    classes, starts = table.column(CLASS), table.column(WINDOW_START)
    assert window.duration_ms is not None  # validated
    duration = window.duration_ms * 1_000
    if closed_before is not None:
        first_open = first_start(closed_before, duration, duration)
        late = pc.fill_null(pc.less(starts, pa.scalar(first_open, pa.int64())), False)
        if pc.any(late).as_py():
            classes = pc.if_else(late, pa.scalar("late", classes.type), classes)
            table = table.set_column(table.schema.get_field_index(CLASS), CLASS, classes)
    if window.late_data == "reopen":
        emitted = pc.fill_null(pc.less_equal(pc.add(starts, duration),
                                             pa.scalar(emitted_before, pa.int64())), False) \
            if emitted_before is not None else pa.repeat(pa.scalar(False), len(table))
        reopened = pc.if_else(pc.and_(pc.is_null(classes), emitted), table.column(ROWS), 0)
        table = table.append_column(REOPENED, reopened)
    return table
