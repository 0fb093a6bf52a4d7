"""How much driver memory a pipeline's window state is expected to take, said before it runs.

The estimate multiplies the window kind's steady-state number of open windows by the group cap
and by bytes per group measured for the kind's real in-memory layout (its state class's
``bytes_per_group``; ``tests/streaming/test_state_size.py`` measures them with tracemalloc). Exact distinct sets grow with their data, which no spec can
predict, so their per-value cost is stated as a rate instead of assuming every set is full (two
caps multiplied would warn of hundreds of GiB for pipelines that hold a few hundred MB).

>>> from ematix_dagster.spec import Aggregation, Window
>>> w = Window(kind="tumbling", duration_ms=60_000, max_groups_per_window=100_000, group_by=("k",),
...            aggregations=(Aggregation("count", "n"),))
>>> estimate_state(w).total_bytes
23800000
"""

from __future__ import annotations

from dataclasses import dataclass

from ematix_dagster.spec import Window
from ematix_dagster.streaming.aggregators import window_aggregators
from ematix_dagster.streaming.kinds import MICROS_PER_MS, window_kind

GIB = 1 << 30


@dataclass(frozen=True)
class StateEstimate:
    open_windows: int
    groups_per_window: int
    bytes_per_group: int
    bytes_per_distinct_value: int  # added per value an exact distinct set holds
    #: what ``open_windows`` counts: windows, or (sliding windows) the partials a key retains
    held: str = "open windows"

    @property
    def total_bytes(self) -> int:
        """Expected driver memory with every window at its group cap, distinct sets empty."""
        return self.open_windows * self.groups_per_window * self.bytes_per_group

    def describe(self) -> str:
        """The bound and how it is made: a pipeline holding a few groups must not read as one about to
        take gigabytes."""
        text = (f"at most {self.total_bytes / (1 << 20):,.0f} MiB, an upper bound reached only when every one of "
                f"{self.open_windows} {self.held} holds max_groups_per_window = {self.groups_per_window:,} groups "
                f"of {self.bytes_per_group} bytes")
        if self.bytes_per_distinct_value:
            text += f", plus {self.bytes_per_distinct_value} bytes per value an exact distinct set holds"
        return text


def estimate_state(window: Window) -> StateEstimate:
    kind = window_kind(window)
    aggregators = window_aggregators(window, (None,) * len(window.aggregations))
    return StateEstimate(
        open_windows=kind.expected_open_windows(window.lateness_ms * MICROS_PER_MS,
                                                window.retention_ms * MICROS_PER_MS),
        groups_per_window=window.groups_cap,
        bytes_per_group=kind.state_class.bytes_per_group(aggregators, len(window.group_by)),
        bytes_per_distinct_value=sum(a.bytes_per_value for a in aggregators),
        held=kind.held,
    )
