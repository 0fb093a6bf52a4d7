"""Which rows a batch writes, decided once for every window kind (docs/contract/windows.md, docs/contract/emission.md).

A kind's state reports, as columns, every (window, group) the batch may write a row for, with
three flags (``streaming.state.base.Report``); at most one row per (window, group) and batch:

- ``final``: the window is closed at the new watermark and no ``final`` or ``correction`` of it
  was written (at most one ``final`` per window and group);
- ``correction``: it changed in this batch and was emitted before, or its window had closed before
  the batch (a group whose first rows reach a closed window under ``reopen`` gets a correction,
  never a late final);
- ``early``: it is open, was never emitted, and the emit trigger fires for it
  (``streaming.triggers``);
- no row otherwise (an open window waits).

Rows written before whose (window start, key) no longer exists (a session merged away or moved)
are retracted first, repeating what was written; with ``retractions``, so is every row a new one
supersedes. Retractions come first, then the rows, each part ordered by window start and group key
whatever the kind, so the same input always writes the same files. Eviction follows, by the kind's
retention rule (``WindowKind.evicted_before``); the written rows are kept for a later retraction
only where that rule keeps their window, judged once here for every kind.

>>> from ematix_dagster.streaming.aggregators import Count
>>> from ematix_dagster.streaming.state.fixed import FixedState
>>> from ematix_dagster.streaming.windows import FixedWindows
>>> state = FixedState("p", [Count()], ["n"], 10, FixedWindows(duration=10, hop=10), keeps_written=True)
>>> state.merge([0, 0], [("b",), ("a",)], [[1, 2]])
>>> [(row.key, row.values, row.kind) for row in emit(state, None, 10, retention=5).rows]
[(('a',), (2,), 'final'), (('b',), (1,), 'final')]
>>> state.merge([0], [("a",)], [[1]])  # reopen: a late row reaches the retained window
>>> [(row.key, row.values, row.kind) for row in emit(state, 10, 12, retention=5, retractions=True).rows]
[(('a',), (2,), 'retract'), (('a',), (3,), 'correction')]
"""

from __future__ import annotations

from itertools import compress, product
from typing import TYPE_CHECKING, Any, Sequence, cast

import numpy as np

from ematix_dagster.columns import CORRECTION, EARLY, FINAL, RETRACT
from ematix_dagster.streaming.emitted import Emitted, EmittedRow, GroupKey
from ematix_dagster.streaming.state.base import CLOSING, OPEN
from ematix_dagster.streaming.state.columns import ints
from ematix_dagster.streaming.state.order import row_order
from state_store.int_key_column import taken

if TYPE_CHECKING:
    from ematix_dagster.streaming.state.base import KindState, Report
    from ematix_dagster.streaming.triggers import TriggerClock


def _row_kind(closed: bool, emitted: bool, changed: bool) -> str | None:
    if closed and not emitted:
        return FINAL
    if emitted and changed:
        return CORRECTION
    return None


#: (closed, emitted, changed) -> the row's kind (None: no row), looked up per row at C speed
_KINDS = {flags: _row_kind(*flags) for flags in product((False, True), repeat=3)}


def row_kinds(report: Report) -> list[str | None]:
    """Each reported row's kind by its flags (None: no row, unless an early trigger fires)."""
    return list(map(_KINDS.__getitem__, zip(report.closed, report.emitted, report.changed)))


