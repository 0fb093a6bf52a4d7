"""Which rows a batch writes, decided once for every window kind (docs/contract/windows.md, docs/contract/emission.md).

A kind's state reports, as columns, every (window, group) the batch may write a row for, with
three flags (``streaming.state.base.Report``); the row's kind follows from them alone:

- ``final``: the window is closed at the new watermark and no ``final`` or ``correction`` of it
  was written (at most one ``final`` per window and group);
- ``correction``: it changed in this batch and was emitted before, or its window had closed before
  the batch (a group whose first rows reach a closed window under ``reopen`` gets a correction,
  never a late final);
- no row otherwise (an open window waits for the watermark).

Rows that were written and no longer exist (a session merged away or moved) are retracted first,
repeating what was written. Every row is then ordered by window start and group key, whatever the
kind, so the same input always writes the same files. Eviction follows, by the kind's retention
rule.

>>> from ematix_dagster.streaming.aggregators import Count
>>> from ematix_dagster.streaming.state.fixed import FixedState
>>> from ematix_dagster.streaming.windows import FixedWindows
>>> state = FixedState("p", [Count()], ["n"], 10, FixedWindows(duration=10, hop=10))
>>> state.merge([0, 0], [("b",), ("a",)], [[1, 2]])
>>> [(row.key, row.values, row.kind) for row in emit(state, None, 10, retention=5).rows]
[(('a',), (2,), 'final'), (('b',), (1,), 'final')]
>>> state.merge([0], [("a",)], [[1]])  # reopen: a late row reaches the retained window
>>> [(row.key, row.values, row.kind) for row in emit(state, 10, 12, retention=5).rows]
[(('a',), (3,), 'correction')]
"""

from __future__ import annotations

from itertools import compress, product
from typing import TYPE_CHECKING, cast

from ematix_dagster.columns import CORRECTION, FINAL
from ematix_dagster.streaming.emitted import Emitted
from ematix_dagster.streaming.state.order import row_order

if TYPE_CHECKING:
    from ematix_dagster.streaming.state.base import KindState, Report


def _row_kind(closed: bool, emitted: bool, changed: bool) -> str | None:
    if closed and not emitted:
        return FINAL
    if emitted and changed:
        return CORRECTION
    return None


#: (closed, emitted, changed) -> the row's kind (None: no row), looked up per row at C speed
_KINDS = {flags: _row_kind(*flags) for flags in product((False, True), repeat=3)}


def row_kinds(report: Report) -> list[str | None]:
    """Each reported row's kind (None: no row this batch)."""
    return list(map(_KINDS.__getitem__, zip(report.closed, report.emitted, report.changed)))


def emit(state: KindState, before: int | None, watermark: int | None, retention: int) -> Emitted:
    """The batch's rows once W moved from ``before`` to ``watermark``, then eviction.

    Every window fires on the watermark (the only trigger so far): the report leaves out the
    changed groups of windows still open, which could write no row.
    """
    report = state.report(before, watermark, retention, open_changes=False)
    kinds = row_kinds(report)
    rows = list(compress(range(len(kinds)), kinds))
    if len(rows) == len(kinds):  # every reported row is written (a closing fixed window, sliding windows)
        starts, keys = report.starts, report.keys
        order = rows = row_order(starts, keys)
    else:
        starts = list(map(report.starts.__getitem__, rows))
        keys = list(map(report.keys.__getitem__, rows))
        order = row_order(starts, keys)
        rows = list(map(rows.__getitem__, order))
    values = state.value_columns(state.accumulators(report, rows))
    state.mark_emitted(report, rows)
    state.evict(watermark, retention)
    gone = report.gone
    out = gone.select(row_order(gone.starts, gone.keys))
    out.add_columns(list(map(starts.__getitem__, order)), list(map(report.ends.__getitem__, rows)),
                    list(map(keys.__getitem__, order)), values,
                    cast("list[str]", list(map(kinds.__getitem__, rows))))  # rows: those with a kind
    return out
