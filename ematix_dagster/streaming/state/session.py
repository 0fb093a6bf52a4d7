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

>>> from ematix_dagster.streaming.aggregators import Count
>>> from ematix_dagster.streaming.emission import emit
>>> from ematix_dagster.streaming.windows import SessionWindows
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

import heapq
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from ematix_dagster.columns import RETRACT
from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.streaming.aggregators import PartialRowError, merge_partials
from ematix_dagster.streaming.bounds import WindowBounds
from ematix_dagster.streaming.emitted import EmittedRow, GroupKey
from ematix_dagster.streaming.state.base import (
    CLOSING,
    OPEN,
    Accumulators,
    Report,
    StateBase,
    StoreChanges,
    StoredGroup,
)

if TYPE_CHECKING:
    from ematix_dagster.streaming.windows.session import SessionWindows


class Session:
    """One session of one key. ``last`` is exact in memory; a restored session only knows
    ``max(start, end - gap)``, which decides nothing (joins and ends follow ``end``)."""

    __slots__ = ("start", "last", "end", "bucket", "accs", "emitted", "changed", "stored_start", "alive")

    def __init__(self, start: int, last: int, end: int, bucket: int, accs: Accumulators, emitted: bool,
                 stored_start: int | None = None) -> None:
        self.start = start
        self.last = last
        self.end = end
        self.bucket = bucket
        self.accs = accs
        self.emitted = emitted
        self.changed = False  # changed since the last report
        self.stored_start = stored_start  # the start a commit last wrote it under (None: never)
        self.alive = True  # False once merged away or evicted (its heap entries are then stale)

    def __repr__(self) -> str:
        return f"Session({self.start}, {self.end}, accs={self.accs!r}, emitted={self.emitted})"


