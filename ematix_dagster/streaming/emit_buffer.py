"""Which of a windowed pipeline's emitted rows leave now under ``[emit] sql``, and which wait
(docs/contract/delayed-windows.md).

The engine emits as it always does (``streaming.emission``: retracts first, then final >
correction > early, at most one non-retract row per (window, group) key); each emitted row then has a
release time, computed once from its window and group by the ``[emit]`` predicate. The buffer keeps
the rows that wait, at most one per key, and applies the ``[emit]`` rules in emission order:

- a row whose key has a pending row replaces it and takes its own release time; it keeps its kind,
  except that a ``correction`` replacing a ``final`` (never released, since it is pending) leaves
  as ``final``: the reader has seen no final of that window;
- a ``retract`` of a pending row cancels it and is not written (with ``[target] retractions`` the
  correction after it still replaces that final, so it leaves as ``final``); a ``retract`` of a
  released row leaves at once (its release time is :data:`RELEASE_NOW`, so it comes before every
  other row of the batch, its replacement included: the emission order's "retracts first");
- a row whose release time is NULL (no branch releases it) is counted and dropped, with the
  pending row it replaces; so is a retract whose own is NULL (its bounds and group are those of
  the row it retracts, which was never released either);
- rows produced by the end-of-input flush (``flush=True``) all wait, whatever their release time,
  and nothing leaves in the flush.

Rows leave in the first batch whose watermark reaches them, ordered by (release time, arrival batch,
position in the arrival batch's emission): the order the store keys pending rows by, so a replay
writes the same rows in the same order. The due rule, the cap, the output watermark and the
commit's shape are those of every held row (``streaming.release_rules``). The whole pending set is kept
here (bounded by ``max_buffered_rows``), loaded from the store once at start: replacing a row needs
it by key, which the store's release-ordered table does not index.

>>> buf = EmitBuffer("p", max_buffered_rows=10)
>>> rows = Emitted()
>>> rows.add_rows([EmittedRow(0, 60, ("a",), (3,), "final"), EmittedRow(60, 120, ("a",), (1,), "early")])
>>> out = buf.process(0, rows, pa.array([100, RELEASE_NOW]), watermark=60)
>>> [(r.start, r.kind) for r in out.released.rows], [(p.release_us, p.seq) for p in out.changes.inserts]
([(60, 'early')], [(100, 0)])
>>> fix = Emitted()
>>> fix.add_rows([EmittedRow(0, 60, ("a",), (4,), "correction")])
>>> out = buf.process(1, fix, pa.array([100]), watermark=100)
>>> [(r.values, r.kind) for r in out.released.rows], out.changes.deletes
([((4,), 'final')], [(100, 0, 0)])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import pyarrow as pa

from ematix_dagster.columns import CORRECTION, FINAL, RETRACT
from ematix_dagster.sql.release_plan import RELEASE_NOW
from ematix_dagster.streaming.emitted import Emitted, EmittedRow, GroupKey
from ematix_dagster.streaming.release_rules import PendingCap, PendingChanges, PendingKey, due
from state_store.codec import decode_key, decode_row, encode_key, encode_row
from state_store.contract import PendingRow, output_watermark

RowKey = tuple[int, GroupKey]  # (window start, group key): what a newer row of the window replaces


class Waiting(NamedTuple):
    """A pending row and its place in the release order."""

    release_us: int
    arrival_batch: int
    seq: int
    row: EmittedRow

    @property
    def key(self) -> PendingKey:
        return self.release_us, self.arrival_batch, self.seq

    def stored(self) -> PendingRow:
        """As the store keeps it (the held-row codec, as a row pipeline's held rows): its window end stands
        for its event time (the output watermark's input)."""
        row = self.row
        payload = encode_row([row.start, row.end, encode_key(row.key), row.kind, tuple(row.values)])
        return PendingRow(self.release_us, self.arrival_batch, self.seq, row.end, payload)

    @classmethod
    def loaded(cls, pending: PendingRow) -> Waiting:
        start, end, key, kind, values = decode_row(pending.payload)
        row = EmittedRow(start, end, decode_key(key), tuple(values), kind)
        return cls(pending.release_us, pending.arrival_batch, pending.seq, row)


@dataclass
class Released:
    """One batch's outcome: the rows it writes, and the pending-row changes its commit makes."""

    released: Emitted
    changes: PendingChanges  # rows held (inserted), and rows released, replaced or cancelled (deleted by key)
    not_released: int  # rows no branch releases (dropped, counted ``not_released``)
    cancelled: int  # pending rows a retract cancelled (neither is written)
    pending: int  # rows waiting after the batch
    output_watermark: int | None  # min(W, the smallest pending window end)


@dataclass
class EmitBuffer:
    """The rows ``[emit] sql`` holds back, by key (``rows``), and the pending retracts of released rows that
    a flush produced (``retracts``: they wait like the flush's other rows)."""

    pipeline: str
    max_buffered_rows: int
    rows: dict[RowKey, Waiting] = field(default_factory=dict)
    retracts: dict[RowKey, Waiting] = field(default_factory=dict)

    @property
    def cap(self) -> PendingCap:
        return PendingCap(self.pipeline, self.max_buffered_rows, "emitted rows would be held back by [emit] sql",
                          "WATERMARK_TS()", "raise it, or release rows sooner (a smaller delay in the predicate)")

    def restore(self, stored: Sequence[PendingRow]) -> None:
        """The pending rows as the store holds them (all of the pipeline's, at start)."""
        for pending in stored:
            waiting = Waiting.loaded(pending)
            target = self.retracts if waiting.row.kind == RETRACT else self.rows
            target[(waiting.row.start, waiting.row.key)] = waiting

    def process(self, batch_id: int, emitted: Emitted, release: pa.Array, watermark: int | None,
                first_seq: int = 0, flush: bool = False) -> Released:
        """``emitted``: the engine's rows in emission order; ``release``: each one's release time (int64 µs,
        :data:`RELEASE_NOW`, or NULL: never); ``watermark``: WATERMARK_TS() of the
        batch; ``first_seq``: the position of the first row in its batch's emission (a flush continues the
        last batch's numbers, so the two never share a pending key)."""
        changes = _Changes()
        now: list[Waiting] = []
        not_released = cancelled = 0
        finals_cancelled: set[RowKey] = set()  # a correction after its retract still replaces that final
        leaves = due(release, watermark)[0].to_pylist() if not flush else [False] * len(release)
        for i, (row, release_us, leaves_now) in enumerate(zip(emitted.rows, release.to_pylist(), leaves)):
            key, seq = (row.start, row.key), first_seq + i
            if row.kind == RETRACT:
                if key in self.rows:
                    target = self.rows.pop(key)
                    changes.drop(target)
                    cancelled += 1
                    if target.row.kind == FINAL:
                        finals_cancelled.add(key)
                elif release_us is None:  # it retracts a row that was never released either
                    not_released += 1
                elif flush:
                    self.retracts[key] = changes.hold(Waiting(RELEASE_NOW, batch_id, seq, row))
                else:
                    now.append(Waiting(RELEASE_NOW, batch_id, seq, row))
                continue
            old = self.rows.pop(key, None)
            if old is not None:
                changes.drop(old)
            if row.kind == CORRECTION and ((old is not None and old.row.kind == FINAL) or key in finals_cancelled):
                row = row._replace(kind=FINAL)
            if release_us is None:
                not_released += 1
            elif leaves_now:
                now.append(Waiting(release_us, batch_id, seq, row))
            else:
                self.rows[key] = changes.hold(Waiting(release_us, batch_id, seq, row))
        if not flush and watermark is not None:
            now += self._due(self.rows, watermark, changes) + self._due(self.retracts, watermark, changes)
        pending = len(self.rows) + len(self.retracts)
        self.cap.check(pending, batch_id, watermark)
        released = Emitted()
        released.add_rows(w.row for w in sorted(now, key=lambda w: w.key))
        held = PendingChanges([w.stored() for w in changes.held.values()], changes.deletes)
        return Released(released, held, not_released, cancelled, pending, self.output_watermark(watermark))

    def output_watermark(self, watermark: int | None) -> int | None:
        """How far the output is complete: W, or the smallest pending window end (a held row's event
        time) when earlier."""
        ends = [w.row.end for w in (*self.rows.values(), *self.retracts.values())]
        return output_watermark(watermark, min(ends) if ends else None)

    @staticmethod
    def _due(waiting: dict[RowKey, Waiting], watermark: int, changes: _Changes) -> list[Waiting]:
        keys = list(waiting)
        leaves = due(pa.array([waiting[key].release_us for key in keys], pa.int64()), watermark)[0].to_pylist()
        out = [waiting.pop(key) for key, leaving in zip(keys, leaves) if leaving]
        for w in out:
            changes.drop(w)
        return out


@dataclass
class _Changes:
    """The batch's pending-row changes as its commit makes them: a row held and dropped in the same batch
    never reaches the store."""

    held: dict[PendingKey, Waiting] = field(default_factory=dict)
    deletes: list[PendingKey] = field(default_factory=list)

    def hold(self, waiting: Waiting) -> Waiting:
        self.held[waiting.key] = waiting
        return waiting

    def drop(self, waiting: Waiting) -> None:
        if self.held.pop(waiting.key, None) is None:
            self.deletes.append(waiting.key)
