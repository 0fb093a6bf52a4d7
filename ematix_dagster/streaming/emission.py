"""Which rows a batch writes, decided once for every window kind (docs/contract/windows.md, docs/contract/emission.md).

A kind's state reports, as columns, every (window, group) the batch may write a row for, with
three flags (``streaming.kinds.kind_state.Report``); at most one row per (window, group) and batch:

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
>>> from ematix_dagster.streaming.kinds.fixed.fixed_state import FixedState
>>> from ematix_dagster.streaming.kinds import FixedWindows
>>> state = FixedState("p", [Count()], ["n"], 10, FixedWindows(duration=10, hop=10), keeps_written=True)
>>> state.merge([0, 0], [("b",), ("a",)], [[1, 2]])
>>> [(row.key, row.values, row.kind) for row in emit(state, None, 10, retention=5).rows]
[(('a',), (2,), 'final'), (('b',), (1,), 'final')]
>>> state.merge([0], [("a",)], [[1]])  # reopen: a late row reaches the retained window
>>> [(row.key, row.values, row.kind) for row in emit(state, 10, 12, retention=5, retractions=True).rows]
[(('a',), (2,), 'retract'), (('a',), (3,), 'correction')]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence, cast

import numpy as np

from ematix_dagster.columns import CORRECTION, EARLY, FINAL, RETRACT
from ematix_dagster.streaming.emitted import Column, Emitted, EmittedRow, GroupKey, picked, plain
from ematix_dagster.streaming.kinds.kind_state import CLOSING, OPEN
from ematix_dagster.streaming.kinds.row_order import row_order
from state_store.int_key_column import taken

if TYPE_CHECKING:
    from ematix_dagster.streaming.kinds.kind_state import KindState, Report
    from ematix_dagster.streaming.triggers import TriggerClock


#: a reported row's kind as a code (:func:`row_kinds`), and each code's name (no row: None)
NO_ROW, FINAL_ROW, CORRECTION_ROW, EARLY_ROW = 0, 1, 2, 3
KIND_NAMES = np.array([None, FINAL, CORRECTION, EARLY], dtype=object)


def row_kinds(report: Report) -> np.ndarray:
    """Each reported row's kind code by its flags: ``final`` when its window is closed and it
    was never emitted, ``correction`` when it was emitted and changed, else no row (unless an
    early trigger fires)."""
    codes = np.zeros(len(report), np.int8)
    codes[report.closed & ~report.emitted] = FINAL_ROW
    codes[report.emitted & report.changed] = CORRECTION_ROW
    return codes


def emit(state: KindState, before: int | None, watermark: int | None, retention: int,
         clock: TriggerClock | None = None, batch_time_us: int = 0, retractions: bool = False) -> Emitted:
    """The batch's rows once W moved from ``before`` to ``watermark``, then eviction.

    ``clock`` is the emit trigger (None: the watermark's, as in the end-of-input flush, where
    every window closes); ``batch_time_us`` the batch time it fires by; ``retractions``: every
    row that supersedes a written one is preceded by its retraction. The rows stay columns from
    the report to the :class:`Emitted` (positions, flags and bounds as NumPy arrays).
    """
    scope = CLOSING if clock is None else clock.scope(batch_time_us)
    report = state.report(before, watermark, retention, scope)
    codes = row_kinds(report)
    if scope != CLOSING:
        _early(state, report, codes, cast("TriggerClock", clock), scope == OPEN)
        if scope == OPEN:
            cast("TriggerClock", clock).fired(batch_time_us)
    rows = np.flatnonzero(codes)
    every = len(rows) == len(codes)  # every reported row is written (a closing fixed window, sliding windows)
    starts = report.starts if every else report.starts[rows]
    keys = report.keys if every else taken(report.keys, rows)
    order = row_order(starts, keys)
    if not isinstance(order, range):  # not in order already (sliding windows, sessions mostly are)
        at = np.asarray(order, dtype=np.int64)
        rows, starts, keys = rows[at], starts[at], taken(keys, at)
    values = state.values(report, rows)
    written = codes[rows]
    state.mark_emitted(report, rows[written != EARLY_ROW])
    ends = report.ends[rows]
    retracts = report.gone.rows
    if retractions:
        retracts += _superseded(state, starts, keys)
    if state.keeps_written and len(rows):
        state.remember(*_kept(state, watermark, retention, starts, ends, keys, values))
        state.touch(report, rows)
    state.evict(watermark, retention)
    out = Emitted()
    if retracts:
        out.add_rows([retracts[i] for i in row_order([r.start for r in retracts], [r.key for r in retracts])])
    out.add_columns(starts, ends, keys, values, KIND_NAMES[written])
    return out


def _kept(state: KindState, watermark: int | None, retention: int, starts: np.ndarray, ends: np.ndarray,
          keys: Sequence[GroupKey], values: list[Column]) -> tuple[np.ndarray, np.ndarray, Sequence[GroupKey], list[Column]]:
    """The written rows whose windows this emission's eviction keeps: a row of an evicted window
    can never be retracted or superseded, so remembering it would make a ``written`` entry only to
    drop it again in the same batch (under ``drop``, every final session row)."""
    evicted = state.kind.evicted(ends, watermark, retention)
    if not evicted.any():
        return starts, ends, keys, values
    kept = np.flatnonzero(~evicted)
    return starts[kept], ends[kept], taken(keys, kept), [picked(column, kept) for column in values]


def _early(state: KindState, report: Report, codes: np.ndarray, clock: TriggerClock, firing: bool) -> None:
    """Give the open, never-emitted groups the trigger fires for an ``early`` row, and move the
    hidden row counts' marks where the trigger keeps them (``count``: every changed group, to
    its count at the batch's end; ``interval``, when it fires: every group it looked at)."""
    changed = report.changed
    candidates = np.flatnonzero((codes == NO_ROW) & ~report.closed & ~report.emitted)
    candidates_changed = changed[candidates].tolist()
    if clock.trigger.counts_rows:
        looked = np.arange(len(codes)) if firing else np.flatnonzero(changed)
        counts = {r: acc[-1] or (0, 0) for r, acc in zip(looked.tolist(), state.accumulators(report, looked))}
        fired = clock.fires(candidates_changed, [counts[r] for r in candidates.tolist()])
        moved = [r for r in looked.tolist() if counts[r][0] != counts[r][1]]
        state.set_marks(report, np.array(moved, np.int64), [(counts[r][0], counts[r][0]) for r in moved])
        # the changed ones are written anyway
        state.touch(report, np.array([r for r in moved if not changed[r]], np.int64))
    else:
        fired = clock.fires(candidates_changed, ())
    codes[candidates[np.array(fired, bool)]] = EARLY_ROW


def _superseded(state: KindState, starts: np.ndarray, keys: Sequence[GroupKey]) -> list[EmittedRow]:
    """The written rows the batch's rows replace, as retractions (``[target] retractions``)."""
    written = state.written
    out = []
    for start, key in zip(plain(starts), keys):
        by_key = written.get(start)
        if by_key is not None:
            row = by_key.get(key)
            if row is not None:
                out.append(EmittedRow(start, row[0], key, row[1], RETRACT))
    return out
