"""What one micro-batch did, for progress lines, metrics and Dagster metadata.

A report holds what every batch has (rows in, dead letters, watermarks, time) and, in ``counts``,
what the pipeline's shape wrote: windows (:class:`WindowCounts`) or rows (:class:`RowCounts`). A
report never carries the other shape's counts as zeros; a reader that sums counts over shapes asks
:meth:`BatchReport.count`, which names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Mapping

from ematix_dagster.streaming.kinds import format_us


@dataclass(frozen=True)
class WindowCounts:
    """A windowed batch's rows by kind, its late rows and the window state after it."""

    windows_emitted: int
    corrections: int
    early_rows: int
    retractions: int
    late_rows: int
    state_groups: int
    windows_open: int

    @property
    def rows_written(self) -> int:
        return self.windows_emitted + self.corrections + self.early_rows + self.retractions

    def line(self, filtered: str, watermark: str, _dead_letters: int) -> str:
        """The progress line's middle; early rows and retractions only when there are some."""
        extra = "".join(f", {label} {n}" for label, n in (("early rows", self.early_rows),
                                                          ("retractions", self.retractions)) if n)
        return (f"{filtered}, windows emitted {self.windows_emitted} (+{self.corrections} corrections){extra}, "
                f"watermark {watermark}, late rows {self.late_rows}, state groups {self.state_groups}")


@dataclass(frozen=True)
class RowCounts:
    """A row pipeline's rows written, and rows held back by WATERMARK_TS() after the batch."""

    released_rows: int
    held_rows: int

    @property
    def rows_written(self) -> int:
        return self.released_rows

    def line(self, filtered: str, watermark: str, dead_letters: int) -> str:
        return (f", rows out {self.released_rows}, held back {self.held_rows}{filtered}, watermark {watermark}, "
                f"dead letters {dead_letters}")


@dataclass(frozen=True)
class BatchReport:
    batch_id: int
    batch_time: int
    rows_in: int
    rows_by_source: dict[str, int]
    dead_letter_rows: int
    watermark: int | None
    source_watermarks: dict[str, int | None]
    idle_sources: list[str]
    seconds: float
    counts: WindowCounts | RowCounts
    #: rows the SQL left out (its WHERE; a row pipeline's never-released rows too)
    filtered_rows: int = 0
    #: the store's counters once this batch is committed (cumulative over every run): what a reader
    #: needs to tell later which committed batches no report of its own covered
    totals: Mapping[str, int] = field(default_factory=dict)

    @property
    def rows_written(self) -> int:
        """Rows the batch wrote to the target: a window's finals, corrections, early rows and
        retractions, or a row pipeline's released rows."""
        return self.counts.rows_written

    def count(self, name: str) -> int:
        """The count ``name`` of the batch's shape; 0 where the shape has none (a row pipeline's
        late rows), for readers that sum one series over every shape."""
        return int(getattr(self.counts, name)) if name in _COUNT_NAMES[type(self.counts)] else 0

    def progress_line(self, pipeline: str) -> str:
        """One line per batch (a pipeline without a WHERE prints no filtered count)."""
        filtered = f", filtered {self.filtered_rows}" if self.filtered_rows else ""
        middle = self.counts.line(filtered, format_us(self.watermark), self.dead_letter_rows)
        return f"[{pipeline}] batch {self.batch_id}: rows in {self.rows_in}{middle}, {self.seconds:.2f}s"


_COUNT_NAMES = {kind: {f.name for f in fields(kind)} for kind in (WindowCounts, RowCounts)}
