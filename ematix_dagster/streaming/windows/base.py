"""What a window kind decides, so the engine never assumes "a start plus one fixed duration".

Tumbling and hopping windows (``fixed``) are fixed-size; session and KIP-450 sliding windows
(SPEC.md §8, §9) are not: a window's end depends on the rows in it and, for sliding windows, is
inclusive. Everything that differs between kinds sits behind :class:`WindowKind`; the engine
only asks it. Times are microseconds since the epoch (UTC).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, NamedTuple

from ematix_dagster.streaming.windows.units import format_window

if TYPE_CHECKING:
    from ematix_dagster.spec import Window


class WindowBounds(NamedTuple):
    """A window's identity in memory: its start and its end, as the kind defines the end."""

    start: int
    end: int


class WindowKind(ABC):
    """The rules of one window kind.

    ``closed_before`` is the threshold an (assignment to a) window is judged late against: the
    watermark before the batch, less the retention under ``reopen``.
    """

    @classmethod
    @abstractmethod
    def for_window(cls, window: Window) -> WindowKind:
        """The rules for one window spec of this kind, in microseconds."""

    @classmethod
    @abstractmethod
    def fingerprint(cls, window: Window) -> dict[str, Any]:
        """The spec's sizes that the stored state depends on (SPEC.md §7), by fingerprint key."""

    @abstractmethod
    def bounds(self, start: int) -> WindowBounds:
        """The window a partial keyed by ``start`` updates."""

    @abstractmethod
    def row_windows(self, t: int, closed_before: int | None) -> list[WindowBounds]:
        """The late rule: the windows a row at event time ``t`` still updates, oldest first (none:
        the row is late). The kind's Spark plan applies the same rule to whole batches."""

    @abstractmethod
    def is_final(self, window: WindowBounds, watermark: int | None) -> bool:
        """``window`` is complete at ``watermark`` and is emitted as ``final``."""

    @abstractmethod
    def is_evicted(self, window: WindowBounds, watermark: int | None, retention: int) -> bool:
        """An emitted ``window`` is dropped from state (``retention``: how long ``reopen`` keeps it)."""

    @abstractmethod
    def expected_open_windows(self, lateness: int, retention: int) -> int:
        """How many windows of one group are held at once in steady state: open until the watermark
        (``lateness`` behind the newest event) passes them, then ``retention`` longer."""

    def valid_end(self, start: int, end: int) -> bool:
        """``end`` can be the end of a window of this kind starting at ``start`` (a stored end is
        checked with it on restore and by ``ematix-dagster check``)."""
        return end == self.bounds(start).end

    def describe(self, window: WindowBounds) -> str:
        """The window for messages a human reads."""
        return format_window(window.start, window.end)