@dataclass
class SessionState(StateBase):
    """Every key's open (and, under ``reopen``, retained) sessions, sorted by start.

    ``max_groups_per_window`` caps the keys holding an open or retained session at once.
    """

    kind: SessionWindows
    keeps_written: bool = True
    sessions: dict[GroupKey, list[Session]] = field(default_factory=dict)
    # since the last report: sessions changed, and the (key, start) of sessions that merged or moved
    _changed: dict[int, tuple[GroupKey, Session]] = field(default_factory=dict, init=False, repr=False)
    _moved: dict[tuple[GroupKey, int], None] = field(default_factory=dict, init=False, repr=False)
    # since the last commit: sessions to write, and (start, key) rows to delete
    _dirty: dict[int, tuple[GroupKey, Session]] = field(default_factory=dict, init=False, repr=False)
    _dropped: dict[tuple[int, GroupKey], None] = field(default_factory=dict, init=False, repr=False)
    # sessions by end, to finalise and to evict without scanning every key each batch: entries
    # (end, sequence, key, session), stale once the session's end moved or it left state
    _to_final: list[tuple[int, int, GroupKey, Session]] = field(default_factory=list, init=False, repr=False)
    _to_evict: list[tuple[int, int, GroupKey, Session]] = field(default_factory=list, init=False, repr=False)
    _seq: Iterator[int] = field(default_factory=itertools.count, init=False, repr=False)

    @property
    def group_count(self) -> int:
        """Keys holding a session (what ``max_groups_per_window`` caps)."""
        return len(self.sessions)

    @property
    def window_count(self) -> int:
        return sum(map(len, self.sessions.values()))

    @property
    def state_rows(self) -> int:
        """Rows the store holds for this state: one per session."""
        return self.window_count

    @property
    def flush_watermark(self) -> int | None:
        """The watermark at which every session is final: past the latest end (final is ``end < W``)."""
        end = max((s.end for held in self.sessions.values() for s in held), default=None)
        return None if end is None else end + 1

    def open_windows(self, watermark: int | None) -> int:
        """Sessions not emitted yet (retained ones under ``reopen`` were): the flag decides, not W."""
        return sum(1 for held in self.sessions.values() for s in held if not s.emitted)

    # -- merge ----------------------------------------------------------------------------------

    def merge(self, starts: Sequence[int], keys: Sequence[GroupKey], partials: Sequence[Sequence[Any]],
              lasts: Sequence[int] = ()) -> None:
        """Fold one batch's session partials in (row r: ``keys[r]``, event times ``starts[r]`` to
        ``lasts[r]`` in one cap bucket, ``partials[i][r]`` for aggregator i, as ``merge_batch`` takes them).

        Sessions are joined and bridged first, so every partial row knows the accumulator list it
        lands in; then each aggregator folds its whole column at once.
        """
        rows_by_key: dict[GroupKey, list[int]] = {}
        for r, key in enumerate(keys):
            rows_by_key.setdefault(key, []).append(r)
        self._check_cap(rows_by_key, starts)
        states: list[Accumulators] = [[] for _ in keys]
        for key, rows in rows_by_key.items():
            self.sessions[key] = self._merge_key(key, self.sessions.get(key, []), rows, starts, lasts, states)
        try:
            merge_partials(self.aggregators, states, partials)
        except PartialRowError as failed:
            self.failed_merge(failed.error, failed.index, keys[failed.row], starts[failed.row])

    def _check_cap(self, rows_by_key: dict[GroupKey, list[int]], starts: Sequence[int]) -> None:
        """Refuse the batch before changing anything when its new keys would pass the cap."""
        cap = self.max_groups_per_window
        room = cap - len(self.sessions)
        new = [key for key in rows_by_key if key not in self.sessions]
        if len(new) > room:
            key = new[max(room, 0)]
            raise self.cap_hit(f"max_groups_per_window={cap}", "keys already hold a session", key,
                               starts[rows_by_key[key][0]])

    def _merge_key(self, key: GroupKey, held: list[Session], rows: list[int], firsts: Sequence[int],
                   lasts: Sequence[int], states: list[Accumulators]) -> list[Session]:
        """The key's sessions after its partials join them; ``states[r]`` gets row r's accumulators."""
        rules = self.kind
        if len(rows) == 1 and (not held or firsts[rows[0]] > max(s.end for s in held)):
            # the common case: one partial after everything the key holds opens a new session
            r = rows[0]
            bucket = rules.bucket(firsts[r])
            if lasts[r] >= firsts[r] and rules.bucket(lasts[r]) == bucket:
                session = Session(firsts[r], lasts[r], rules.session_end(lasts[r], bucket), bucket,
                                  [None] * len(self.aggregators), emitted=False)
                session.changed = True
                self._changed[id(session)] = self._dirty[id(session)] = (key, session)
                self._track(key, session)
                states[r] = session.accs
                return [*held, session]
        by_bucket: dict[int, list[int]] = {}
        for r in rows:
            first, last = firsts[r], lasts[r]
            bucket = rules.bucket(first)
            if last < first or rules.bucket(last) != bucket:
                raise ValueError(f"session partial [{first}, {last}] of group {key!r:.200} is not one "
                                 f"ordered run inside one cap bucket (pipeline {self.pipeline})")
            by_bucket.setdefault(bucket, []).append(r)
        kept = [s for s in held if s.bucket not in by_bucket]
        for bucket, brows in by_bucket.items():
            # (start, end, session or None, partial row or -1), swept by start: an item joins the
            # run so far iff it starts at or before the run's end (within gap, or before the cap)
            items: list[tuple[int, int, Session | None, int]] = [(s.start, s.end, s, -1) for s in held
                                                                 if s.bucket == bucket]
            items += [(firsts[r], rules.session_end(lasts[r], bucket), None, r) for r in brows]
            items.sort(key=lambda item: (item[0], item[1]))
            run: list[tuple[int, int, Session | None, int]] = []
            run_end = 0
            for item in items:
                if run and item[0] > run_end:
                    kept.append(self._join(key, bucket, run, lasts, states))
                    run = []
                run_end = item[1] if not run else max(run_end, item[1])
                run.append(item)
            kept.append(self._join(key, bucket, run, lasts, states))
        kept.sort(key=lambda s: s.start)
        return kept

    def _join(self, key: GroupKey, bucket: int, run: list[tuple[int, int, Session | None, int]],
              lasts: Sequence[int], states: list[Accumulators]) -> Session:
        """One session from a run of existing sessions and partial rows (sorted by start)."""
        olds = [item[2] for item in run if item[2] is not None]
        rows = [item[3] for item in run if item[2] is None]
        if not rows:  # untouched (sessions in state never join each other)
            assert len(olds) == 1, olds
            return olds[0]
        for s in olds:  # their (start, key) may disappear: the report retracts what was written for it
            self._moved[(key, s.start)] = None
        start, end = run[0][0], max(item[1] for item in run)
        last = max([s.last for s in olds] + [lasts[r] for r in rows])
        if olds:
            survivor = olds[0]
            for other in olds[1:]:
                for i, agg in enumerate(self.aggregators):
                    try:
                        survivor.accs[i] = agg.merge(survivor.accs[i], other.accs[i])
                    except (StateCapExceeded, AggregationOverflow, CorruptState) as exc:
                        self.failed_merge(exc, i, key, start)
                survivor.emitted = survivor.emitted or other.emitted
                self._forget(key, other)
            survivor.start, survivor.last, survivor.end = start, last, end
        else:
            survivor = Session(start, last, end, bucket, [None] * len(self.aggregators), emitted=False)
        survivor.changed = True
        self._changed[id(survivor)] = self._dirty[id(survivor)] = (key, survivor)
        self._track(key, survivor)
        for r in rows:
            states[r] = survivor.accs
        return survivor

    def _track(self, key: GroupKey, session: Session) -> None:
        """Index ``session`` by its (new) end for :meth:`report` and :meth:`evict`."""
        entry = (session.end, next(self._seq), key, session)
        heapq.heappush(self._to_final, entry)
        heapq.heappush(self._to_evict, entry)

    def _forget(self, key: GroupKey, session: Session) -> None:
        """``session`` leaves state (merged away or evicted): the store deletes its row."""
        session.alive = False
        self._changed.pop(id(session), None)
        self._dirty.pop(id(session), None)
        if session.stored_start is not None:
            self._dropped[(session.stored_start, key)] = None

    # -- emission and eviction ----------------------------------------------------------------------

    def report(self, before: int | None, watermark: int | None, retention: int, scope: str = CLOSING) -> Report:
        """Every session changed since the last report that is emitted or closes (open ones as
        ``scope`` says), and every other one whose end passed W (or, with :data:`OPEN`, that is
        not emitted); the rows written for sessions whose (start, key) no longer exists."""
        out = Report()
        rules = self.kind
        for key, s in self._changed.values():
            closed = rules.is_final(WindowBounds(s.start, s.end), watermark)
            if s.emitted or closed or scope != CLOSING:
                out.add_row(s.start, s.end, key, s, True, s.emitted, closed)
            s.changed = False
        reported, self._changed = set(self._changed), {}  # a session has as many heap entries as changes
        out.gone.add_rows(self._gone())
        finals = self._to_final
        while finals and rules.is_final(WindowBounds(finals[0][3].start, finals[0][0]), watermark):
            end, _, key, s = heapq.heappop(finals)
            if s.alive and s.end == end and not s.emitted and id(s) not in reported:
                reported.add(id(s))
                out.add_row(s.start, s.end, key, s, False, False, True)
        if scope == OPEN:
            for key, held in self.sessions.items():
                for s in held:
                    if not s.emitted and id(s) not in reported:
                        out.add_row(s.start, s.end, key, s, False, False, False)
        return out

    def _gone(self) -> list[EmittedRow]:
        """The written rows of (start, key)s no session holds any more, as retractions (and forgotten)."""
        rows = []
        for key, start in self._moved:
            by_key = self.written.get(start)
            if by_key is not None and key in by_key and not any(s.start == start for s in self.sessions.get(key, ())):
                end, values = by_key.pop(key)
                rows.append(EmittedRow(start, end, key, values, RETRACT))
                if not by_key:
                    del self.written[start]
        self._moved = {}
        return rows

    def accumulators(self, report: Report, rows: Sequence[int]) -> list[Accumulators]:
        handles = report.handles
        return [handles[r].accs for r in rows]

    def mark_emitted(self, report: Report, rows: Sequence[int]) -> None:
        """The flag is stored with the session: a session that absorbs an emitted one is emitted
        before its end passes W, which W alone cannot tell."""
        handles, keys = report.handles, report.keys
        for r in rows:
            s = handles[r]
            if not s.emitted:
                s.emitted = True
                self._dirty[id(s)] = (keys[r], s)

    def touch(self, report: Report, rows: Sequence[int]) -> None:
        handles, keys = report.handles, report.keys
        for r in rows:
            self._dirty[id(handles[r])] = (keys[r], handles[r])

    def evict(self, watermark: int | None, retention: int) -> None:
        rules, evict = self.kind, self._to_evict
        while evict and rules.is_evicted(WindowBounds(evict[0][3].start, evict[0][0]), watermark, retention):
            end, _, key, s = heapq.heappop(evict)
            if s.alive and s.end == end:
                held = [other for other in self.sessions[key] if other is not s]
                self._forget(key, s)
                by_key = self.written.get(s.start)
                if by_key is not None and by_key.pop(key, None) is not None and not by_key:
                    del self.written[s.start]
                if held:
                    self.sessions[key] = held
                else:
                    del self.sessions[key]

    # -- durable state ----------------------------------------------------------------------------

    def take_changes(self) -> StoreChanges:
        """Sessions changed and (start, key) rows gone since the last call (a store deletes first,
        then upserts). A session whose start moved is deleted under its old start."""
        upserts: list[StoredGroup] = []
        deletes = dict(self._dropped)
        for key, s in self._dirty.values():
            if s.stored_start is not None and s.stored_start != s.start:
                deletes[(s.stored_start, key)] = None
            s.stored_start = s.start
            upserts.append(StoredGroup(s.start, s.end, key, s.accs, s.emitted))
        for group in upserts:
            deletes.pop((group.start, group.key), None)
        self._dirty, self._dropped = {}, {}
        return StoreChanges(upserts=upserts, deletes=list(deletes))

    def restore(self, groups: Iterable[StoredGroup], watermark: int | None) -> None:
        """Load sessions a store returned into empty state.

        The stored flag decides: under reopen a session that absorbed an emitted one counts as
        emitted while its end is still after W. A row without one (written before schema step 5,
        when sessions ran under drop / dlq only) is emitted exactly when its end is before W:
        without reopen no accepted row can reach an emitted session.
        """
        if self.sessions:
            raise RuntimeError("restore needs an empty SessionState")
        gap, bucket = self.kind.gap, self.kind.bucket
        for start, end, key, accs, emitted in groups:
            assert end is not None, "sessions are stored with their ends"
            if emitted is None:
                emitted = self.kind.is_final(WindowBounds(start, end), watermark)
            session = Session(start, max(start, end - gap), end, bucket(start), list(accs), bool(emitted),
                              stored_start=start)
            self.sessions.setdefault(key, []).append(session)
            self._track(key, session)
        for held in self.sessions.values():
            held.sort(key=lambda s: s.start)
