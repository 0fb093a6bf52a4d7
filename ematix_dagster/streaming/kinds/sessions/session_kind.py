"""Session windows whole: the rules (``session_rules``), the spec kinds they run and the driver state
they are kept in (``session_state``). The state imports the rules and the rules never import the state: this
module joins them, so the folder has no import circle."""

from __future__ import annotations

from ematix_dagster.spec.window import SessionSpec
from ematix_dagster.streaming.kinds.kind_state import StatefulKind
from ematix_dagster.streaming.kinds.sessions.session_rules import SessionWindows
from ematix_dagster.streaming.kinds.sessions.session_state import SessionState


class SessionKind(SessionWindows, StatefulKind):
    """Session windows: :class:`SessionWindows` with :class:`SessionState`."""

    specs = (SessionSpec,)
    state_class = SessionState
