"""Session window state on the driver (docs/contract/windows.md): each key's open and retained sessions.

Spark sessionizes a batch's accepted rows per (key, cap bucket) into batch-local *partials*
(first and last event time, partial aggregates) and never sends raw rows. :meth:`SessionState.merge`
folds them into the key's sessions: a partial joins every session of its bucket it overlaps or
comes within ``gap`` of, bridging them into one, or opens a new session. Joining is decided by
start and end alone (a row at ``t`` joins a session iff ``start - gap <= t <= end`` in its bucket:
a capped end is the bucket end, which every later row of the bucket is within ``gap`` of), so a
restored session needs no more than the (start, end) it was stored with.

Unlike fixed windows, whether a session was emitted is stored per session: a late row under
``reopen`` can bridge an emitted session with one that is still open, and the result counts as
emitted (docs/contract/windows.md), which the watermark alone cannot tell. The last row written for
each session is kept (``StateBase.written``): when its (start, key) disappears (it merged away, or
its start moved) that row is retracted as written, whichever trigger wrote it.

Sessions are held as columns (``streaming.kinds.state_columns``), sorted by key id and start: a batch
is merged (``streaming.kinds.sessions.session_merge``), reported, evicted and committed as whole arrays,
and Python runs only over what the batch brings or emits.

>>> from ematix_dagster.streaming.aggregators import Count
>>> from ematix_dagster.streaming.emission import emit
>>> from ematix_dagster.streaming.kinds import SessionWindows
>>> state = SessionState("p", [Count()], ["n"], 10, SessionWindows(gap=10, cap=100))
>>> state.merge([0, 22], [("a",), ("a",)], [[2, 1]], lasts=[5, 22])
>>> [(s.start, s.end, s.accs) for s in state.sessions[("a",)]]
[(0, 15, [2]), (22, 32, [1])]
>>> [(row.start, row.end, row.values, row.kind) for row in emit(state, None, 35, retention=50).rows]
[(0, 15, (2,), 'final'), (22, 32, (1,), 'final')]
>>> state.merge([14], [("a",)], [[1]], lasts=[14])  # late under reopen, bridges both
>>> [(row.start, row.end, row.values, row.kind) for row in emit(state, 35, 35, retention=50).rows]
[(22, 32, (1,), 'retract'), (0, 32, (4,), 'correction')]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple, Sequence

import numpy as np

from ematix_dagster.columns import RETRACT
from ematix_dagster.streaming.aggregators import Aggregator
from ematix_dagster.streaming.emitted import EmittedRow, GroupKey
from ematix_dagster.streaming.kinds.kind_state import (
    CLOSING,
    KEY_VALUE_BYTES,
    OPEN,
    Accumulators,
    ColumnChanges,
    Report,
    StateBase,
    StoredColumns,
)
from ematix_dagster.streaming.kinds.sessions.session_merge import BatchKeys, MergePlan, batch_keys, plan_merge
from ematix_dagster.streaming.kinds.sessions.session_rules import SessionWindows
from ematix_dagster.streaming.kinds.state_columns import (
    I64,
    NOT_STORED,
    accumulator_rows,
    fold_partials,
    ints,
    objects,
    run_count,
    search_pairs,
)
from ematix_dagster.streaming.kinds.state_keys import INDEXED_KEY_BYTES, IntKeys, KeyCodes, coded

#: one held session without its accumulators: key id, start, end, stored start (8 bytes each), the
#: flags, and a slot per accumulator column (measured by ``tests/streaming/test_state_size.py``)
SESSION_ROW_BYTES = 40


class HeldSession(NamedTuple):
    """One held session as a row (:attr:`SessionState.sessions`, for messages and tests)."""

    start: int
    end: int
    accs: Accumulators
    emitted: bool


def _empty(width: int) -> dict[str, Any]:
    return {"kid": np.zeros(0, I64), "start": np.zeros(0, I64), "end": np.zeros(0, I64),
            "stored": np.zeros(0, I64), "emitted": np.zeros(0, bool), "changed": np.zeros(0, bool),
            "dirty": np.zeros(0, bool), "accs": [objects((), 0) for _ in range(width)]}


@dataclass
class SessionState(StateBase):
    """Every key's open (and, under ``reopen``, retained) sessions, as columns sorted by (key, start).

    ``max_groups_per_window`` caps the keys holding an open or retained session at once.
    ``changed``: since the last report; ``dirty``: since the last commit; ``stored``: the start a
    commit last wrote the session under (``NOT_STORED``: never).
    """

    kind: SessionWindows
    keeps_written: bool = True
    codes: KeyCodes = field(default_factory=IntKeys, repr=False)
    kid: np.ndarray = field(init=False, repr=False)
    start: np.ndarray = field(init=False, repr=False)
    end: np.ndarray = field(init=False, repr=False)
    stored: np.ndarray = field(init=False, repr=False)
    emitted: np.ndarray = field(init=False, repr=False)
    changed: np.ndarray = field(init=False, repr=False)
    dirty: np.ndarray = field(init=False, repr=False)
    #: one object column per aggregator
    accs: list[np.ndarray] = field(init=False, repr=False)
    # since the last report: the (key, start) of sessions rebuilt; since the last commit: rows to delete
    _moved: dict[tuple[GroupKey, int], None] = field(default_factory=dict, init=False, repr=False)
    _dropped: dict[tuple[int, GroupKey], None] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._set(_empty(len(self.aggregators)))

    def _set(self, columns: dict[str, Any]) -> None:
        for name, column in columns.items():
            setattr(self, name, column)

    def _columns(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("kid", "start", "end", "stored", "emitted", "changed",
                                                       "dirty", "accs")}

    def _take(self, rows: np.ndarray) -> None:
        """Keep the rows ``rows`` (positions or a mask), in that order."""
        self._set({name: [c[rows] for c in column] if name == "accs" else column[rows]
                   for name, column in self._columns().items()})

    @staticmethod
    def bytes_per_group(aggregators: Sequence[Aggregator], key_width: int) -> int:
        """One held session: its row in the columns plus its accumulators (the key's own bytes are
        shared by its sessions, counted once per key as one session's)."""
        return (SESSION_ROW_BYTES + INDEXED_KEY_BYTES + KEY_VALUE_BYTES * key_width
                + sum(a.state_bytes for a in aggregators))

    @property
    def sessions(self) -> dict[GroupKey, list[HeldSession]]:
        """Each key's sessions by start, as rows (a snapshot: for messages and tests)."""
        out: dict[GroupKey, list[HeldSession]] = {}
        rows = zip(self.codes.keys_of(self.kid), self.start.tolist(), self.end.tolist(),
                   accumulator_rows(self.accs), self.emitted.tolist())
        for key, start, end, accs, emitted in rows:
            out.setdefault(key, []).append(HeldSession(start, end, accs, emitted))
        return out

    @property
    def group_count(self) -> int:
        """Keys holding a session (what ``max_groups_per_window`` caps)."""
        return run_count(self.kid)

    @property
    def window_count(self) -> int:
        return len(self.kid)

    @property
    def state_rows(self) -> int:
        """Rows the store holds for this state: one per session."""
        return len(self.kid)

    @property
    def flush_watermark(self) -> int | None:
        """The watermark at which every session is final: past the latest end (final is ``end < W``)."""
        return int(self.end.max()) + 1 if len(self.end) else None

    def open_windows(self, watermark: int | None) -> int:
        """Sessions not emitted yet (retained ones under ``reopen`` were): the flag decides, not W."""
        return int(np.count_nonzero(~self.emitted))

    # -- merge ----------------------------------------------------------------------------------

    def merge(self, starts: Sequence[int], keys: Sequence[GroupKey], partials: Sequence[Sequence[Any]],
              lasts: Sequence[int] = ()) -> None:
        """Fold one batch's session partials in (row r: ``keys[r]``, event times ``starts[r]`` to
        ``lasts[r]`` in one cap bucket, ``partials[i][r]`` for aggregator i).

        Sessions are joined and bridged first (:func:`plan_merge`), so every partial row knows the
        row it lands in; then each aggregator folds its whole column at once.
        """
        n = len(keys)
        if not n:
            return
        kids = self._ids(keys)  # before the keys become a list: a column of int keys is its own ids
        keys = list(keys)
        batch = batch_keys(self.kid, self.end, kids)
        self._check_cap(batch, keys, starts)
        plan = plan_merge(self, batch, kids, keys, ints(starts, n), ints(lasts, n))
        self._apply(plan)
        targets = plan.target
        fold_partials(self.aggregators, self.accs, targets, partials, shared=plan.shared,
                      failed=lambda error, i: self.failed_merge(error.error, i, keys[error.row], starts[error.row]))
        self.changed[targets] = True
        self.dirty[targets] = True

    def _ids(self, keys: Sequence[GroupKey]) -> np.ndarray:
        self.codes, self.kid, ids = coded(self.codes, self.kid, keys)
        return ids

    def _check_cap(self, batch: BatchKeys, keys: list[GroupKey], starts: Sequence[int]) -> None:
        """Refuse the batch before changing anything when its new keys would pass the cap."""
        cap = self.max_groups_per_window
        new = batch.first[~batch.holds]
        room = cap - self.group_count
        if len(new) > room:
            r = int(np.sort(new)[max(room, 0)])
            raise self.cap_hit(f"max_groups_per_window={cap}", "keys already hold a session", keys[r], starts[r])

    def _apply(self, plan: MergePlan) -> None:
        """The plan's removed rows out and its rows in where they sort by (key, start) (after held
        rows of an equal pair, as a stable sort of held then added rows would put them), without
        sorting what is held; ``plan.target`` becomes positions in the new columns."""
        if plan.removed:
            self._take(np.delete(np.arange(len(self.kid)), plan.removed))
        added = len(plan.kids)
        kids, starts = ints(plan.kids, added), ints(plan.starts, added)
        order = np.lexsort((starts, kids))
        where = search_pairs(self.kid, self.start, kids[order], starts[order], side="right")
        new = {"kid": kids, "start": starts, "end": ints(plan.ends, added), "stored": ints(plan.stored, added),
               "emitted": np.array(plan.emitted, bool), "changed": np.zeros(added, bool),
               "dirty": np.zeros(added, bool)}
        columns: dict[str, Any] = {name: np.insert(column, where, new[name][order])
                                   for name, column in self._columns().items() if name != "accs"}
        columns["accs"] = [np.insert(column, where, objects(values, added)[order])
                           for column, values in zip(self.accs, plan.accs)]
        self._set(columns)
        position = np.empty(added, I64)
        position[order] = where + np.arange(added, dtype=I64)  # np.insert puts the j-th sorted row at where[j] + j
        plan.target = position[plan.target]
        self._moved.update(dict.fromkeys(plan.moved))
        self._dropped.update(dict.fromkeys(plan.dropped))

    # -- emission and eviction ----------------------------------------------------------------------

    def report(self, before: int | None, watermark: int | None, retention: int, scope: str = CLOSING) -> Report:
        """Every session changed since the last report that is emitted or closes (open ones as
        ``scope`` says), and every other one whose end passed W and that was not emitted (with
        :data:`OPEN`, every one not emitted); the rows written for sessions whose (start, key) no
        longer exists."""
        changed, emitted = self.changed, self.emitted
        closed = self.end < watermark if watermark is not None else np.zeros(len(changed), bool)
        pick = changed & (emitted | closed) if scope == CLOSING else changed.copy()
        pick |= ~changed & ~emitted & (closed if scope != OPEN else True)
        rows = np.flatnonzero(pick)
        out = Report(starts=self.start[rows], ends=self.end[rows], keys=self.codes.key_column(self.kid[rows]),
                     changed=changed[rows], emitted=emitted[rows], closed=closed[rows], handles=rows)
        changed[:] = False
        out.gone.add_rows(self._gone())
        return out

    def _gone(self) -> list[EmittedRow]:
        """The written rows of (start, key)s no session holds any more, as retractions (and forgotten)."""
        rows = []
        for key, start in self._moved:
            by_key = self.written.get(start)
            if by_key is not None and key in by_key and not self._holds(key, start):
                end, values = by_key.pop(key)
                rows.append(EmittedRow(start, end, key, values, RETRACT))
                if not by_key:
                    del self.written[start]
        self._moved = {}
        return rows

    def _holds(self, key: GroupKey, start: int) -> bool:
        kid = self.codes.id_of(key)
        if kid is None:
            return False
        lo, hi = np.searchsorted(self.kid, kid, "left"), np.searchsorted(self.kid, kid, "right")
        return bool(np.any(self.start[lo:hi] == start))

    def accumulators(self, report: Report, rows: np.ndarray) -> list[Accumulators]:
        return accumulator_rows(self.accs, report.handles[rows])

    def values(self, report: Report, rows: np.ndarray) -> list[list[Any]]:
        """Finished from the accumulator columns, without a list of accumulators per row."""
        at = report.handles[rows]
        return self.finished([column[at].tolist() if not agg.hidden else []
                              for agg, column in zip(self.aggregators, self.accs)])

    def set_marks(self, report: Report, rows: np.ndarray, marks: Sequence[Any]) -> None:
        at = report.handles[rows]
        self.accs[-1][at] = objects(marks, len(rows))

    def mark_emitted(self, report: Report, rows: np.ndarray) -> None:
        """The flag is stored with the session: a session that absorbs an emitted one is emitted
        before its end passes W, which W alone cannot tell."""
        at = report.handles[rows]
        at = at[~self.emitted[at]]
        self.emitted[at] = True
        self.dirty[at] = True

    def touch(self, report: Report, rows: np.ndarray) -> None:
        self.dirty[report.handles[rows]] = True

    def evict(self, watermark: int | None, retention: int) -> None:
        gone = self.kind.evicted(self.end, watermark, retention)
        if not gone.any():
            return
        at = np.flatnonzero(gone)
        keys, stored = self.codes.keys_of(self.kid[at]), self.stored[at]
        was = np.flatnonzero(stored != NOT_STORED)
        self._dropped.update(dict.fromkeys(zip(stored[was].tolist(), map(keys.__getitem__, was.tolist()))))
        written = self.written
        for key, start in zip(keys, self.start[at].tolist()) if written else ():
            by_key = written.get(start)
            if by_key is not None and by_key.pop(key, None) is not None and not by_key:
                del written[start]
        self._take(~gone)
        self.kid, = self.codes.compacted([self.kid])

    # -- durable state ----------------------------------------------------------------------------

    def take_column_changes(self, everything: bool = False) -> ColumnChanges:
        """Sessions changed (``everything``: every session) and (start, key) rows gone since the
        last call (a store deletes first, then upserts). A session whose start moved is deleted
        under its old start."""
        at = np.arange(len(self.kid)) if everything else np.flatnonzero(self.dirty)
        starts, stored = self.start[at], self.stored[at]
        keys = self.codes.key_column(self.kid[at])
        deletes = {} if everything else dict(self._dropped)
        moved = np.flatnonzero((stored != NOT_STORED) & (stored != starts)) if not everything else at[:0]
        deletes.update(dict.fromkeys(zip(stored[moved].tolist(), self.codes.keys_of(self.kid[at[moved]]))))
        if deletes:
            for upserted in zip(starts.tolist(), keys):
                deletes.pop(upserted, None)
        self.stored[at] = starts
        self.dirty[:] = False
        self._dropped = {}
        return ColumnChanges(starts=starts, ends=self.end[at], keys=keys, accs=[c[at] for c in self.accs],
                             emitted=self.emitted[at], deletes=list(deletes))

    def restore(self, groups: StoredColumns, watermark: int | None) -> None:
        """Load sessions a store returned into empty state.

        The stored flag decides: under reopen a session that absorbed an emitted one counts as
        emitted while its end is still after W. A row without one (written before schema step 5,
        when sessions ran under drop / dlq only) is emitted exactly when its end is before W:
        without reopen no accepted row can reach an emitted session.
        """
        if len(self.kid):
            raise RuntimeError("restore needs an empty SessionState")
        n = len(groups)
        if not n:
            return
        assert None not in groups.ends, "sessions are stored with their ends"
        end = ints(groups.ends, n)  # type: ignore[arg-type]  # no None: asserted
        final = end < watermark if watermark is not None else np.zeros(n, bool)
        flags = groups.emitted if groups.emitted is not None else repeat(None)
        emitted = np.array([bool(f) if f is not None else bool(c) for f, c in zip(flags, final.tolist())], bool)
        start = ints(groups.starts, n)
        self._set({"kid": self._ids(groups.keys), "start": start, "end": end, "stored": start.copy(),
                   "emitted": emitted, "changed": np.zeros(n, bool), "dirty": np.zeros(n, bool),
                   "accs": [objects(column, n) for column in groups.accs]})
        self._take(np.lexsort((self.start, self.kid)))
