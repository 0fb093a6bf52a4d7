"""Ground truth for ``[emit] sql`` (docs/contract/delayed-windows.md): plain Python, batch by batch, over the rows
the trigger oracle (tests/e2e/trigger_oracle.py) says each batch and each flush emit. It imports nothing from
``ematix_dagster``.

The predicate of these tests is :data:`PREDICATE`; :func:`release_time` is the same rule written by hand:
a row of group ``b`` may leave once W reaches its window start (so at once, for a closed window), a row
of any other non-NULL group one 30 s after its window's end, a row of the NULL group never.

Per batch, with WATERMARK_TS() = the batch's W (the trigger oracle's, which a flush never moves), in
emission order (retracts first, then by window start and group: the trigger oracle's order):

- a retract of a pending row of its key cancels it (neither is written); else, if no branch releases
  it, it is dropped; else it leaves at once (in a flush: it waits, at the front of the release order);
- any other row replaces the pending row of its key (dropping it), keeping its own kind, except that a
  correction replacing a pending ``final`` (or one a retract of this batch cancelled) is a ``final``;
  no branch releases it: dropped; its release time <= W (and not a flush): it leaves; else it waits;
- pending rows whose release time <= W leave (not in a flush);
- a batch writes its rows ordered by (release time, arrival batch, position in its emission), the
  retracts that leave at once first; ``_emit_seq`` numbers them from 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]
NOW = float("-inf")  # "at once": before every release time
PREDICATE = ("(k = 'b' AND window_start <= WATERMARK_TS()) OR "
             "(k <> 'b' AND window_end + INTERVAL 30 SECONDS <= WATERMARK_TS())")
DELAY_US = 30_000_000


def release_time(row: Row) -> float | None:
    if row["k"] is None:
        return None
    return row["window_start"] if row["k"] == "b" else row["window_end"] + DELAY_US


@dataclass
class EmitOracle:
    pending: dict[tuple, tuple[float, int, int, Row]] = field(default_factory=dict)
    retracts: dict[tuple, tuple[float, int, int, Row]] = field(default_factory=dict)
    not_released: int = 0

    def batch(self, batch_id: int, rows: list[Row], W: int | None, first_seq: int = 0, flush: bool = False
              ) -> list[Row]:
        now: list[tuple[float, int, int, Row]] = []
        cancelled_finals: set[tuple] = set()
        for i, row in enumerate(rows):
            key, seq, release = (row["window_start"], row["k"]), first_seq + i, release_time(row)
            if row["_emit_kind"] == "retract":
                if key in self.pending:
                    if self.pending.pop(key)[3]["_emit_kind"] == "final":
                        cancelled_finals.add(key)
                elif release is None:
                    self.not_released += 1
                elif flush:
                    self.retracts[key] = (NOW, batch_id, seq, row)
                else:
                    now.append((NOW, batch_id, seq, row))
                continue
            old = self.pending.pop(key, None)
            if row["_emit_kind"] == "correction" and ((old and old[3]["_emit_kind"] == "final")
                                                       or key in cancelled_finals):
                row = {**row, "_emit_kind": "final"}
            if release is None:
                self.not_released += 1
            elif not flush and W is not None and release <= W:
                now.append((release, batch_id, seq, row))
            else:
                self.pending[key] = (release, batch_id, seq, row)
        if not flush and W is not None:
            for held in (self.pending, self.retracts):
                for key in [k for k, (release, *_rest) in held.items() if release <= W]:
                    now.append(held.pop(key))
        return [r for *_order, r in sorted(now, key=lambda t: t[:3])]

    def smallest_pending_end(self) -> int | None:
        ends = [r["window_end"] for *_o, r in (*self.pending.values(), *self.retracts.values())]
        return min(ends) if ends else None