def emit(state: KindState, before: int | None, watermark: int | None, retention: int,
         clock: TriggerClock | None = None, batch_time_us: int = 0, retractions: bool = False) -> Emitted:
    """The batch's rows once W moved from ``before`` to ``watermark``, then eviction.

    ``clock`` is the emit trigger (None: the watermark's, as in the end-of-input flush, where
    every window closes); ``batch_time_us`` the batch time it fires by; ``retractions``: every
    row that supersedes a written one is preceded by its retraction.
    """
    scope = CLOSING if clock is None else clock.scope(batch_time_us)
    report = state.report(before, watermark, retention, scope)
    kinds = row_kinds(report)
    if scope != CLOSING:
        _early(state, report, kinds, cast("TriggerClock", clock), scope == OPEN)
        if scope == OPEN:
            cast("TriggerClock", clock).fired(batch_time_us)
    rows: Sequence[int] = list(compress(range(len(kinds)), kinds))
    every = len(rows) == len(kinds)  # every reported row is written (a closing fixed window, sliding windows)
    if every:
        starts, keys = report.starts, report.keys
        order = rows = row_order(starts, keys)
    else:
        starts = list(map(report.starts.__getitem__, rows))
        keys = taken(report.keys, rows)
        order = row_order(starts, keys)
    in_order = isinstance(order, range)  # the rows were in order already (sliding windows, sessions mostly)
    as_reported = every and in_order  # the report's own rows, in its order: nothing to copy
    if not every and not in_order:
        rows = list(map(rows.__getitem__, order))
    values = state.values(report, rows)
    written_kinds = cast("list[str]", kinds if as_reported  # rows: those with a kind
                         else list(map(kinds.__getitem__, rows)))
    state.mark_emitted(report, [r for r, kind in zip(rows, written_kinds) if kind != EARLY]
                       if EARLY in written_kinds else rows)
    if not in_order:
        starts, keys = list(map(starts.__getitem__, order)), taken(keys, order)
    ends = report.ends if as_reported else list(map(report.ends.__getitem__, rows))
    retracts = report.gone.rows
    if retractions:
        retracts += _superseded(state, starts, keys)
    if state.keeps_written and rows:
        state.remember(*_kept(state, watermark, retention, starts, ends, keys, values))
        state.touch(report, rows)
    state.evict(watermark, retention)
    out = Emitted()
    if retracts:
        out.add_rows([retracts[i] for i in row_order([r.start for r in retracts], [r.key for r in retracts])])
    out.add_columns(starts, ends, keys, values, written_kinds)
    return out


def _kept(state: KindState, watermark: int | None, retention: int, starts: list[int], ends: list[int],
          keys: Sequence[GroupKey], values: list[list[Any]]
          ) -> tuple[list[int], list[int], Sequence[GroupKey], list[list[Any]]]:
    """The written rows whose windows this emission's eviction keeps: a row of an evicted window
    can never be retracted or superseded, so remembering it would make a ``written`` entry only to
    drop it again in the same batch (under ``drop``, every final session row)."""
    evicted = state.kind.evicted(ints(ends, len(ends)), watermark, retention)
    if not evicted.any():
        return starts, ends, keys, values
    kept = np.flatnonzero(~evicted).tolist()
    return (list(map(starts.__getitem__, kept)), list(map(ends.__getitem__, kept)), taken(keys, kept),
            [list(map(column.__getitem__, kept)) for column in values])


def _early(state: KindState, report: Report, kinds: list[str | None], clock: TriggerClock, firing: bool) -> None:
    """Give the open, never-emitted groups the trigger fires for an ``early`` row, and move the
    hidden row counts' marks where the trigger keeps them (``count``: every changed group, to
    its count at the batch's end; ``interval``, when it fires: every group it looked at)."""
    closed, emitted, changed = report.closed, report.emitted, report.changed
    candidates = [r for r, kind in enumerate(kinds) if kind is None and not closed[r] and not emitted[r]]
    candidates_changed = [changed[r] for r in candidates]
    if clock.trigger.counts_rows:
        looked = list(range(len(kinds))) if firing else [r for r in range(len(kinds)) if changed[r]]
        accs = state.accumulators(report, looked)
        counts = {r: acc[-1] or (0, 0) for r, acc in zip(looked, accs)}
        fired = clock.fires(candidates_changed, [counts[r] for r in candidates])
        moved = [r for r in looked if counts[r][0] != counts[r][1]]
        state.set_marks(report, moved, [(counts[r][0], counts[r][0]) for r in moved])
        state.touch(report, [r for r in moved if not changed[r]])  # the changed ones are written anyway
    else:
        fired = clock.fires(candidates_changed, ())
    for r, fires in zip(candidates, fired):
        if fires:
            kinds[r] = EARLY


def _superseded(state: KindState, starts: list[int], keys: Sequence[GroupKey]) -> list[EmittedRow]:
    """The written rows the batch's rows replace, as retractions (``[target] retractions``)."""
    written = state.written
    out = []
    for start, key in zip(starts, keys):
        by_key = written.get(start)
        if by_key is not None:
            row = by_key.get(key)
            if row is not None:
                out.append(EmittedRow(start, row[0], key, row[1], RETRACT))
    return out
