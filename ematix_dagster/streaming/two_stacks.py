"""A FIFO aggregate over any associative merge: the sliding windows' way to avoid re-scanning.

Each sliding window ``[t - D, t]`` is the merge of the partials between its bounds, and the next
window of the key drops a few partials at the old end and adds a few at the new one. Most
aggregators cannot *subtract* a partial (min, max, distinct sets, sketches), so a running total
does not work; two stacks do (the "two-stacks" sliding-window aggregation): new partials go on
the back stack with a running merge, and when the oldest must go and the front stack is empty,
the back stack is moved over, each entry then holding the merge of itself and everything newer
on the front. Every partial is merged a constant number of times, and the window's value is one
merge of the two stacks' totals. ``None`` is the empty accumulator of every aggregator.

>>> queue = TwoStacks(lambda a, b: a if b is None else b if a is None else max(a, b))
>>> for value in (3, 1, 2):
...     queue.push(value)
>>> queue.total()
3
>>> queue.pop(); queue.total()
2
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class TwoStacks(Generic[T]):
    """Push at the new end, pop at the old end, the merge of what is held in O(1) amortised merges."""

    __slots__ = ("merge", "_front", "_back", "_back_total")

    def __init__(self, merge: Callable[[T | None, T | None], T | None]) -> None:
        self.merge = merge
        self._front: list[T | None] = []  # running merges, oldest entry on top (last)
        self._back: list[T] = []  # values as pushed
        self._back_total: T | None = None

    def __len__(self) -> int:
        return len(self._front) + len(self._back)

    def push(self, value: T) -> None:
        self._back.append(value)
        self._back_total = self.merge(self._back_total, value)

    def pop(self) -> None:
        """Drop the oldest value."""
        if not self._front:
            merge, total = self.merge, None
            front = self._front
            for value in reversed(self._back):  # newest first: each entry merges what is newer
                total = merge(value, total)
                front.append(total)
            self._back, self._back_total = [], None
        self._front.pop()

    def total(self) -> Any:
        """The merge of every value held (None when empty)."""
        front = self._front[-1] if self._front else None
        return self.merge(front, self._back_total)
