"""Batch reports -> Dagster events: numeric metadata, throttling, heartbeat batches, the final result."""

from __future__ import annotations

import dataclasses

import dagster as dg

from ematix_dagster.dagster.events import EmatixEventIterator
from ematix_dagster.spark.batch.batch_report import BatchReport, RowCounts, WindowCounts

KEY = dg.AssetKey(["ematix", "t"])
T0 = 1_767_225_600  # 2026-01-01T00:00:00Z, epoch seconds


def report(batch_id: int, rows: int, emitted: int = 0, late: int = 0, watermark_s: float | None = None,
           corrections: int = 0, early: int = 0, retractions: int = 0) -> BatchReport:
    wm = None if watermark_s is None else int(watermark_s * 1_000_000)
    counts = WindowCounts(windows_emitted=emitted, corrections=corrections, early_rows=early, retractions=retractions,
                          late_rows=late, state_groups=7, windows_open=2)
    return BatchReport(batch_id=batch_id, batch_time=(T0 + batch_id) * 1_000_000, rows_in=rows,
                       rows_by_source={"a": rows - rows // 2, "b": rows // 2}, dead_letter_rows=0, watermark=wm,
                       source_watermarks={"a": wm, "b": None if wm is None else wm - 5_000_000},
                       idle_sources=["b"] if rows == 0 else [], seconds=0.25, counts=counts)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(reports, clock: Clock, throttle: float, step: float):
    """Drive the iterator, advancing the fake clock by ``step`` seconds per report."""

    def ticking():
        for r in reports:
            clock.now += step
            yield r

    return list(EmatixEventIterator(ticking(), KEY, throttle_seconds=throttle, clock=clock,
                                    wall_clock=lambda: T0 + 600.0))


def test_unthrottled_every_batch_with_data_gives_one_event_with_numeric_metadata():
    events = run([report(0, 10, emitted=0, watermark_s=T0 + 60), report(1, 4, emitted=3, late=1, watermark_s=T0 + 120),
                  report(2, 0, emitted=0, watermark_s=T0 + 120),  # heartbeat only: no event
                  report(3, 0, emitted=2, watermark_s=T0 + 180)],  # idleness closed windows: an event
                 Clock(), throttle=0, step=1.0)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["AssetObservation", "AssetMaterialization", "AssetMaterialization", "MaterializeResult"]
    second = events[1].metadata
    for name in ("batch_id", "rows_in", "windows_emitted", "late_rows", "watermark_lag_seconds", "state_groups",
                 "rows_per_second"):
        assert isinstance(second[name], (dg.IntMetadataValue, dg.FloatMetadataValue)), name
    for name in ("watermark", "watermark/a", "watermark/b"):  # shown as times, not numbers
        assert isinstance(second[name], dg.TimestampMetadataValue), name
    assert second["batch_id"].value == 1 and second["rows_in"].value == 4 and second["late_rows"].value == 1
    assert second["watermark"].value == T0 + 120
    assert second["watermark_lag_seconds"].value == 600 - 120
    assert second["watermark/b"].value == T0 + 115
    assert second["rows_per_second"].value == 4.0  # 4 rows in the 1 s since the previous event
    assert events[1].description.startswith("batch 1: 4 rows in, 3 windows emitted")
    final = events[-1].metadata
    # run totals under their own names; nothing was held back, so no per-batch counts at the end
    assert final["run_batches"] == 4 and final["run_idle_batches"] == 1 and final["run_rows_in"] == 14
    assert final["run_windows_emitted"] == 5 and final["run_late_rows"] == 1 and final["batch_id"] == 3
    assert "rows_in" not in final and "batches" not in final
    assert isinstance(final["watermark"], dg.TimestampMetadataValue)


def test_early_rows_and_retractions_are_written_rows():
    """A batch whose only rows are early ones (an emit trigger fired) or retractions wrote to the
    target: a materialization with both counts, which also reach the run's totals and the text."""
    events = run([report(0, 6, early=4, watermark_s=T0 + 30), report(1, 2, emitted=1, early=2, retractions=1),
                  report(2, 0, retractions=2),  # no rows in, yet not heartbeat-only: it retracted
                  report(3, 3)],  # read rows, wrote none
                 Clock(), throttle=0, step=1.0)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["AssetMaterialization", "AssetMaterialization", "AssetMaterialization", "AssetObservation",
                     "MaterializeResult"]
    assert [(e.metadata["early_rows"].value, e.metadata["retractions"].value) for e in events[:4]] == [
        (4, 0), (2, 1), (0, 2), (0, 0)]
    assert events[0].description == ("batch 0: 6 rows in, 0 windows emitted (+0 corrections), 4 early rows, "
                                      "0 late rows, watermark 2026-01-01T00:00:30Z")
    assert "1 windows emitted (+0 corrections), 2 early rows, 1 retractions, 0 late rows" in events[1].description
    assert "early rows" not in events[3].description and "retractions" not in events[3].description
    final = events[-1].metadata
    assert final["run_early_rows"] == 6 and final["run_retractions"] == 3 and final["run_idle_batches"] == 0


def test_row_pipeline_batches_report_rows_written_and_held_back():
    """A row pipeline's batch that wrote rows is a materialization with its released and held rows;
    one that only held rows back is an observation; the run totals the rows written."""
    def rows(batch_id: int, rows_in: int, released: int, held: int) -> BatchReport:
        return dataclasses.replace(report(batch_id, rows_in, watermark_s=T0 + batch_id),
                                   counts=RowCounts(released_rows=released, held_rows=held))

    events = run([rows(0, 5, 3, 2), rows(1, 4, 0, 6), rows(2, 0, 6, 0)], Clock(), throttle=0, step=1.0)
    assert [type(e).__name__ for e in events] == ["AssetMaterialization", "AssetObservation",
                                                   "AssetMaterialization", "MaterializeResult"]
    assert [(e.metadata["released_rows"].value, e.metadata["held_rows"].value) for e in events[:3]] == [
        (3, 2), (0, 6), (6, 0)]
    assert events[0].description.startswith("batch 0: 5 rows in, 3 rows written, 0 late rows")
    assert events[-1].metadata["run_released_rows"] == 9


def test_throttled_events_carry_the_counts_of_the_batches_in_between():
    clock = Clock()
    reports = [report(i, 10, emitted=1, late=i % 2, watermark_s=T0 + 60 * i) for i in range(10)]
    events = run(reports, clock, throttle=10.0, step=3.0)  # a batch every 3 s, an event at most every 10 s
    materializations = [e for e in events if isinstance(e, dg.AssetMaterialization)]
    # events at t=103 (first), 115, 127: batches 0, 1-4, 5-8; batch 9 only reaches the final result
    assert [m.metadata["batch_id"].value for m in materializations] == [0, 4, 8]
    assert [m.metadata["rows_in"].value for m in materializations] == [10, 40, 40]
    assert [m.metadata["windows_emitted"].value for m in materializations] == [1, 4, 4]
    assert sum(m.metadata["late_rows"].value for m in materializations) == 4
    assert materializations[1].metadata["rows_per_second"].value == 40 / 12
    final = events[-1]
    assert isinstance(final, dg.MaterializeResult)
    assert final.metadata["run_rows_in"] == 100 and final.metadata["run_late_rows"] == 5
    assert final.metadata["batch_id"] == 9
    # batch 9 was held back by the throttle: the final event reports it under the per-batch names,
    # so the per-batch series adds up to the run's totals
    assert final.metadata["batches"] == 1 and final.metadata["rows_in"] == 10
    assert sum(m.metadata["rows_in"].value for m in materializations) + final.metadata["rows_in"] == 100


def test_a_run_of_heartbeats_only_yields_just_the_final_result():
    events = run([report(i, 0) for i in range(5)], Clock(), throttle=0, step=1.0)
    assert len(events) == 1 and isinstance(events[0], dg.MaterializeResult)
    meta = events[0].metadata
    assert meta["run_rows_in"] == 0 and meta["run_batches"] == 5 and meta["run_idle_batches"] == 5
    assert "watermark" not in meta and "rows_in" not in meta


def test_heartbeat_batches_log_nothing_but_a_periodic_summary_line():
    clock, lines = Clock(), []
    # 10 minutes of one batch per second: idle, a burst of data at minute 4, idle again
    reports = [report(i, 5 if 240 <= i < 243 else 0, emitted=1 if i == 242 else 0, watermark_s=T0 + i)
               for i in range(600)]

    def ticking():
        for r in reports:
            clock.now += 1.0
            yield r

    it = EmatixEventIterator(ticking(), KEY, throttle_seconds=10.0, clock=clock, wall_clock=lambda: T0 + 900.0,
                             summary_seconds=300.0, log=lines.append, name="p")
    events = list(it)
    # events: the first data batch at once, the rest of the burst (held back by the throttle) 10 s later,
    # at a heartbeat batch; nothing for the 597 heartbeat-only batches themselves
    assert [type(e).__name__ for e in events] == ["AssetObservation", "AssetMaterialization", "MaterializeResult"]
    held = events[1].metadata
    assert held["batches"].value == 2 and held["rows_in"].value == 10 and held["batch_id"].value == 242
    assert events[1].description.startswith("batches 241-242: 10 rows in, 1 windows emitted")
    assert events[-1].metadata["run_batches"] == 600 and events[-1].metadata["run_idle_batches"] == 597
    assert "rows_in" not in events[-1].metadata
    # two summary lines in ten minutes, none per batch; each counts the heartbeat-only batches
    assert len(lines) == 2 and it.summaries_logged == 2
    assert lines[0].startswith("[p] last 5 min: 300 batches (297 heartbeat-only), 15 rows in, 1 windows emitted")
    assert lines[1].startswith("[p] last 5 min: 300 batches (300 heartbeat-only), 0 rows in")
    assert "at batch 599" in lines[1] and "lag 301 s" in lines[1]


def test_no_summary_line_without_a_logger_or_with_summary_off():
    lines = []
    list(EmatixEventIterator(iter([report(i, 0) for i in range(50)]), KEY, clock=iter(range(0, 10_000, 60)).__next__,
                             summary_seconds=0, log=lines.append))
    assert lines == []


def test_rows_the_sql_filtered_are_counted_per_event_and_for_the_run():
    """``filtered_rows``: the rows the SQL left out in the batches since the previous event, and the run's total."""
    reports = [dataclasses.replace(report(i, 10, emitted=1, watermark_s=T0 + 60 * i), filtered_rows=i) for i in range(4)]
    events = run(reports, Clock(), throttle=0, step=1.0)
    assert [e.metadata["filtered_rows"].value for e in events[:4]] == [0, 1, 2, 3]
    assert events[-1].metadata["run_filtered_rows"] == 6


def test_after_report_events_follow_each_batch_and_its_event_and_the_final_result():
    seen = []

    def after(r, event):
        seen.append((None if r is None else r.batch_id, type(event).__name__))
        yield f"after {seen[-1][0]}"

    reports = [report(0, 10, emitted=1, watermark_s=T0 + 60), report(1, 0, watermark_s=T0 + 60),
               report(2, 4, emitted=0, watermark_s=T0 + 120)]
    events = list(EmatixEventIterator(iter(reports), KEY, throttle_seconds=0, after_report=after))
    assert [e if isinstance(e, str) else type(e).__name__ for e in events] == [
        "AssetMaterialization", "after 0", "after 1", "AssetObservation", "after 2", "MaterializeResult",
        "after None"]
    # the heartbeat-only batch 1 gave no event of its own
    assert seen == [(0, "AssetMaterialization"), (1, "NoneType"), (2, "AssetObservation"),
                    (None, "MaterializeResult")]


def test_every_event_carries_the_stores_counters_after_its_last_batch():
    """What the next run needs to tell which committed batches no event covered (dagster/unreported.py)."""
    reports = [dataclasses.replace(report(i, 10, emitted=1, watermark_s=T0 + 60 * i),
                                   totals={"rows_consumed:a": 10 * (i + 1), "windows_emitted": i + 1}) for i in range(3)]
    events = run(reports, Clock(), throttle=5.0, step=1.0)  # batches 1 and 2 are held back to the final result
    assert [e.metadata["store_counters"].value for e in events] == [
        {"rows_consumed:a": 10, "windows_emitted": 1}, {"rows_consumed:a": 30, "windows_emitted": 3}]
    assert [getattr(e.metadata["batch_id"], "value", e.metadata["batch_id"]) for e in events] == [0, 2]
