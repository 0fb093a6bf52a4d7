"""Session windows in Spark (docs/contract/windows.md): each batch's accepted rows, sessionized per key and bucket.

A session's end depends on its rows, so no row-local arithmetic names its window (as fixed windows'
starts do): the rows of each (group key, cap bucket) are ordered by event time and a new session
starts where a row is more than ``gap`` after the previous one (``lag``, then a running ``sum`` of
the starts as the session's index). Each batch-local session becomes one partial row (first and
last event time, partial aggregates) that :meth:`~ematix_dagster.streaming.kinds.sessions.session_state.SessionState.merge`
folds into the key's open sessions, so the driver never receives raw rows. The late rule needs no
session: a row is late iff its event time is before ``closed_before`` (the previous watermark, less
the allowance under ``reopen``), which is :meth:`~ematix_dagster.streaming.kinds.SessionWindows.is_late`
as a column. Late and bad rows ride along as class rows (``ematix_dagster.spark.plans.windows.kind_plan``),
which keep their group columns only to spread the window's partitions and sessionize nothing.

``partials`` columns: ``CLASS``, the group columns, ``_bucket`` (``t // cap``) and ``_sid`` (the
session's index in its bucket, meaningless outside the batch), ``_first`` / ``_last`` (µs), the
aggregate columns and ``ROWS``; the session columns are NULL on class rows. Every row is its own
only copy (``PRIMARY`` is true), and a session has no closed assignments (no ``LATE_ASSIGNMENTS``).
``REOPENED`` counts the rows accepted behind the previous watermark under ``reopen`` (what the
allowance let in: rows that fixed windows would count for reopening an emitted window); which
sessions change after emission the driver knows from their stored ``emitted`` flag.
"""

from __future__ import annotations

from typing import Callable, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import Window as SparkWindow
from pyspark.sql import functions as F

from ematix_dagster.columns import (
    BUCKET,
    CLASS,
    CLOSED_BEFORE,
    EMITTED_BEFORE,
    EVENT_TS,
    FIRST,
    LAST,
    NEW_SESSION,
    PRIMARY,
    REASON,
    REOPENED,
    ROWS,
    SESSION_INDEX,
    TS,
)
from ematix_dagster.spark.plans.windows.kind_plan import Aggregates, WindowedFrames, dead_letter_rows
from ematix_dagster.spec import Window
from ematix_dagster.streaming.kinds.sessions.session_rules import SessionWindows

#: helper columns this plan adds to the SQL's output (dropped from dead letters)
HELPERS = (TS, BUCKET, NEW_SESSION, SESSION_INDEX, PRIMARY, CLASS)


def cap_bucket(cap: int) -> Column:
    """A row's cap bucket, ``t // cap`` (µs): rows in different buckets never join.

    Integer floor division (pmod is a floor modulo): doubles would misplace rows past 2^53 µs.
    """
    return F.expr(f"(unix_micros(`{EVENT_TS}`) - pmod(unix_micros(`{EVENT_TS}`), {cap}L)) div {cap}L")


class SessionPlan:
    """A run's session plan; ``has_reason``: the rows come with a ``_reason`` column."""

    start_column = FIRST
    last_column: str | None = LAST
    sort_by_start = False

    def __init__(self, window: Window, aggregates: Callable[[Column], Aggregates], has_reason: bool) -> None:
        rules = SessionWindows.for_window(window)
        gap, cap = rules.gap, rules.cap
        ts = F.unix_micros(EVENT_TS)
        reason = F.col(REASON) if has_reason else F.lit(None).cast("string")
        late = F.when(ts < F.col(CLOSED_BEFORE), F.lit("late"))
        # A NULL event time out of a SQL (its input had valid ones) joins no session: a class of its own.
        cls = F.coalesce(reason, F.when(ts.isNull(), F.lit("invalid_event_time")), late)
        bucket = cap_bucket(cap)
        self.assigned = [ts.alias(TS), cls.alias(CLASS), F.when(cls.isNull(), bucket).alias(BUCKET),
                         F.lit(True).alias(PRIMARY)]
        windowed = F.col(CLASS).isNull()
        # Class rows have a NULL bucket, so they never share a partition with windowed rows; their raw
        # group columns spread a backlog of late rows over many partitions instead of one.
        by_key = SparkWindow.partitionBy(F.col(CLASS), *[F.col(g) for g in window.group_by], F.col(BUCKET)) \
            .orderBy(F.col(TS))
        # consecutive rows at most gap apart join (<=)
        self.new = F.coalesce(F.col(TS) - F.lag(TS).over(by_key) > F.lit(gap), F.lit(False)).cast("int").alias(NEW_SESSION)
        self.sid = F.when(windowed, F.sum(NEW_SESSION).over(
            by_key.rowsBetween(SparkWindow.unboundedPreceding, SparkWindow.currentRow))).alias(SESSION_INDEX)
        self.keys = [F.col(CLASS)] + [F.when(windowed, F.col(g)).alias(g) for g in window.group_by] + \
            [F.col(BUCKET), F.col(SESSION_INDEX)]
        session_ts = F.when(windowed, F.col(TS))
        spans = [F.min(session_ts).alias(FIRST), F.max(session_ts).alias(LAST)]
        hidden = [F.count_if(F.col(PRIMARY)).alias(ROWS)]
        if window.retention_ms:  # reopen, with an allowance
            hidden.append(F.count_if(windowed & (F.col(TS) < F.col(EMITTED_BEFORE))).alias(REOPENED))
        found = aggregates(windowed)
        self.inputs = found.inputs
        self.aggregates = [*spans, *found.columns, *hidden]

    def frames(self, out: DataFrame, batch_id: int) -> WindowedFrames:
        # One projection per step (each DataFrame step is analysed on the driver, every batch).
        rows = out.drop(*HELPERS).select("*", *self.assigned)
        sessions = rows.select("*", self.new).select("*", self.sid, *self.inputs)
        partials = sessions.groupBy(*self.keys).agg(*self.aggregates)

        def class_rows(classes: Sequence[str]) -> DataFrame:
            return dead_letter_rows(rows, classes, batch_id, [h for h in HELPERS if h != CLASS])

        return WindowedFrames(partials, class_rows, rows)
