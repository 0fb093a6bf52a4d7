"""Which rows a row pipeline's batch writes, and which it holds back (docs/contract/row-pipelines.md).

A row pipeline's batch hands the driver its SQL's output rows, each with its event time in µs
(:data:`~ematix_dagster.columns.EVENT_US`) and, under ``WATERMARK_TS()``, its release time
(:data:`~ematix_dagster.columns.RELEASE_COLUMN`, computed once in Spark by ``sql.release_plan``).
:meth:`RowEngine.process` advances the watermark W, then:

- a row whose release time is NULL is never released: it is counted (``not_released``) and dropped;
- a row whose release time W has reached (or ``RELEASE_NOW``) is written in this batch;
- any other row is held back: a :class:`~state_store.contract.PendingRow` the batch's commit inserts;
- held rows W has reached now come back from the store (``load_due``) and are written too, and
  the commit deletes every held row due by W at once.

The due rule, the cap, the output watermark and the commit's shape are the release rules every
held row follows (``streaming.release_rules``).

The batch's rows leave ordered by (release time, arrival batch, event time, values in SELECT order),
so a replay writes the same file. A held row keeps its values as the store's codec encodes them
(``encode_row``: never pickle; time values as their integers; lists, maps and structs too), its key is (release time, arrival batch, its place in that order), which a replay
of the batch recomputes exactly. Nothing here touches Spark or a file: the rules are tested alone.

>>> import pyarrow as pa
>>> from ematix_dagster.streaming.micro_batch import SourceStats
>>> eng = RowEngine(Watermarks(lateness=0, idleness=10**9, sources=("s",)), max_buffered_rows=10)
>>> rows = pa.table({"id": [1, 2, 3], EVENT_US: [5, 7, 9], RELEASE_COLUMN: [6, None, 9]})
>>> out = eng.process(RowBatch(0, 0, {"s": SourceStats(rows=3, max_event_ts=8)}, rows), lambda w: [])
>>> out.watermark, out.released.column("id").to_pylist(), out.not_released, [p.release_us for p in out.changes.inserts]
(8, [1], 1, [9])
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import count, repeat
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ematix_dagster.columns import EVENT_US, RELEASE_COLUMN
from ematix_dagster.sql.release_plan import RELEASE_NOW
from ematix_dagster.streaming.micro_batch import source_counters
from ematix_dagster.streaming.release_rules import PendingCap, PendingChanges, due
from ematix_dagster.streaming.watermark import Watermarks
from state_store.codec import decode_row, encode_row
from state_store.contract import PendingRow, output_watermark

#: the release order's hidden column besides the row's own (dropped before the target sees them)
ARRIVAL = "_arrival_batch"


@dataclass
class RowBatch:
    """What one batch of a row pipeline hands the driver (times in µs)."""

    batch_id: int
    batch_time: int
    sources: dict  # source name -> SourceStats, measured before the SQL
    rows: pa.Table  # the SQL's output rows, with EVENT_US (and RELEASE_COLUMN under WATERMARK_TS())
    filtered: int = 0  # rows an ordinary WHERE left out (counted, reason ``where``)
    dead_letters: dict[str, int] = field(default_factory=dict)  # rows written to the dead letters, by reason


@dataclass
class RowResult:
    batch_id: int
    released: pa.Table  # the SELECT's columns, in release order
    #: rows this batch holds back (inserted), and W when held rows were released now (every held
    #: row due by it is deleted)
    changes: PendingChanges
    not_released: int  # rows no branch will ever release
    watermark_before: int | None
    watermark: int | None
    pending: int  # rows held after this batch
    filtered: int = 0  # rows an ordinary WHERE left out
    #: how far the output is complete: W, or the oldest held row's event time when earlier (set
    #: after the commit, from the store: :meth:`complete_to`)
    output_watermark: int | None = None

    def complete_to(self, oldest_held: int | None) -> None:
        """Set :attr:`output_watermark` from the oldest held row's event time after the commit."""
        self.output_watermark = output_watermark(self.watermark, oldest_held)


