"""The names a spec may use for its window kind and its aggregations.

Both registries are filled by the layers that implement them, when they are imported:
``ematix_dagster.streaming.windows`` puts each ``WindowKind`` in :data:`WINDOW_KINDS`, and
``ematix_dagster.streaming.aggregators`` each aggregator's factory in :data:`AGGREGATIONS`.
The package's ``__init__`` imports both, so a spec is never validated against an empty registry,
and the spec stays below the layers that implement what it names (it imports neither).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ematix_dagster.spec.window import Window


class SpecKind(Protocol):
    """What the spec asks of a window kind: the keys only it takes, whether it takes early emission
    triggers, and a check of its keys."""

    own_keys: tuple[str, ...]
    early_triggers: bool
    retracts_corrections: bool
    id_column: str | None  # a column of its rows besides the bounds (sessions: session_id)

    @classmethod
    def validate(cls, window: Window, key: str) -> None: ...

    @classmethod
    def shape(cls, window: Window) -> str: ...


#: spec ``kind`` -> its window kind (``streaming.windows.KINDS`` is this dict)
WINDOW_KINDS: dict[str, type[SpecKind]] = {}
#: spec ``agg`` -> its aggregator's factory (``streaming.aggregators.AGGREGATORS`` is this dict)
AGGREGATIONS: dict[str, Any] = {}
