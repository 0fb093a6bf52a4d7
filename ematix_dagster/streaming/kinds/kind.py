"""What a window kind decides, so the engine never assumes "a start plus one fixed duration".

Tumbling and hopping windows (``fixed``) are fixed-size; session and KIP-450 sliding windows
(docs/contract/windows.md) are not: a window's end depends on the rows in it and, for sliding windows, is
inclusive. Everything that differs between kinds sits behind :class:`WindowKind` (the rules) and
``kind_state.KindState`` (the driver state); the engine only asks them. What the spec knows of a
kind (its keys, hop, backfills) is its ``spec.window.WindowKindSpec``. Times are microseconds since
the epoch (UTC).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ematix_dagster.streaming.bounds import WindowBounds
from ematix_dagster.streaming.emitted import Column
from ematix_dagster.streaming.kinds.time_units import format_window

if TYPE_CHECKING:
    from typing import Self

    from ematix_dagster.spec import Window


class WindowKind(ABC):
    """The rules of one window kind: which windows a row updates, when they are final and evicted,
    and its output columns. ``kind_state.StatefulKind`` adds its driver state.

    ``closed_before`` is the threshold an (assignment to a) window is judged late against: the
    watermark before the batch, less the retention under ``reopen``.
    """

    #: a column the kind adds to its output after the window bounds (:meth:`row_ids` fills it)
    id_column: str | None = None
    #: no start names a window's end, so each group's stored end and emitted flag are restored
    #: (false for :class:`KeyedByStart` kinds, whose start names it)
    ends_stored: bool = True
    #: what the driver-memory estimate multiplies the group cap by, in words (``streaming.state_size``)
    held: str = "open windows"
    #: the noun ``ematix-dagster state`` counts each key's stored rows in (None: a row per window)
    rows_per_key: str | None = None

    @classmethod
    @abstractmethod
    def for_window(cls, window: Window) -> Self:
        """The rules for one window spec of this kind, in microseconds."""

    @abstractmethod
    def row_windows(self, t: int, closed_before: int | None) -> list[WindowBounds]:
        """The late rule: the windows a row at event time ``t`` still updates, oldest first (none:
        the row is late). The kind's Spark plan applies the same rule to whole batches."""

    @abstractmethod
    def is_final(self, window: WindowBounds, watermark: int | None) -> bool:
        """``window`` is complete at ``watermark`` and is emitted as ``final``."""

    @abstractmethod
    def evicted_before(self, watermark: int | None, retention: int) -> int | None:
        """The window end below which an emitted window is dropped from state (``retention``: how
        long ``reopen`` keeps it; None: nothing is). The kind's one eviction rule: a window, a
        column of written rows (:meth:`evicted`) and the state's own eviction are all judged by it,
        so a row the emission remembers is never one its eviction drops."""

    def is_evicted(self, window: WindowBounds, watermark: int | None, retention: int) -> bool:
        """An emitted ``window`` is dropped from state."""
        bound = self.evicted_before(watermark, retention)
        return bound is not None and window.end < bound

    def evicted(self, ends: np.ndarray, watermark: int | None, retention: int) -> np.ndarray:
        """Which of the windows ending at ``ends`` are dropped from state, as :meth:`is_evicted`
        says of each: one comparison over a whole column, for an emission of many rows."""
        bound = self.evicted_before(watermark, retention)
        return np.zeros(len(ends), bool) if bound is None else ends < bound

    @abstractmethod
    def expected_open_windows(self, lateness: int, retention: int) -> int:
        """How many windows of one group are held at once in steady state: open until the watermark
        (``lateness`` behind the newest event) passes them, then ``retention`` longer."""

    @abstractmethod
    def valid_end(self, start: int, end: int) -> bool:
        """``end`` can be the end of a window of this kind starting at ``start`` (a stored end is
        checked with it on restore and by ``ematix-dagster check``)."""

    @abstractmethod
    def end_rule(self, start: int) -> str:
        """What :meth:`valid_end` allows for ``start``, in words."""

    @abstractmethod
    def describe_at(self, start: int) -> str:
        """The window a row keyed by ``start`` is in, for messages."""

    def describe(self, window: WindowBounds) -> str:
        """The window for messages a human reads."""
        return format_window(window.start, window.end)

    def row_ids(self, pipeline: str, encoded_keys: Sequence[bytes], starts: Column) -> list[int]:
        """The :attr:`id_column` of rows of ``encoded_keys`` (the store's key encoding) at ``starts``."""
        raise TypeError(f"{type(self).__name__} adds no id column")


class KeyedByStart(WindowKind):
    """A kind whose window follows from the start it is keyed by (fixed and sliding windows: a
    sliding window is keyed by its end, an event time, and stored with start = end = it)."""

    ends_stored = False

    @abstractmethod
    def bounds(self, start: int) -> WindowBounds:
        """The window a partial keyed by ``start`` updates."""

    def valid_end(self, start: int, end: int) -> bool:
        return end == self.bounds(start).end

    def end_rule(self, start: int) -> str:
        return str(self.bounds(start).end)

    def describe_at(self, start: int) -> str:
        return f"window {self.describe(self.bounds(start))}"
