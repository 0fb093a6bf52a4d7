"""Window kinds: which windows a row or a partial updates, when they close, finish and go, and the
driver state they are kept in.

One folder per kind: ``fixed`` (tumbling, hopping), ``sessions`` and ``sliding``, each with its
rules (a :class:`WindowKind`, ``kind``), its driver state (a ``KindState``, ``kind_state``) and the
kind joining them (a :class:`StatefulKind`); what the spec knows of a kind (its keys, hop,
backfills) is its ``spec.window.WindowKindSpec``. The registry is explicit: :data:`KINDS` lists the
kinds, :data:`KINDS_BY_NAME` is built from it by the spec names each runs. A new kind is a folder,
a line in :data:`KINDS`, a ``WindowKindSpec`` in ``spec.window.ALL_WINDOW_KINDS`` and a Spark plan
registered in ``ematix_dagster.spark.plans.windows.PLANS``, all by its spec name; no engine module
changes. Times are microseconds since the epoch (UTC).

>>> list(window_starts(125, duration=100, hop=40))
[40, 80, 120]
>>> list(window_starts(60, duration=60, hop=60))
[60]
>>> hopping = FixedWindows(duration=100, hop=40)
>>> hopping.row_windows(125, closed_before=None)
[WindowBounds(start=40, end=140), WindowBounds(start=80, end=180), WindowBounds(start=120, end=220)]
>>> hopping.row_windows(125, closed_before=150)  # [40, 140) is closed
[WindowBounds(start=80, end=180), WindowBounds(start=120, end=220)]
>>> hopping.is_final(hopping.bounds(40), watermark=140), hopping.is_evicted(hopping.bounds(40), 140, retention=5)
(True, False)
>>> sorted(KINDS_BY_NAME)
['hopping', 'session', 'sliding', 'tumbling']
"""

from __future__ import annotations

from ematix_dagster.spec import Window
from ematix_dagster.streaming.kinds.fixed import FixedKind, FixedWindows, first_start, last_start, window_starts
from ematix_dagster.streaming.kinds.kind import KeyedByStart, WindowBounds, WindowKind
from ematix_dagster.streaming.kinds.kind_state import StatefulKind
from ematix_dagster.streaming.kinds.sessions import SessionKind, SessionWindows
from ematix_dagster.streaming.kinds.sliding import SlidingKind, SlidingWindows
from ematix_dagster.streaming.kinds.time_units import MICROS_PER_MS, format_us, format_window

#: every window kind the engine runs (a new kind adds its line here)
KINDS: tuple[type[StatefulKind], ...] = (FixedKind, SessionKind, SlidingKind)
#: spec ``kind`` -> the kind that runs it (built from :data:`KINDS`)
KINDS_BY_NAME: dict[str, type[StatefulKind]] = {spec.name: kind for kind in KINDS for spec in kind.specs}


def window_kind(window: Window) -> StatefulKind:
    """The kind of ``window`` (its rules and state), in microseconds."""
    return KINDS_BY_NAME[window.kind].for_window(window)


__all__ = [
    "KINDS", "KINDS_BY_NAME", "MICROS_PER_MS", "FixedKind", "FixedWindows", "KeyedByStart", "SessionKind",
    "SessionWindows", "SlidingKind", "SlidingWindows", "StatefulKind", "WindowBounds", "WindowKind", "first_start",
    "format_us", "format_window", "last_start", "window_kind", "window_starts",
]
