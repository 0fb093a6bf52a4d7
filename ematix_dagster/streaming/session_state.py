"""Session window state on the driver (SPEC.md §8): each key's open and retained sessions.

Spark sessionizes a batch's accepted rows per (key, cap bucket) into batch-local *partials*
(first and last event time, partial aggregates) and never sends raw rows. :meth:`SessionState.merge`
folds them into the key's sessions: a partial joins every session of its bucket it overlaps or
comes within ``gap`` of, bridging them into one, or opens a new session. Joining is decided by
start and end alone (a row at ``t`` joins a session iff ``start - gap <= t <= end`` in its bucket:
a capped end is the bucket end, which every later row of the bucket is within ``gap`` of), so a
restored session needs no more than the (start, end) it was stored with.

Unlike fixed windows, whether a session was emitted is stored per session: a late row under
``reopen`` can bridge an emitted session with one that is still open, and the result counts as
emitted (SPEC.md §8), which the watermark alone cannot tell. An emitted session's accumulators
always equal what was last written (every change is re-emitted in its batch), so the row a
retraction repeats is computed from them before the batch first changes them.

>>> from ematix_dagster.streaming.aggregators import Count
>>> state = SessionState("p", [Count()], ["n"], 10, SessionWindows(gap=10, cap=100))
>>> state.merge([("a",), ("a",)], firsts=[0, 22], lasts=[5, 22], partials=[[2, 1]])
>>> [(s.start, s.end, s.accs) for s in state.sessions[("a",)]]
[(0, 15, [2]), (22, 32, [1])]
>>> [(row.start, row.end, row.values, row.kind) for row in state.emit(watermark=35, retention=50).rows]
[(0, 15, (2,), 'final'), (22, 32, (1,), 'final')]
>>> state.merge([("a",)], firsts=[14], lasts=[14], partials=[[1]])  # late under reopen, bridges both
>>> out = state.emit(watermark=35, retention=50)
>>> [(row.start, row.end, row.values, row.kind) for row in out.retractions + out.rows]
[(22, 32, (1,), 'retract'), (0, 32, (4,), 'correction')]
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, NoReturn, Sequence

from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.streaming.aggregators import Aggregator, PartialRowError, merge_partials
from ematix_dagster.streaming.emitted import EmittedRow
from ematix_dagster.streaming.window_state import GroupKey, key_order
from ematix_dagster.streaming.windows.base import WindowBounds
from ematix_dagster.streaming.windows.session import SessionWindows
from ematix_dagster.streaming.windows.units import format_us

#: what a commit writes for one session: (start, end, key, accumulators, emitted)
SessionUpsert = tuple[int, int, GroupKey, list[Any], bool]
#: what a commit deletes: (start the session was stored under, key)
SessionDelete = tuple[int, GroupKey]


class SessionEmission(NamedTuple):
    """A batch's output: retractions (written first, SPEC.md §10), then finals and corrections."""

    retractions: list[EmittedRow]
    rows: list[EmittedRow]


class Session:
    """One session of one key. ``last`` is exact in memory; a restored session only knows
    ``max(start, end - gap)``, which decides nothing (joins and ends follow ``end``)."""

    __slots__ = ("start", "last", "end", "bucket", "accs", "emitted", "changed", "stored_start", "alive")

    def __init__(self, start: int, last: int, end: int, bucket: int, accs: list[Any], emitted: bool,
                 stored_start: int | None = None) -> None:
        self.start = start
        self.last = last
        self.end = end
        self.bucket = bucket
        self.accs = accs
        self.emitted = emitted
        self.changed = False  # changed since the last emit
        self.stored_start = stored_start  # the start a commit last wrote it under (None: never)
        self.alive = True  # False once merged away or evicted (its heap entries are then stale)

    def __repr__(self) -> str:
        return f"Session({self.start}, {self.end}, accs={self.accs!r}, emitted={self.emitted})"


def _ordered(rows: list[EmittedRow]) -> list[EmittedRow]:
    """Rows by (start, key), as fixed windows order them: the same input gives the same files."""
    if set(map(type, itertools.chain.from_iterable(row.key for row in rows))) <= {int, str}:
        return sorted(rows, key=lambda row: (row.start, row.key))  # plain keys order as they are
    return sorted(rows, key=lambda row: (row.start, key_order(row.key)))


