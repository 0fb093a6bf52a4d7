"""Tumbling and hopping windows whole: the rules (``fixed_rules``), the spec kinds they run and the driver state
they are kept in (``fixed_state``). The state imports the rules and the rules never import the state: this
module joins them, so the folder has no import circle."""

from __future__ import annotations

from ematix_dagster.spec.window import HoppingSpec, TumblingSpec
from ematix_dagster.streaming.kinds.fixed.fixed_rules import FixedWindows
from ematix_dagster.streaming.kinds.fixed.fixed_state import FixedState
from ematix_dagster.streaming.kinds.kind_state import StatefulKind


class FixedKind(FixedWindows, StatefulKind):
    """Tumbling and hopping windows: :class:`FixedWindows` with :class:`FixedState`."""

    specs = (TumblingSpec, HoppingSpec)
    state_class = FixedState
