"""What a batch emits, as the target's columns.

A fixed window emits all its groups at once, tens of thousands of them in one batch: they go from
the window state to the Arrow table the target writes (``spark.batch.convert.rows_to_arrow``) as
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

import numpy as np

from state_store.int_key_column import chained, taken

GroupKey = tuple[Any, ...]
#: a column of values: a list, or a NumPy array (see :class:`Emitted`)
Column = Sequence[Any] | np.ndarray


class EmittedRow(NamedTuple):
    """One output row: window bounds, group key, finished values."""

    start: int
    end: int
    key: GroupKey
    values: tuple[Any, ...]
    kind: str  # "final" | "correction" | "retract"


@dataclass
class Emitted:
    """A batch's output rows as columns, in output order (``values``: one column per aggregation).

    A column is a list, or a NumPy array where the window state holds it as one (the window
    bounds of a fixed window's rows, its counts and float sums): those reach Arrow without a
    Python value per row. :attr:`rows` and :meth:`select` give Python values whatever the column.
    """

    starts: Column = field(default_factory=list)
    ends: Column = field(default_factory=list)
    #: a list, or a column of int keys (``state_store.int_key_column``: to Arrow without a tuple per row)
    keys: Sequence[GroupKey] = field(default_factory=list)
    values: list[Column] = field(default_factory=list)
    kinds: Column = field(default_factory=list)
    #: rows by kind, counted once (a batch's report and metrics ask for each kind)
    _counts: Counter[str] | None = field(default=None, init=False, repr=False, compare=False)

    def add_columns(self, starts: Column, ends: Column, keys: Sequence[GroupKey], values: Sequence[Column],
                    kinds: Column) -> None:
        """Rows given as columns (``values``: one column per aggregation), taken as they are when
        none is held yet (an array stays an array)."""
        self._counts = None
        if not len(self):
            self.starts, self.ends, self.keys, self.kinds = starts, ends, keys, kinds
            self.values = list(values)
            return
        self.starts = [*plain(self.starts), *plain(starts)]
        self.ends = [*plain(self.ends), *plain(ends)]
        self.keys = chained(self.keys, keys)
        self.kinds = [*plain(self.kinds), *plain(kinds)]
        self.values = [[*plain(column), *plain(more)] for column, more in zip(self.values, values)]

    def select(self, rows: Column) -> Emitted:
        """The rows at positions ``rows``, in that order (as Python values)."""
        out = Emitted()
        if len(rows):
            out.add_columns(picked(self.starts, rows), picked(self.ends, rows), taken(self.keys, rows),
                            [picked(column, rows) for column in self.values], picked(self.kinds, rows))
        return out

    def add_rows(self, rows: Iterable[EmittedRow]) -> None:
        rows = list(rows)
        if not rows:
            return
        starts, ends, keys, values, kinds = zip(*rows)
        self.add_columns(list(starts), list(ends), list(keys), [list(column) for column in zip(*values)], list(kinds))

    def __len__(self) -> int:
        return len(self.kinds)

    def count(self, kind: str) -> int:
        if self._counts is None:
            self._counts = Counter(plain(self.kinds))
        return self._counts[kind]

    @property
    def rows(self) -> list[EmittedRow]:
        """Row by row, as Python values (built on each access: for tests, messages, session ids and
        the rows ``[emit] sql`` holds back, which a store encodes)."""
        values = zip(*map(plain, self.values)) if self.values else repeat(())
        return list(map(EmittedRow, plain(self.starts), plain(self.ends), self.keys, values, plain(self.kinds)))


def plain(column: Column) -> list[Any]:
    """A column (a list, or a NumPy array) as a list of Python values."""
    return column.tolist() if isinstance(column, np.ndarray) else list(column)


def picked(column: Column, rows: Column) -> list[Any]:
    """The values of ``column`` at positions ``rows``, in that order, as Python values."""
    if isinstance(column, np.ndarray):
        return column[np.asarray(rows, dtype=np.int64)].tolist()
    return list(map(column.__getitem__, rows))
