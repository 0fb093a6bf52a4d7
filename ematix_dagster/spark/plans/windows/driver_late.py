"""A tumbling plan whose lateness the driver decides: no batch values, no string column per row.

A tumbling row is late exactly when its window is, so Spark only groups each row by its window's
start, or by its class's code where a rule says it updates no window (``rules_slot``), and the
driver classes the closed windows' partials after the job (:func:`late_windows`). Which pipelines
may run this way is ``spark.plans.window_plan.BatchPlan.late_on_driver``'s rule. A batch that may hold rows from
the future runs the exact plan (``spark.plans.windows.fixed_plan``) instead, and dead-letter rows always come
from the exact plan's frames (``spark.batch.batch_job.build_batch``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ematix_dagster.columns import CLASS, EVENT_TS, PRIMARY, REOPENED, ROWS, SLOT, TS, WINDOW_START
from ematix_dagster.spark.batch.reasons import Rule
from ematix_dagster.spark.batch.rejects import REJECT_REASONS
from ematix_dagster.spark.plans.windows.kind_plan import (
    FIRST_WINDOW_SLOT,
    Aggregates,
    class_code,
    rules_slot,
    slot_outputs,
    with_inputs,
)
from ematix_dagster.spec import Window
from ematix_dagster.streaming.kinds import FixedWindows
from ematix_dagster.streaming.kinds.fixed.fixed_rules import first_start

#: the aggregates of a batch, given which rows update windows and which rows' event times count
#: towards their source's newest (``spark.batch.batch_columns``)
CountedAggregates = Callable[[Column, Column], Aggregates]


class DriverLatePlan:
    """A run's tumbling plan without batch values (``rules``: why a row updates no window, in order).

    Its partials are the exact plan's, except that the groups of closed windows come as windows
    (:func:`late_windows` classes them) and ``REOPENED`` is not among them.
    """

    start_column = WINDOW_START
    last_column: str | None = None
    sort_by_start = False  # FixedState.merge sorts the starts itself: no copy of the partials table

    def __init__(self, window: Window, rules: Sequence[Rule], aggregates: CountedAggregates) -> None:
        kind = FixedWindows.for_window(window)
        if kind.hop != kind.duration:
            raise ValueError("only a tumbling window's lateness is its window's")
        ts = F.unix_micros(EVENT_TS)
        start = ts - F.pmod(ts, F.lit(kind.hop))  # integer arithmetic: see spark.plans.windows.fixed_plan
        self.assigned = [ts.alias(TS), F.lit(True).alias(PRIMARY), rules_slot(rules, start).alias(SLOT)]
        slot = F.col(SLOT)
        windowed = slot >= F.lit(FIRST_WINDOW_SLOT)
        # a rejected row's event time is valid: it moves its source's watermark
        timed = windowed | slot.isin(*[class_code(r) for r in REJECT_REASONS])
        self.keys = [slot] + [F.when(windowed, F.col(g)).alias(g) for g in window.group_by]
        found = aggregates(windowed, timed)
        self.inputs = found.inputs
        self.aggregates = [*slot_outputs(WINDOW_START), *found.columns, F.count_if(F.col(PRIMARY)).alias(ROWS)]

    def partials(self, rows: DataFrame) -> DataFrame:
        """The batch's partials, class rows and hidden counters, from its source rows."""
        return with_inputs(rows.select("*", *self.assigned), self.inputs).groupBy(*self.keys).agg(*self.aggregates)


def late_windows(window: Window, table: pa.Table, closed_before: int | None,
                 emitted_before: int | None) -> pa.Table:
    """The partials of a :class:`DriverLatePlan`, classed as the exact plan would have: the groups of
    closed windows become ``late`` class rows (their partials are not merged; their rows, per source,
    count as late), and under ``reopen`` ``REOPENED`` counts the rows of windows emitted before the
    batch. Same rule as the exact plan: a row is late when its window starts before the first open
    one, ``first_start(closed_before)``.
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
