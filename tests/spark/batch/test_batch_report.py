"""The CLI's per-batch line (``BatchReport.progress_line``): early rows and retractions when a batch has some."""

from __future__ import annotations

import dataclasses

from ematix_dagster.spark.batch.batch_report import BatchReport, RowCounts, WindowCounts

T0_US = 1_767_225_600 * 1_000_000  # 2026-01-01T00:00:00Z


def report(early: int = 0, retractions: int = 0) -> BatchReport:
    counts = WindowCounts(windows_emitted=3, corrections=1, early_rows=early, retractions=retractions, late_rows=2,
                          state_groups=7, windows_open=2)
    return BatchReport(batch_id=4, batch_time=T0_US, rows_in=12, rows_by_source={"a": 12}, dead_letter_rows=0,
                       watermark=T0_US + 90_000_000, source_watermarks={"a": T0_US + 90_000_000}, idle_sources=[],
                       seconds=0.25, counts=counts)


def test_the_line_of_a_batch_without_early_rows_or_retractions_is_unchanged():
    assert report().progress_line("p") == ("[p] batch 4: rows in 12, windows emitted 3 (+1 corrections), "
                                           "watermark 2026-01-01T00:01:30Z, late rows 2, state groups 7, 0.25s")


def test_early_rows_and_retractions_are_shown_when_there_are_some():
    assert report(early=5, retractions=2).progress_line("p") == (
        "[p] batch 4: rows in 12, windows emitted 3 (+1 corrections), early rows 5, retractions 2, "
        "watermark 2026-01-01T00:01:30Z, late rows 2, state groups 7, 0.25s")
    only_early = report(early=8).progress_line("p")
    assert "early rows 8, watermark" in only_early and "retractions" not in only_early


def test_rows_the_sql_filtered_are_shown_when_there_are_some():
    line = dataclasses.replace(report(), filtered_rows=4).progress_line("p")
    assert line.startswith("[p] batch 4: rows in 12, filtered 4, windows emitted 3")
    rows = dataclasses.replace(report(), counts=RowCounts(released_rows=5, held_rows=1), filtered_rows=6,
                               dead_letter_rows=2).progress_line("p")
    assert rows == "[p] batch 4: rows in 12, rows out 5, held back 1, filtered 6, watermark 2026-01-01T00:01:30Z, " \
                   "dead letters 2, 0.25s"


def test_a_report_counts_only_what_its_shape_has() -> None:
    windows, rows = report(early=5), dataclasses.replace(report(), counts=RowCounts(released_rows=5, held_rows=1))
    assert (windows.count("early_rows"), windows.count("released_rows"), windows.rows_written) == (5, 0, 9)
    assert (rows.count("late_rows"), rows.count("held_rows"), rows.rows_written) == (0, 1, 5)
