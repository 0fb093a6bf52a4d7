"""Tumbling and hopping windows: rules (``fixed_rules``), driver state (``fixed_state``) and the
kind joining them (``fixed_kind``)."""

from ematix_dagster.streaming.kinds.fixed.fixed_kind import FixedKind
from ematix_dagster.streaming.kinds.fixed.fixed_rules import FixedWindows, first_start, last_start, window_starts
from ematix_dagster.streaming.kinds.fixed.fixed_state import FixedState

__all__ = ["FixedKind", "FixedState", "FixedWindows", "first_start", "last_start", "window_starts"]
