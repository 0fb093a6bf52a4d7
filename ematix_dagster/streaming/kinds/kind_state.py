"""One state interface for every window kind: what a batch did, reported as columns.

Each kind keeps its windows its own way (each fixed window's groups, each key's sessions, each key's
partials by event time, all as columns), but the engine asks every kind the same things, in this order, once per
batch (``streaming.emission``):

1. :meth:`KindState.merge` folds the batch's partials in;
2. :meth:`KindState.report` says, as columns, every (window, group) the batch may emit a row for:
   whether it *changed* in the batch (took accepted rows; a session: created, extended or
   merged), whether a ``final`` or ``correction`` of it was *emitted* before, whether it is
   *closed* at the new watermark; and the rows already written whose (window start, key) no
   longer exists (``gone``: merged away or moved), as they were written. Which open groups it
   includes is the trigger's ``scope`` (:data:`CLOSING`, :data:`CHANGED`, :data:`OPEN`);
3. the engine decides each row's kind from those flags and an early trigger's rule (one that
   keeps a row count reads the accumulators of the rows it looks at, :meth:`KindState.accumulators`,
   and hands back the counts' marks it moved, :meth:`KindState.set_marks`), then asks the kind for
   the chosen rows' values (:meth:`KindState.values`: a sliding window's are computed from its
   partials, the others' finished from the accumulators held), tells it which rows were emitted
   (:meth:`KindState.mark_emitted`) and which groups it changed in place (:meth:`KindState.touch`:
   a trigger's row count, a written row), and keeps the rows it wrote where a retraction may
   have to repeat them (:attr:`StateBase.written`);
4. :meth:`KindState.evict` drops what the kind's retention rule says no row can reach any more.

What a store must write is asked separately, once per commit: every kind holds its state as
columns and hands its changes over as :class:`ColumnChanges`, which a commit writes as one
segment; a restart hands the stored groups back as columns too (:class:`StoredColumns`,
:meth:`KindState.restore`).
Cap errors, failed merges and value columns are written once, in :class:`StateBase`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat, zip_longest
from operator import itemgetter
from typing import Any, ClassVar, Iterable, NamedTuple, NoReturn, Protocol, Sequence

import numpy as np

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.spec.window import WindowKindSpec
from ematix_dagster.streaming.aggregators import Aggregator
from ematix_dagster.streaming.emitted import Column, Emitted, GroupKey, plain
from ematix_dagster.streaming.kinds.kind import WindowKind
from state_store.int_key_column import taken
from state_store.segment_replay import SegmentFacts

#: one group's accumulators, one per aggregation
Accumulators = list[Any]
#: one group without its accumulators: the window's dict slot, the key tuple, the accumulator list
#: (measured with tracemalloc by ``tests/streaming/test_state_size.py``)
GROUP_BYTES = 150
#: each group_by value in the key tuple (a slot and a short string)
KEY_VALUE_BYTES = 60

#: a report's scope (the emit trigger's, docs/contract/emission.md): windows that close and
#: groups emitted before only (the watermark trigger: an open window waits for it) ...
CLOSING = "closing"
#: ... and the changed groups of open windows (``every_batch``, ``count``) ...
CHANGED = "changed"
#: ... and every group of open windows never emitted (``interval``, when it fires)
OPEN = "open"

#: a written row as a retraction repeats it: the window's end and the row's values
WrittenRow = tuple[int, tuple[Any, ...]]


def _no_ints() -> np.ndarray:
    return np.zeros(0, np.int64)


def _no_flags() -> np.ndarray:
    return np.zeros(0, bool)


@dataclass
class Report:
    """What one batch did to a kind's state, one entry per (window, group) it may emit a row for.

    ``changed``: the group took accepted rows in the batch (a session: created, extended or
    merged). ``emitted``: a ``final`` or ``correction`` of it was written, or its window closed
    before the batch (then nothing but a correction may follow). ``closed``: the window is final at
    the new watermark. ``handles`` are the kind's own positions: what :meth:`KindState.accumulators`
    reads a row's values from.

    Every field but ``keys`` and ``gone`` is a NumPy array (int64 times and handles, bool flags): a
    fixed window closing reports tens of thousands of groups at once, and the emission decides,
    orders and hands their rows to Arrow as whole columns.
    """

    starts: np.ndarray = field(default_factory=_no_ints)
    ends: np.ndarray = field(default_factory=_no_ints)
    #: a list, or a column of int keys (``state_store.int_key_column``)
    keys: Sequence[GroupKey] = field(default_factory=list)
    changed: np.ndarray = field(default_factory=_no_flags)
    emitted: np.ndarray = field(default_factory=_no_flags)
    closed: np.ndarray = field(default_factory=_no_flags)
    handles: np.ndarray = field(default_factory=_no_ints)
    #: rows written earlier whose (window start, key) no longer exists: retracted as written (kind
    #: ``retract``)
    gone: Emitted = field(default_factory=Emitted)

    def __len__(self) -> int:
        return len(self.handles)


class StoredGroup(NamedTuple):
    """One restored group as a row (a row of schema 7, or the group a failed check names; a restore
    takes them as :class:`StoredColumns`): a kind's window start, the window's end, the group key,
    its accumulators and (sessions) whether it was emitted (None: follows from W)."""

    start: int
    end: int | None
    key: GroupKey
    accs: Accumulators
    emitted: bool | None = None


#: what pads the accumulator column of a group that stored fewer accumulators than another
#: (:attr:`StoredColumns.ragged`); never an accumulator
MISSING: Any = object()


@dataclass
class StoredColumns:
    """Restored groups as columns: row r is the group ``keys[r]`` at ``starts[r]``, ``ends[r]``
    (None: not stored), ``emitted[r]`` (None, or no column at all: not stored) and ``accs[i][r]``
    for accumulator i.

    A restore of millions of groups spent most of its time making one object per group on the
    way from the store's columns to the state's; held as columns, a restore checks and loads them
    with a few whole-column operations. Rows (:meth:`rows`) are made only to name a group that
    does not fit, and for the stores' rows of schema 7 (:meth:`from_rows`). Groups that stored
    different numbers of accumulators (a damaged segment) are kept ``ragged``: their columns are
    padded with :data:`MISSING`, so that the check finds them and :meth:`rows` gives each group
    exactly what it stored.
    """

    starts: Sequence[int]
    ends: Sequence[int | None]
    keys: Sequence[GroupKey]
    accs: list[list[Any]]
    emitted: Sequence[bool | None] | None = None
    ragged: bool = False

    @classmethod
    def of(cls, starts: Sequence[int], ends: Sequence[int | None], keys: Sequence[GroupKey],
           accs: Sequence[Sequence[Any]], emitted: Sequence[bool | None] | None = None) -> StoredColumns:
        """Columns of groups whose accumulators come one sequence per group, ``accs[r]`` (turned
        into columns at C speed)."""
        if len(set(map(len, accs))) <= 1:
            return cls(starts, ends, keys, list(map(list, zip(*accs))), emitted)
        return cls(starts, ends, keys, list(map(list, zip_longest(*accs, fillvalue=MISSING))), emitted, ragged=True)

    @classmethod
    def from_rows(cls, rows: Iterable[StoredGroup]) -> StoredColumns:
        """The columns of ``rows``."""
        rows = list(rows)
        if not rows:
            return cls([], [], [], [])
        starts, ends, keys, accs, emitted = zip(*rows)
        return cls.of(starts, ends, keys, accs, emitted)

    def rows(self) -> list[StoredGroup]:
        """One row per group, with exactly the accumulators it stored."""
        accs: Iterable[tuple[Any, ...]] = zip(*self.accs) if self.accs else repeat((), len(self.keys))
        lists = ([acc for acc in row if acc is not MISSING] for row in accs) if self.ragged else map(list, accs)
        emitted = self.emitted if self.emitted is not None else repeat(None)
        return list(map(StoredGroup, self.starts, self.ends, self.keys, lists, emitted))

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class ColumnChanges:
    """What changed since the last commit of a kind's state (fixed windows' groups, sessions,
    sliding partials), handed over as its columns: a commit encodes them into one segment (``state_store.segments``)
    without an object per row. Upserts are row r of ``starts``, ``ends``, ``keys``, ``emitted``
    (None: the kind stores no flag) and ``accs`` (one object column per aggregator); a store applies
    ``deletes`` and ``deleted_before`` first. With ``key_rows``, ``keys`` holds each key once and
    row r's key is ``keys[key_rows[r]]``: a sliding state's partials share their keys, and a commit
    then encodes each key once instead of once per partial."""

    starts: np.ndarray
    ends: np.ndarray
    keys: Sequence[GroupKey]  # a list, or a column of int keys (``state_store.int_key_column``)
    accs: list[np.ndarray]
    emitted: np.ndarray | None = None
    deletes: list[tuple[int, GroupKey]] = field(default_factory=list)
    deleted_before: int | None = None
    key_rows: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.starts) + len(self.deletes) + (self.deleted_before is not None)

    def row_keys(self) -> Sequence[GroupKey]:
        """Each upserted row's key."""
        return self.keys if self.key_rows is None else taken(self.keys, self.key_rows)


