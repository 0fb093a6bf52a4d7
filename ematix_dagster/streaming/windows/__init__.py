"""Window kinds: which windows a row or a partial updates, when they close, finish and go.

One module per kind behind :class:`WindowKind` (``base``): ``fixed`` (tumbling, hopping),
``session`` and ``sliding``; each builds its driver state (``streaming.state``). A new kind is a
:class:`WindowKind` registered in :data:`KINDS` and a Spark plan registered in
``ematix_dagster.spark.windows.PLANS``, both by its spec name; no engine module changes. Times are
microseconds since the epoch (UTC).

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
"""

from __future__ import annotations

from ematix_dagster.spec import Window
from ematix_dagster.spec.registries import WINDOW_KINDS
from ematix_dagster.streaming.windows.base import KeyedByStart, WindowBounds, WindowKind
from ematix_dagster.streaming.windows.fixed import FixedWindows, first_start, last_start, window_starts
from ematix_dagster.streaming.windows.session import SessionWindows
from ematix_dagster.streaming.windows.sliding import SlidingWindows
from ematix_dagster.streaming.windows.units import MICROS_PER_MS, format_us, format_window

#: spec ``kind`` -> the class of its rules (a new kind adds its line here, or registers itself here);
#: the spec's own registry, which the spec validates against
KINDS: dict[str, type[WindowKind]] = WINDOW_KINDS  # type: ignore[assignment]  # WindowKind is a SpecKind
KINDS.update({
    "tumbling": FixedWindows,
    "hopping": FixedWindows,
    "session": SessionWindows,
    "sliding": SlidingWindows,
})


def window_kind(window: Window) -> WindowKind:
    """The rules of ``window``'s kind, in microseconds."""
    return KINDS[window.kind].for_window(window)


__all__ = [
    "KINDS", "MICROS_PER_MS", "FixedWindows", "KeyedByStart", "SessionWindows", "SlidingWindows", "WindowBounds", "WindowKind", "first_start", "format_us", "format_window",
    "last_start", "window_kind", "window_starts",
]
