"""What a batch emits, as the target's columns.

A fixed window emits all its groups at once, tens of thousands of them in one batch: they go from
the window state to the Arrow table the target writes (``spark.convert.rows_to_arrow``) as
columns (``streaming.emission``), where a Python object per row cost more than merging the
batch. :class:`EmittedRow` is for the few rows built one by one (a session's retractions).

>>> out = Emitted()
>>> out.add_columns([0, 0], [60, 60], [("a",), ("b",)], [[2, 5]], ["final", "final"])
>>> out.add_rows([EmittedRow(60, 120, ("a",), (1,), "correction")])
>>> len(out), out.count("final"), out.rows[2]
(3, 2, EmittedRow(start=60, end=120, key=('a',), values=(1,), kind='correction'))
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Iterable, NamedTuple, Sequence

from state_store.int_key_column import chained, taken

GroupKey = tuple[Any, ...]


class EmittedRow(NamedTuple):
    """One output row: window bounds, group key, finished values."""

    start: int
    end: int
    key: GroupKey
    values: tuple[Any, ...]
    kind: str  # "final" | "correction" | "retract"


@dataclass
class Emitted:
    """A batch's output rows as columns, in output order (``values``: one column per aggregation)."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    #: a list, or a column of int keys (``state_store.int_key_column``: to Arrow without a tuple per row)
    keys: Sequence[GroupKey] = field(default_factory=list)
    values: list[list[Any]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    #: rows by kind, counted once (a batch's report and metrics ask for each kind)
    _counts: Counter[str] | None = field(default=None, init=False, repr=False, compare=False)

    def add_columns(self, starts: Sequence[int], ends: Sequence[int], keys: Sequence[GroupKey],
                    values: Sequence[Sequence[Any]], kinds: Sequence[str]) -> None:
        """Rows given as columns (``values``: one column per aggregation)."""
        self.starts.extend(starts)
        self.ends.extend(ends)
        self.keys = chained(self.keys, keys)
        self.kinds.extend(kinds)
        self._counts = None
        if not self.values:
            self.values = [[] for _ in values]
        for column, more in zip(self.values, values):
            column.extend(more)

    def select(self, rows: Sequence[int]) -> Emitted:
        """The rows at positions ``rows``, in that order."""
        out = Emitted()
        if rows:
            out.add_columns(list(map(self.starts.__getitem__, rows)), list(map(self.ends.__getitem__, rows)),
                            taken(self.keys, rows),
                            [list(map(column.__getitem__, rows)) for column in self.values],
                            list(map(self.kinds.__getitem__, rows)))
        return out

    def add_rows(self, rows: Iterable[EmittedRow]) -> None:
        rows = list(rows)
        if not rows:
            return
        starts, ends, keys, values, kinds = zip(*rows)
        self.starts.extend(starts)
        self.ends.extend(ends)
        self.keys = chained(self.keys, keys)
        self.kinds.extend(kinds)
        self._counts = None
        if not self.values:
            self.values = [[] for _ in values[0]]
        for column, more in zip(self.values, zip(*values)):
            column.extend(more)

    def __len__(self) -> int:
        return len(self.kinds)

    def count(self, kind: str) -> int:
        if self._counts is None:
            self._counts = Counter(self.kinds)
        return self._counts[kind]

    @property
    def rows(self) -> list[EmittedRow]:
        """Row by row (built on each access: for tests, messages and session ids)."""
        values = zip(*self.values) if self.values else repeat(())
        return list(map(EmittedRow, self.starts, self.ends, self.keys, values, self.kinds))
