"""Session windows: rules (``session_rules``), driver state (``session_state``, its merges: ``session_merge``) and the
kind joining them (``session_kind``)."""

from ematix_dagster.streaming.kinds.sessions.session_kind import SessionKind
from ematix_dagster.streaming.kinds.sessions.session_rules import SessionWindows, session_id, session_ids
from ematix_dagster.streaming.kinds.sessions.session_state import SessionState

__all__ = ["SessionKind", "SessionState", "SessionWindows", "session_id", "session_ids"]
