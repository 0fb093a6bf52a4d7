"""A window's identity in memory, shared by the kinds' rules and their state."""

from __future__ import annotations

from typing import NamedTuple


class WindowBounds(NamedTuple):
    """A window's start and its end, as its kind defines the end (exclusive for fixed windows,
    inclusive for sliding ones)."""

    start: int
    end: int