@dataclass
class StoredSize:
    """What the store holds of a columnar state (schema step 8), for the compaction rule
    (``streaming.durable``): the facts of each stored segment in order, so that a commit can tell
    which prefix of them is dead without reading them back, and whether the state was restored
    from rows of schema 7 (the next commit replaces them with a base)."""

    segments: list[SegmentFacts] = field(default_factory=list)
    from_rows: bool = False


class KindState(Protocol):
    """The driver state of one window kind (see the module docstring for the order of calls)."""

    pipeline: str
    aggregators: Sequence[Aggregator]
    aliases: Sequence[str]
    kind: WindowKind

    def merge(self, starts: Sequence[int], keys: Sequence[GroupKey], partials: Sequence[Sequence[Any]],
              lasts: Sequence[int] = ()) -> None:
        """Fold one batch's partials in: row r is ``keys[r]`` at ``starts[r]`` (a fixed window's
        start, a sliding window's event time, a partial session's first event time, ``lasts[r]``
        its last), ``partials[i][r]`` for aggregator i."""

    written: dict[int, dict[GroupKey, WrittenRow]]
    keeps_written: bool
    #: ``merge`` takes starts, and the partials an aggregator folds as an array
    #: (``Aggregator.array_partials``), as NumPy arrays
    typed_partials: bool

    def report(self, before: int | None, watermark: int | None, retention: int, scope: str = CLOSING) -> Report:
        """The batch's candidate rows now that W moved from ``before`` to ``watermark``.

        ``scope`` says which groups of windows still open (and never emitted) are included besides
        (:data:`CHANGED`, :data:`OPEN`). Under the watermark trigger they write no row, and leaving
        them out keeps a batch's cost to the windows that close or were emitted.
        """

    def accumulators(self, report: Report, rows: np.ndarray) -> list[Accumulators]:
        """The accumulators of ``report``'s rows ``rows`` (what their values are computed from)."""

    def set_marks(self, report: Report, rows: np.ndarray, marks: Sequence[Any]) -> None:
        """The hidden row count (the last accumulator) of ``report``'s rows ``rows`` is now
        ``marks``: an early trigger moved where it counts from. The kind keeps its accumulators
        its own way, so the engine hands the marks back rather than editing what it was lent."""

    def mark_emitted(self, report: Report, rows: np.ndarray) -> None:
        """``report``'s rows ``rows`` were written as ``final`` or ``correction``."""

    def remember(self, starts: Column, ends: Column, keys: Sequence[GroupKey], values: Sequence[Column]) -> None:
        """Rows written this batch are the last of their keys (:attr:`written`)."""

    def touch(self, report: Report, rows: np.ndarray) -> None:
        """``report``'s rows ``rows`` changed without taking rows (their trigger count moved, or
        :attr:`written` did): the next commit writes them."""

    def evict(self, watermark: int | None, retention: int) -> None:
        """Drop what no accepted row can reach any more (``retention``: how long ``reopen`` keeps
        emitted windows)."""

    stored_size: StoredSize

    def take_column_changes(self, everything: bool = False) -> ColumnChanges:
        """What changed since the last call as columns (``everything``: every held row, for a base
        segment); a store writes it as one segment, and without a store it is forgotten."""

    def restore(self, groups: StoredColumns, watermark: int | None) -> None:
        """Continue from the groups a store replayed (as :meth:`take_column_changes` handed them
        over), into empty state: as columns, so that a restart makes no object per group on the way
        from the store's columns to the kind's."""

    @property
    def group_count(self) -> int:
        """What ``max_groups_per_window`` caps."""

    @property
    def window_count(self) -> int:
        """Windows held (reported as ``windows_open``)."""

    @property
    def state_rows(self) -> int:
        """The state's size as reported (``state_groups``)."""

    @property
    def flush_watermark(self) -> int | None:
        """The watermark at which every held window is final (None: nothing held)."""

    def open_windows(self, watermark: int | None) -> int:
        """Windows not emitted yet at ``watermark``."""

    def describe(self, start: int, key: GroupKey | None = None) -> str:
        """The window a row at ``start`` (of ``key``) is in, for messages."""

    def values(self, report: Report, rows: np.ndarray) -> list[Column]:
        """The finished values of ``report``'s rows ``rows``, one column per aggregation (what the
        rows write; a kind that holds its accumulators as columns finishes them from there; a
        typed column may stay a NumPy array)."""


