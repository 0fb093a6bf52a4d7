"""When held rows leave: the release rules a row pipeline's ``WATERMARK_TS()`` and a windowed
pipeline's ``[emit] sql`` share (docs/contract/row-pipelines.md, docs/contract/delayed-windows.md).

Both give each row a release time (µs; :data:`RELEASE_NOW`; NULL: never) and hold the rows a
watermark has not reached in one pending table of the store, keyed by (release time, arrival batch,
place in the arrival batch's release order). What differs is what a row is (a SELECT's values, or
an emitted window row that a newer row of its window replaces) and so how rows are held
(``streaming.row_release``, ``streaming.emit_buffer``); the rules are written here once:

- :func:`due`: a row leaves now when its release time is :data:`RELEASE_NOW` or the watermark has
  reached it; a NULL one never leaves; any other row is held;
- :class:`PendingCap`: more rows held after a batch than ``max_buffered_rows`` fails loud;
- the order: rows leave by (release time, arrival batch, place), the pending table's key, so a
  replay writes the same rows in the same order;
- how far the output is complete (W, or the oldest held row's event time) is
  :func:`state_store.contract.output_watermark`: the store commits it with each batch;
- :class:`PendingChanges`: what a batch's commit does to the pending table.

>>> now, wait = due(pa.array([5, None, RELEASE_NOW, 9]), watermark=6)
>>> now.to_pylist(), wait.to_pylist()
([True, False, True, False], [False, False, False, True])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.sql.release_plan import RELEASE_NOW
from state_store.contract import BatchCommit, PendingRow

#: a pending row's key: (release time, arrival batch, place in its arrival batch's release order)
PendingKey = tuple[int, int, int]


def due(release: pa.Array | pa.ChunkedArray, watermark: int | None) -> tuple[pa.Array, pa.Array]:
    """(leaves now, held) for each release time; a NULL one is neither (it never leaves)."""
    reached = pc.less_equal(release, RELEASE_NOW if watermark is None else watermark)
    now = pc.fill_null(pc.or_(reached, pc.equal(release, RELEASE_NOW)), False)
    return now, pc.and_(pc.invert(now), pc.is_valid(release))


@dataclass(frozen=True)
class PendingCap:
    """``max_buffered_rows``: the most rows held back after a batch's releases."""

    pipeline: str
    max_rows: int | None
    held: str  # what holds them, in the error: "rows ... WATERMARK_TS()", "emitted rows ... [emit] sql"
    watermark: str  # the watermark's name in the error
    fix: str

    def check(self, pending: int, batch_id: int, watermark: int | None) -> None:
        if self.max_rows is not None and pending > self.max_rows:
            raise StateCapExceeded(
                f"pipeline {self.pipeline}: {pending} {self.held} after batch {batch_id}, more than "
                f"max_buffered_rows = {self.max_rows} ({self.watermark} {watermark}); {self.fix}")


@dataclass
class PendingChanges:
    """One batch's changes to the pending table, made in its store transaction: rows held (inserted),
    rows released or replaced (deleted by key), and every row due by a watermark (one range delete
    instead of a key per row)."""

    inserts: list[PendingRow] = field(default_factory=list)
    deletes: list[PendingKey] = field(default_factory=list)
    released_up_to: int | None = None

    def add_to(self, commit: BatchCommit) -> None:
        commit.pending_inserts = self.inserts
        commit.pending_released = self.deletes
        commit.pending_released_up_to = self.released_up_to
