"""Sliding windows whole: the rules (``sliding_rules``), the spec kinds they run and the driver state
they are kept in (``sliding_state``). The state imports the rules and the rules never import the state: this
module joins them, so the folder has no import circle."""

from __future__ import annotations

from ematix_dagster.spec.window import SlidingSpec
from ematix_dagster.streaming.kinds.kind_state import StatefulKind
from ematix_dagster.streaming.kinds.sliding.sliding_rules import SlidingWindows
from ematix_dagster.streaming.kinds.sliding.sliding_state import SlidingState


class SlidingKind(SlidingWindows, StatefulKind):
    """Sliding windows: :class:`SlidingWindows` with :class:`SlidingState`."""

    specs = (SlidingSpec,)
    state_class = SlidingState
