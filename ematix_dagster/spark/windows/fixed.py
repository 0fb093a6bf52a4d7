"""Tumbling and hopping windows in Spark: each row's open window starts, exploded, pre-aggregated.

Lateness is decided per (row, window) against the watermark before the batch (SPEC.md §3): with
``closed_before`` the end at or below which windows are closed, a row's open starts are the
multiples of the hop in ``(max(t - D, closed_before - D), t]``; a row with none is late. This is
:meth:`~ematix_dagster.streaming.windows.FixedWindows.row_windows` as column arithmetic.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from ematix_dagster.spark.observed import Observed
from ematix_dagster.spark.windows.base import WindowedFrames
from ematix_dagster.spec import Window
from ematix_dagster.streaming.windows import FixedWindows, first_start


def plan_partials(out: DataFrame, window: Window, aggregates: list[Column], batch_id: int,
                  closed_before: int | None, emitted_before: int | None) -> WindowedFrames:
    kind = FixedWindows.for_window(window)
    duration, hop = kind.duration, kind.hop
    ts = F.unix_micros("_event_ts")
    # Integer arithmetic throughout (pmod is a floor modulo): doubles would misplace rows near a
    # window bound once timestamps exceed 2^53 µs.
    last = ts - F.pmod(ts, F.lit(hop))
    if hop == duration:  # tumbling: a row's only window
        first = last
    else:
        start_of_first = ts - F.lit(duration)
        first = start_of_first - F.pmod(start_of_first, F.lit(hop)) + F.lit(hop)
    first_open = first if closed_before is None else \
        F.greatest(first, F.lit(first_start(closed_before, duration, hop)))
    # One projection (each DataFrame step is analysed on the driver, every batch).
    out = out.select("*", ts.alias("_ts"), last.alias("_last"), first.alias("_first"), first_open.alias("_first_open"),
                     (first_open > last).alias("_late"))
    reopened = F.lit(False) if emitted_before is None or window.late_data != "reopen" else \
        (~F.col("_late")) & (F.col("_first_open") + duration <= F.lit(emitted_before))
    late_exprs = [
        F.count_if(F.col("_late")).alias("late_rows"),
        (F.lit(0) if hop == duration else
         F.coalesce(F.sum(F.when(~F.col("_late"), F.expr(f"(_first_open - _first) div {hop}"))), F.lit(0)))
        .cast("bigint").alias("late_assignments"),
        F.count_if(reopened).alias("reopened_rows"),
    ]
    late_stats = Observed(Observation(f"late_{batch_id}"), out, late_exprs)
    observed = out.observe(late_stats.observation, *late_exprs)
    on_time = observed.filter(~F.col("_late"))
    if hop == duration:
        window_start = F.col("_last").alias("_ws")
    else:
        window_start = F.col("_ws")
        on_time = on_time.select("*", F.explode(F.sequence(F.col("_first_open"), F.col("_last"),
                                                           F.lit(hop).cast("bigint"))).alias("_ws"))
    partials = on_time.groupBy(window_start, *[F.col(g) for g in window.group_by]).agg(*aggregates)

    def late_rows() -> DataFrame:
        return (out.filter(F.col("_late")).drop("_ts", "_last", "_first", "_first_open", "_late")
                .withColumn("_batch_id", F.lit(batch_id).cast("bigint")).withColumn("_reason", F.lit("late")))

    return WindowedFrames(partials, late_rows, late_stats)
