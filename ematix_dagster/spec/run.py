"""``[run]``: how the streaming query is triggered, where its checkpoint is and where window state lives."""

from __future__ import annotations

from dataclasses import dataclass

from ematix_dagster.spec.rules import END_OF_INPUT, TRIGGERS, WINDOW_STATES, _fail, _positive


@dataclass(frozen=True)
class Run:
    """How the streaming query is triggered and where its checkpoint lives (``[run]``)."""

    checkpoint_location: str
    trigger: str = "available_now"
    trigger_interval_ms: int = 1_000
    end_of_input: str = "keep"
    #: "driver": the engine's window state in the driver process and the [state_store]; "executors":
    #: Spark's stateful aggregation on the executors (docs/contract/window-state.md)
    window_state: str = "driver"

    def validate(self, key: str = "run") -> None:
        if self.trigger not in TRIGGERS:
            _fail(f"{key}.trigger", f"unknown trigger {self.trigger!r}", 'use "available_now" or "processing_time"')
        _positive(f"{key}.trigger_interval_ms", self.trigger_interval_ms)
        if self.end_of_input not in END_OF_INPUT:
            _fail(f"{key}.end_of_input", f"unknown value {self.end_of_input!r}", 'use "keep" or "flush"')
        if self.window_state not in WINDOW_STATES:
            _fail(f"{key}.window_state", f"unknown value {self.window_state!r}",
                  '"driver" (the engine keeps window state) or "executors" (Spark\'s stateful aggregation keeps it)')
        if self.end_of_input == "flush" and self.trigger != "available_now":
            _fail(f"{key}.end_of_input", '"flush" only applies to trigger = "available_now"',
                  'remove it or use trigger = "available_now"')
        if not self.checkpoint_location:
            _fail(f"{key}.checkpoint_location", f"{self.checkpoint_location!r} is not a path",
                  'e.g. ".ematix/checkpoints/<pipeline>"')
        if "://" in self.checkpoint_location and not self.checkpoint_location.startswith("file://"):
            _fail(f"{key}.checkpoint_location", "must be a local path (the engine reads its offsets log)",
                  "use a local directory")
