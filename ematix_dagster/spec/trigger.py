"""``[transform.window] emit_trigger``: when a window's rows leave before (or besides) its final one
(docs/contract/emission.md).

In TOML the trigger is a string (``"watermark"``, ``"every_batch"``) or an inline table
(``{ interval_ms = N }``, ``{ count = N }``); here it is one typed value.

>>> EmitTrigger.parse({"count": 100}, "transform.window.emit_trigger")
EmitTrigger(kind='count', interval_ms=None, count=100)
>>> EmitTrigger().fires_early
False
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WATERMARK = "watermark"
EVERY_BATCH = "every_batch"
INTERVAL = "interval"
COUNT = "count"


@dataclass(frozen=True)
class EmitTrigger:
    """One emission trigger: ``kind`` and, for ``interval`` / ``count``, its N."""

    kind: str = WATERMARK
    interval_ms: int | None = None
    count: int | None = None

    @classmethod
    def parse(cls, value: Any, key: str) -> "EmitTrigger":
        """The trigger a TOML value (or a facade argument) names; an ``EmitTrigger`` passes through."""
        if isinstance(value, EmitTrigger):
            return value
        if isinstance(value, str):
            return cls(kind=value)
        if isinstance(value, dict) and len(value) == 1:
            (name, n), = value.items()
            if name == "interval_ms":
                return cls(kind=INTERVAL, interval_ms=n)
            if name == "count":
                return cls(kind=COUNT, count=n)
        return cls(kind=repr(value))  # refused by validate, which names the value

    def to_toml(self) -> str | dict[str, int]:
        if self.kind == INTERVAL:
            return {"interval_ms": self.interval_ms}  # type: ignore[dict-item]
        if self.kind == COUNT:
            return {"count": self.count}  # type: ignore[dict-item]
        return self.kind

    @property
    def fires_early(self) -> bool:
        """Rows may leave before the watermark closes their window."""
        return self.kind != WATERMARK

    @property
    def counts_rows(self) -> bool:
        """The state keeps each group's hidden row count (``count`` fires on it, ``interval`` reads
        from it which groups changed since its last firing)."""
        return self.kind in (INTERVAL, COUNT)
