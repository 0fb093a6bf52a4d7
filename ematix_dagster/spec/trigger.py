"""``[transform.window] emit_trigger``: when a window's rows leave before (or besides) its final one
(docs/contract/emission.md).

In TOML the trigger is a string (``"watermark"``, ``"every_batch"``) or an inline table
(``{ interval_ms = N }``, ``{ count = N }``); here it is one typed value. The facade's ``Window``
takes either spelling, or an ``EmitTrigger``.

>>> EmitTrigger.parse({"count": 100}, "transform.window.emit_trigger")
EmitTrigger(kind='count', interval_ms=None, count=100)
>>> EmitTrigger.parse("every_batch", "transform.window.emit_trigger").to_toml()
'every_batch'
>>> EmitTrigger().fires_early
False
>>> EmitTrigger.parse({"count": 0}, "transform.window.emit_trigger").validate("transform.window.emit_trigger")
Traceback (most recent call last):
...
ematix_dagster.errors.PipelineConfigError: transform.window.emit_trigger.count: 0 must be a positive integer (fix: use a value > 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from ematix_dagster.spec.rules import _fail, _positive

WATERMARK = "watermark"
EVERY_BATCH = "every_batch"
INTERVAL = "interval"
COUNT = "count"

#: the TOML spellings, for messages
_FORMS = '"watermark" (the default), "every_batch", { interval_ms = N } or { count = N }'
#: a table's one key -> the kind it names (the kind keeps its N in the field of that name)
_TABLE_KEYS = {"interval_ms": INTERVAL, "count": COUNT}


def _unknown(key: str, problem: str) -> NoReturn:
    _fail(key, problem, f"use {_FORMS}, N a whole number > 0")


@dataclass(frozen=True)
class EmitTrigger:
    """One emission trigger: ``kind`` and, for ``interval`` / ``count``, its N."""

    kind: str = WATERMARK
    interval_ms: int | None = None
    count: int | None = None

    @classmethod
    def parse(cls, value: Any, key: str) -> EmitTrigger:
        """The trigger a TOML value (or a facade argument) names; an ``EmitTrigger`` passes through.

        A value that is none of the TOML spellings is refused here, naming ``key`` and the value as
        written (no ``EmitTrigger`` could show it). N is taken as given: the type checks refuse a
        quoted or boolean N like any other integer key, naming ``key.count`` / ``key.interval_ms``.
        """
        if isinstance(value, EmitTrigger):
            return value
        if isinstance(value, str):
            if value not in (WATERMARK, EVERY_BATCH):
                _unknown(key, f"unknown trigger {value!r}")
            return cls(kind=value)
        if not isinstance(value, dict):
            _unknown(key, f"{value!r} is not a trigger")
        if len(value) != 1 or next(iter(value)) not in _TABLE_KEYS:
            _unknown(key, f"unknown trigger {value!r}: a trigger table has one key, interval_ms or count")
        ((name, n),) = value.items()
        return cls(kind=_TABLE_KEYS[name], **{name: n})

    def validate(self, key: str) -> None:
        """The kind is known, it carries its own N (and no other), and that N is positive.

        A parsed trigger is well formed already; this catches ``EmitTrigger(...)`` built by hand.
        """
        if self.kind not in (WATERMARK, EVERY_BATCH, INTERVAL, COUNT):
            _unknown(key, f"unknown trigger kind {self.kind!r}")
        own = {INTERVAL: "interval_ms", COUNT: "count"}.get(self.kind)
        for name in ("interval_ms", "count"):
            n = getattr(self, name)
            if name == own:
                if n is None:
                    _fail(f"{key}.{name}", f"is required for the {self.kind!r} trigger", f"write {{ {name} = N }}")
                _positive(f"{key}.{name}", n)
            elif n is not None:
                _fail(f"{key}.{name}", f"{name} = {n!r} does not apply to the {self.kind!r} trigger", "remove it")

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
