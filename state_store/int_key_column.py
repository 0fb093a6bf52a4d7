"""Group keys of one integer column, held as that column.

The most common group key is one integer (a user or device id). A batch brings tens of thousands of
them from Spark's Arrow table, a window state holds them as int64 ids already
(``ematix_dagster.streaming.kinds.state_keys.IntKeys``), and a commit encodes them again: built as one
tuple per key in between, the keys cost more than the merge they served. :class:`IntKeyColumn` hands
the column itself along, and reads as the keys it holds, one-element tuples, wherever code walks
keys one by one.

>>> keys = IntKeyColumn(np.array([7, -3, 7]))
>>> len(keys), keys[1], list(keys[1:]), list(keys)
(3, (-3,), [(-3,), (7,)], [(7,), (-3,), (7,)])
"""

from __future__ import annotations

from typing import Iterator, Sequence, overload

import numpy as np
import pyarrow as pa


class IntKeyColumn(Sequence[tuple[int]]):
    """Keys ``(v,)`` for each int64 ``v`` of ``ids``."""

    __slots__ = ("ids",)

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids.astype(np.int64, copy=False)

    @classmethod
    def of_arrow(cls, column: pa.Array | pa.ChunkedArray) -> IntKeyColumn | None:
        """The column of an Arrow group-by column of signed integers without a NULL; None for any
        other (their keys are tuples of what ``to_pylist`` gives)."""
        if not pa.types.is_signed_integer(column.type) or column.null_count:
            return None
        return cls(column.to_numpy())

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, at: int) -> tuple[int]: ...

    @overload
    def __getitem__(self, at: slice) -> IntKeyColumn: ...

    def __getitem__(self, at: int | slice) -> tuple[int] | IntKeyColumn:
        if isinstance(at, slice):
            return IntKeyColumn(self.ids[at])
        return (int(self.ids[at]),)

    def __iter__(self) -> Iterator[tuple[int]]:
        return zip(self.ids.tolist())

    def take(self, rows: Sequence[int] | np.ndarray) -> IntKeyColumn:
        """The keys at positions ``rows``, in that order."""
        return IntKeyColumn(self.ids[np.asarray(rows, dtype=np.int64)])

    def __repr__(self) -> str:
        return f"IntKeyColumn({self.ids.tolist()!r})"


def taken(keys: Sequence[tuple], rows: Sequence[int] | np.ndarray) -> Sequence[tuple]:
    """The keys at positions ``rows``, in that order: a column stays a column.

    >>> taken(IntKeyColumn(np.array([5, 6])), [1, 0]), taken([("a",), ("b",)], np.array([1]))
    (IntKeyColumn([6, 5]), [('b',)])
    """
    if isinstance(keys, IntKeyColumn):
        return keys.take(rows)
    return list(map(keys.__getitem__, rows.tolist() if isinstance(rows, np.ndarray) else rows))


def chained(held: Sequence[tuple], more: Sequence[tuple]) -> Sequence[tuple]:
    """``held``, then ``more``: ``more`` itself where nothing is held (a column stays a column),
    else a list (``held`` itself, extended, where it is one).

    >>> chained([], IntKeyColumn(np.array([3]))), chained(IntKeyColumn(np.array([1])), [("a",)])
    (IntKeyColumn([3]), [(1,), ('a',)])
    """
    if isinstance(more, IntKeyColumn) and not len(held):
        return more
    out = held if isinstance(held, list) else list(held)
    out.extend(more)
    return out
