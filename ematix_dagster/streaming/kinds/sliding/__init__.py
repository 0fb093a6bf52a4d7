"""Sliding windows: rules (``sliding_rules``), driver state (``sliding_state``, its windows" values: ``sliding_windows``) and the
kind joining them (``sliding_kind``)."""

from ematix_dagster.streaming.kinds.sliding.sliding_kind import SlidingKind
from ematix_dagster.streaming.kinds.sliding.sliding_rules import SlidingWindows
from ematix_dagster.streaming.kinds.sliding.sliding_state import SlidingState

__all__ = ["SlidingKind", "SlidingState", "SlidingWindows"]
