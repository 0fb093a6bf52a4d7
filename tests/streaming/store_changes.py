"""A state's changes one row per group, as the tests' simulated stores apply them.

The engine hands its changes over as columns (``ColumnChanges``, one segment a commit); a test
store keeps a plain dict of (start, key) -> group, so it takes them row by row: the deletes and
the range delete first, then the upserts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from ematix_dagster.streaming.emitted import GroupKey
from ematix_dagster.streaming.kinds.kind_state import KindState, StoredGroup
from ematix_dagster.streaming.kinds.state_columns import accumulator_rows


@dataclass
class StoreChanges:
    upserts: list[StoredGroup] = field(default_factory=list)
    deletes: list[tuple[int, GroupKey]] = field(default_factory=list)
    deleted_before: int | None = None


def take_changes(state: KindState) -> StoreChanges:
    """``state``'s changes since the last commit, one :class:`StoredGroup` per upserted row."""
    changes = state.take_column_changes()
    flags: Any = changes.emitted.tolist() if changes.emitted is not None else repeat(None)
    keys = changes.row_keys()
    rows = accumulator_rows(changes.accs) if changes.accs else [[] for _ in keys]
    upserts = list(map(StoredGroup, changes.starts.tolist(), changes.ends.tolist(), keys, rows, flags))
    return StoreChanges(upserts=upserts, deletes=list(changes.deletes), deleted_before=changes.deleted_before)