@dataclass
class StateBase:
    """What every kind's state shares: its pipeline, aggregators and group cap, and the errors and
    value columns written once for all kinds."""

    pipeline: str
    aggregators: Sequence[Aggregator]
    aliases: Sequence[str]
    max_groups_per_window: int
    kind: WindowKind
    #: keep :attr:`written` (``[target] retractions = true``; session windows always, whose keys
    #: may disappear after any row was written for them)
    keeps_written: bool = False
    #: whether ``merge`` takes NumPy arrays where it can (:class:`KindState`): Python values here
    typed_partials: ClassVar[bool] = False
    #: window start -> key -> the last row written for it, while the group is held: what a
    #: retraction repeats (a session's early row, or any row under ``retractions``); stored with
    #: the group
    written: dict[int, dict[GroupKey, WrittenRow]] = field(default_factory=dict, repr=False)
    stored_size: StoredSize = field(default_factory=StoredSize, repr=False)

    def remember(self, starts: Column, ends: Column, keys: Sequence[GroupKey], values: Sequence[Column]) -> None:
        """Rows written this batch (``values``: one column per aggregation) are the last of their
        keys, as Python values (a store encodes them; a NumPy scalar is not a value it knows)."""
        written = self.written
        values = [plain(column) for column in values]
        for start, end, key, row in zip(plain(starts), plain(ends), keys, zip(*values) if values else repeat(())):
            by_key = written.get(start)
            if by_key is None:
                by_key = written[start] = {}
            by_key[key] = (end, row)

    def describe(self, start: int, key: GroupKey | None = None) -> str:
        """The window a row at ``start`` is in, for messages."""
        return self.kind.describe_at(start)

    def cap_hit(self, cap: str, held: str, key: GroupKey, start: int) -> StateCapExceeded:
        """A cap would be passed by ``key`` arriving at ``start``: ``cap`` names it (``name=value``),
        ``held`` says what already holds it."""
        return StateCapExceeded(f"window state cap hit: {cap} {held} when group {key!r:.200} arrives in "
                                f"{self.describe(start, key)}, for pipeline {self.pipeline}")

    def failed_merge(self, exc: Exception, index: int | None, key: GroupKey, start: int) -> NoReturn:
        """Raise ``exc`` again, naming the pipeline, the window, the group and (``index``) the
        aggregation."""
        where = f"{self.describe(start, key)} group {key!r:.200}"
        alias = "" if index is None else f" ({self.aliases[index]})"
        if isinstance(exc, StateCapExceeded):
            raise StateCapExceeded(f"window state cap hit: {exc}{alias} on {where} for pipeline {self.pipeline}") from None
        raise type(exc)(f"{exc}:{alias} on {where} for pipeline {self.pipeline}") from None

    @staticmethod
    def bytes_per_group(aggregators: Sequence[Aggregator], key_width: int) -> int:
        """Driver memory one held group takes (``streaming.state_size``): the layout's own bytes
        plus its accumulators'."""
        return GROUP_BYTES + KEY_VALUE_BYTES * key_width + sum(a.state_bytes for a in aggregators)

    def value_columns(self, accumulators: Sequence[Accumulators]) -> list[list[Any]]:
        """The finished values of groups' ``accumulators``, one column per aggregation (each
        aggregator over its whole column at once)."""
        return self.finished([list(map(itemgetter(i), accumulators)) if not agg.hidden else []
                              for i, agg in enumerate(self.aggregators)])

    def finished(self, columns: Sequence[list[Any]]) -> list[list[Any]]:
        """The finished values of accumulator ``columns`` (one per aggregator), one column per
        aggregation (the hidden ones write none)."""
        return [agg.result_column(column) for agg, column in zip(self.aggregators, columns) if not agg.hidden]


class StatefulKind(WindowKind):
    """A window kind whole: its rules (a :class:`WindowKind`), the spec kinds they run and the driver
    state its windows are kept in. Each kind's folder joins its rules and its state in one
    (``kinds/fixed/fixed_kind.py``), so neither of those two modules imports the other's; the
    registry (``streaming.kinds.KINDS``) lists them."""

    #: the spec kinds these rules run (their ``name`` is the spec's ``kind``)
    specs: ClassVar[tuple[type[WindowKindSpec], ...]]
    #: the driver state of this kind's windows (:meth:`make_state`)
    state_class: ClassVar[type[StateBase]]

    def make_state(self, pipeline: str, aggregators: Sequence[Aggregator], aliases: Sequence[str],
                   max_groups_per_window: int) -> KindState:
        """An empty driver state of this kind."""
        return self.state_class(pipeline, aggregators, aliases, max_groups_per_window, self)  # type: ignore[return-value]