@dataclass
class RowEngine:
    """A row pipeline's driver: its watermarks, counters and how many rows it holds back."""

    watermarks: Watermarks
    max_buffered_rows: int | None = None
    pipeline: str = ""
    #: a ``[target] key``: the rows of a key leave winner last, ordered by (event time, values), as
    #: the upserting target keeps a batch's last row of a key
    by_event_time: bool = False
    counters: Counter[str] = field(default_factory=Counter)
    last_batch_id: int | None = None
    pending: int = 0
    running: bool = False

    @property
    def cap(self) -> PendingCap:
        return PendingCap(self.pipeline, self.max_buffered_rows, "rows would be held back by WATERMARK_TS()",
                          "watermark", "raise it, or release rows sooner (a smaller delay in the WHERE)")

    def process(self, batch: RowBatch, load_due: Callable[[int], list[PendingRow]]) -> RowResult:
        """``load_due(W)``: the rows held with a release time <= W, as the store returns them."""
        if not self.running:
            self.watermarks.start_run(batch.batch_time)
            self.running = True
        before = self.watermarks.global_wm
        for name, stats in batch.sources.items():
            self.watermarks.observe(name, stats.rows, stats.max_event_ts, batch.batch_time)
        w = self.watermarks.advance(batch.batch_time)
        rows, not_released, held = batch.rows, 0, []
        columns = [n for n in rows.column_names if n not in (RELEASE_COLUMN, EVENT_US)]
        if RELEASE_COLUMN in rows.column_names:
            release = rows.column(RELEASE_COLUMN)
            not_released = release.null_count
            now, wait = due(release, w)
            held = self._hold(rows.filter(wait), columns, batch.batch_id)
            rows = rows.filter(now)
        else:
            rows = rows.append_column(RELEASE_COLUMN, pa.array([RELEASE_NOW] * rows.num_rows, pa.int64()))
        rows = rows.append_column(ARRIVAL, pa.array([batch.batch_id] * rows.num_rows, pa.int64()))
        loaded = load_due(w) if w is not None and self.pending else []
        pending = self.pending + len(held) - len(loaded)
        self.cap.check(pending, batch.batch_id, w)
        if loaded:
            rows = pa.concat_tables([_unheld(loaded, rows.schema, columns), rows.select(rows.schema.names)])
        released = _ordered(rows, columns, self.by_event_time).select(columns)
        self.pending = pending
        self.last_batch_id = batch.batch_id
        self.counters["released_rows"] += released.num_rows
        self.counters["filtered_rows:not_released"] += not_released
        self.counters["filtered_rows:where"] += batch.filtered
        self.counters.update(source_counters(batch.sources, batch.dead_letters))  # as a windowed pipeline's
        return RowResult(batch.batch_id, released, PendingChanges(held, released_up_to=w if loaded else None),
                         not_released, before, w, pending, batch.filtered)

    def _hold(self, rows: pa.Table, columns: list[str], batch_id: int) -> list[PendingRow]:
        """Rows to hold back, keyed by their place in the release order (a replay computes the same keys)."""
        if not rows.num_rows:
            return []
        ordered = _ordered(rows.append_column(ARRIVAL, pa.array([batch_id] * rows.num_rows, pa.int64())), columns)
        values = [_stored(ordered.column(c)).to_pylist() for c in columns]
        releases, events = ordered.column(RELEASE_COLUMN).to_pylist(), ordered.column(EVENT_US).to_pylist()
        return list(map(PendingRow, releases, repeat(batch_id), count(), events, map(encode_row, zip(*values))))


def _ordered(rows: pa.Table, columns: Sequence[str], by_event_time: bool = False) -> pa.Table:
    """``rows`` in release order: release time, arrival batch, event time, then the values in SELECT
    order (those Arrow can order), NULLs first as Spark orders ascending; ``by_event_time``: event
    time and values only (a keyed target's winner last)."""
    order = [EVENT_US] if by_event_time else [RELEASE_COLUMN, ARRIVAL, EVENT_US]
    keys = order + [c for c in columns if _orderable(rows.schema.field(c).type)]
    return rows.take(pc.sort_indices(rows, sort_keys=[(k, "ascending", "at_start") for k in keys]))


def _orderable(dtype: pa.DataType) -> bool:
    return not (pa.types.is_nested(dtype) or pa.types.is_dictionary(dtype))


def _storage(dtype: pa.DataType) -> pa.DataType | None:
    """The integer a time value is held as (its Arrow storage: µs, days, ...), None for other types.

    A held row keeps a timestamp as its integer, not as a ``datetime``: making and encoding a
    timezone-aware ``datetime`` per value costs more than the rest of holding a row."""
    if pa.types.is_timestamp(dtype) or pa.types.is_duration(dtype) or pa.types.is_time64(dtype) or pa.types.is_date64(dtype):
        return pa.int64()
    if pa.types.is_date32(dtype) or pa.types.is_time32(dtype):
        return pa.int32()
    return None


def _stored(column: pa.ChunkedArray) -> pa.ChunkedArray:
    storage = _storage(column.type)
    return column if storage is None else column.cast(storage)


def _restored(values: list, dtype: pa.DataType) -> pa.Array:
    storage = _storage(dtype)
    return pa.array(values, type=dtype) if storage is None else pa.array(values, type=storage).cast(dtype)


def _unheld(loaded: list[PendingRow], schema: pa.Schema, columns: Sequence[str]) -> pa.Table:
    """Held rows back as a table of ``schema`` (their values decoded, the order's columns restored)."""
    values = list(zip(*(decode_row(p.payload) for p in loaded)))
    arrays = {c: _restored(list(v), schema.field(c).type) for c, v in zip(columns, values)}
    arrays[RELEASE_COLUMN] = pa.array([p.release_us for p in loaded], pa.int64())
    arrays[EVENT_US] = pa.array([p.event_ts for p in loaded], pa.int64())
    arrays[ARRIVAL] = pa.array([p.arrival_batch for p in loaded], pa.int64())
    return pa.table([arrays[name] for name in schema.names], schema=schema)