@dataclass
class SessionState:
    """Every key's open (and, under ``reopen``, retained) sessions, sorted by start."""

    pipeline: str
    aggregators: Sequence[Aggregator]
    aliases: Sequence[str]
    max_groups_per_window: int  # keys holding an open or retained session at once
    rules: SessionWindows
    sessions: dict[GroupKey, list[Session]] = field(default_factory=dict)
    # since the last emit: sessions changed, and the rows emitted sessions had before they changed
    _changed: dict[int, tuple[GroupKey, Session]] = field(default_factory=dict, init=False, repr=False)
    _superseded: dict[tuple[GroupKey, int], EmittedRow] = field(default_factory=dict, init=False, repr=False)
    # since the last commit: sessions to write, and (start, key) rows to delete
    _dirty: dict[int, tuple[GroupKey, Session]] = field(default_factory=dict, init=False, repr=False)
    _dropped: dict[SessionDelete, None] = field(default_factory=dict, init=False, repr=False)
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
    def session_count(self) -> int:
        return sum(map(len, self.sessions.values()))

    @property
    def window_count(self) -> int:
        return self.session_count

    @property
    def state_rows(self) -> int:
        """Rows the store holds for this state: one per session."""
        return self.session_count

    @property
    def flush_watermark(self) -> int | None:
        """The watermark at which every session is final: past the latest end (final is ``end < W``)."""
        end = max((s.end for held in self.sessions.values() for s in held), default=None)
        return None if end is None else end + 1

    def open_sessions(self) -> int:
        """Sessions not emitted yet (retained ones under ``reopen`` were)."""
        return sum(1 for held in self.sessions.values() for s in held if not s.emitted)

    def describe(self, key: GroupKey, start: int) -> str:
        """A session for messages."""
        return f"session starting {format_us(start)} of group {key!r:.200} for pipeline {self.pipeline}"

    # -- merge ----------------------------------------------------------------------------------

    def merge(self, keys: Sequence[GroupKey], firsts: Sequence[int], lasts: Sequence[int],
              partials: Sequence[Sequence[Any]]) -> None:
        """Fold one batch's session partials in (row r: ``keys[r]``, event times ``firsts[r]`` to
        ``lasts[r]`` in one cap bucket, ``partials[i][r]`` for aggregator i, as ``merge_batch`` takes them).

        Sessions are joined and bridged first, so every partial row knows the accumulator list it
        lands in; then each aggregator folds its whole column at once.
        """
        rows_by_key: dict[GroupKey, list[int]] = {}
        for r, key in enumerate(keys):
            rows_by_key.setdefault(key, []).append(r)
        self._check_cap(rows_by_key)
        states: list[list[Any]] = [[] for _ in keys]
        for key, rows in rows_by_key.items():
            self.sessions[key] = self._merge_key(key, self.sessions.get(key, []), rows, firsts, lasts, states)
        try:
            merge_partials(self.aggregators, states, partials)
        except PartialRowError as failed:
            self._fail(failed.error, failed.index, keys[failed.row], firsts[failed.row])

    def _check_cap(self, rows_by_key: dict[GroupKey, list[int]]) -> None:
        """Refuse the batch before changing anything when its new keys would pass the cap."""
        cap = self.max_groups_per_window
        room = cap - len(self.sessions)
        new = [key for key in rows_by_key if key not in self.sessions]
        if len(new) > room:
            raise StateCapExceeded(
                f"session state cap hit: max_groups_per_window={cap} keys already hold a session when "
                f"group {new[max(room, 0)]!r:.200} opens one, for pipeline {self.pipeline}")

    def _merge_key(self, key: GroupKey, held: list[Session], rows: list[int], firsts: Sequence[int],
                   lasts: Sequence[int], states: list[list[Any]]) -> list[Session]:
        """The key's sessions after its partials join them; ``states[r]`` gets row r's accumulators."""
        rules = self.rules
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
            items = [(s.start, s.end, s, -1) for s in held if s.bucket == bucket]
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
              lasts: Sequence[int], states: list[list[Any]]) -> Session:
        """One session from a run of existing sessions and partial rows (sorted by start)."""
        olds = [item[2] for item in run if item[2] is not None]
        rows = [item[3] for item in run if item[2] is None]
        if not rows:  # untouched (sessions in state never join each other)
            assert len(olds) == 1, olds
            return olds[0]
        for s in olds:
            if s.emitted and not s.changed:  # what the target holds for it, before it changes
                self._superseded[(key, s.start)] = EmittedRow(s.start, s.end, key, self._values(s), "retract")
        start, end = run[0][0], max(item[1] for item in run)
        last = max([s.last for s in olds] + [lasts[r] for r in rows])
        if olds:
            survivor = olds[0]
            for other in olds[1:]:
                for i, agg in enumerate(self.aggregators):
                    try:
                        survivor.accs[i] = agg.merge(survivor.accs[i], other.accs[i])
                    except (StateCapExceeded, AggregationOverflow, CorruptState) as exc:
                        self._fail(exc, i, key, start)
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
        """Index ``session`` by its (new) end for :meth:`emit`."""
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

    def _fail(self, exc: Exception, index: int, key: GroupKey, start: int) -> NoReturn:
        if isinstance(exc, StateCapExceeded):
            raise StateCapExceeded(f"session state cap hit: {exc} ({self.aliases[index]}) on "
                                   f"{self.describe(key, start)}") from None
        raise type(exc)(f"{exc}: {self.aliases[index]} on {self.describe(key, start)}") from None

    # -- emission and eviction ----------------------------------------------------------------------

    def _values(self, session: Session) -> tuple[Any, ...]:
        return tuple(agg.result(acc) for agg, acc in zip(self.aggregators, session.accs))

    def emit(self, watermark: int | None, retention: int) -> SessionEmission:
        """The batch's output once W has advanced to ``watermark``, then eviction.

        A session not emitted yet whose end is before W is ``final``; an emitted one (or one that
        absorbed an emitted one) changed since the last emit is one ``correction``. A row emitted
        earlier whose (start, key) no longer exists is retracted with the values it was written
        with. Sessions with ``end + retention < W`` leave state.
        """
        rules = self.rules
        emitted: list[tuple[GroupKey, Session, str]] = [
            (key, s, "correction") for key, s in self._changed.values() if s.emitted]
        retractions = [row for (key, start), row in self._superseded.items()
                       if not any(s.start == start for s in self.sessions.get(key, ()))]
        for _, s in self._changed.values():
            s.changed = False
        self._changed, self._superseded = {}, {}
        finals = self._to_final
        while finals and rules.is_final(WindowBounds(finals[0][3].start, finals[0][0]), watermark):
            end, _, key, s = heapq.heappop(finals)
            if s.alive and s.end == end and not s.emitted:
                emitted.append((key, s, "final"))
                s.emitted = True
                self._dirty[id(s)] = (key, s)
        evict = self._to_evict
        while evict and rules.is_evicted(WindowBounds(evict[0][3].start, evict[0][0]), watermark, retention):
            end, _, key, s = heapq.heappop(evict)
            if s.alive and s.end == end:
                held = [other for other in self.sessions[key] if other is not s]
                self._forget(key, s)
                if held:
                    self.sessions[key] = held
                else:
                    del self.sessions[key]
        # one aggregator at a time over the emitted sessions, then one tuple per session
        columns = [agg.result_column([s.accs[i] for _, s, _ in emitted]) for i, agg in enumerate(self.aggregators)]
        out = [EmittedRow(s.start, s.end, key, values, kind) for (key, s, kind), values in zip(emitted, zip(*columns))]
        return SessionEmission(_ordered(retractions), _ordered(out))

    # -- durable state ----------------------------------------------------------------------------

    def take_changes(self) -> tuple[list[SessionUpsert], list[SessionDelete]]:
        """Sessions changed and (start, key) rows gone since the last call (what a store writes:
        deletes first, then upserts). A session whose start moved is deleted under its old start."""
        upserts: list[SessionUpsert] = []
        deletes = dict(self._dropped)
        for key, s in self._dirty.values():
            if s.stored_start is not None and s.stored_start != s.start:
                deletes[(s.stored_start, key)] = None
            s.stored_start = s.start
            upserts.append((s.start, s.end, key, s.accs, s.emitted))
        for start, _, key, _, _ in upserts:
            deletes.pop((start, key), None)
        self._dirty, self._dropped = {}, {}
        return upserts, list(deletes)

    def restore(self, rows: Sequence[SessionUpsert]) -> None:
        """Load sessions a store returned (as :meth:`take_changes` wrote them) into empty state."""
        if self.sessions:
            raise RuntimeError("restore needs an empty SessionState")
        gap, bucket = self.rules.gap, self.rules.bucket
        for start, end, key, accs, emitted in rows:
            session = Session(start, max(start, end - gap), end, bucket(start), list(accs), bool(emitted),
                              stored_start=start)
            self.sessions.setdefault(key, []).append(session)
            self._track(key, session)
        for held in self.sessions.values():
            held.sort(key=lambda s: s.start)
