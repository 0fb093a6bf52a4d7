"""The fingerprint of the state-relevant part of a spec (docs/contract/operations.md).

State written under one window shape cannot be read under another: changing the sources or
their order, the window kind or sizes, group_by, the aggregations, hll_precision or time_mode
refuses to start and names the change. So does changing ``emit_trigger`` or ``[target]
retractions``: the state holds what they emit from (each group's hidden row count, the groups
changed since the last firing, the last row written per key), and a reader of the target reads
its rows by the rules it was written under. Lateness, caps and idleness may change freely.

The emission items enter the document only when they differ from their defaults, so a pipeline
that uses neither keeps the fingerprint its state was written with before they existed.

A row pipeline (docs/contract/row-pipelines.md) has no window state, but its pending rows hold
the SQL's output columns and a release time computed from its WHERE: its document holds the
sources and their order, the SQL text, ``time_mode`` and ``event_time_column``, so a changed SQL
refuses to start over pending rows written by the old one (docs/contract/row-pipelines.md#fingerprint:
a change of the output schema with rows pending refuses to start). The text is the conservative stand-in for the output
schema; lateness, idleness and ``max_buffered_rows`` may change freely.

``[run] window_state`` enters when it is not ``"driver"``: the state of one mode is in the store,
the other's in the checkpoint, and neither reads the other's (docs/contract/window-state.md).

A windowed pipeline's ``[emit] sql`` enters as ``emit.sql`` (only when present): its pending rows
carry release times the old predicate computed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ematix_dagster.spec import PipelineSpec
from ematix_dagster.spec.window import WINDOW_KINDS
from ematix_dagster.streaming.aggregators import make_aggregator

#: items that are left out at their default, and that default (what an absent item means)
_DEFAULTS: dict[str, Any] = {"window.emit_trigger": "watermark", "target.retractions": False, "emit.sql": None,
                             "run.window_state": "driver"}


def fingerprint_doc(spec: PipelineSpec) -> dict[str, Any]:
    if spec.is_row_pipeline:
        return {
            "sources": [[s.name, s.kind] for s in spec.sources],
            "transform.sql": spec.transform_sql,
            "transform.time_mode": spec.watermark.time_mode,
            "transform.event_time_column": spec.watermark.event_time_column,
        }
    w = spec.window
    doc = {
        "sources": [[s.name, s.kind] for s in spec.sources],
        "window.kind": w.kind,
        **WINDOW_KINDS[w.kind].fingerprint(w),
        "window.group_by": list(w.group_by),
        "window.aggregations": [make_aggregator(a, None, w.hll_precision).fingerprint(a) for a in w.aggregations],
        "window.hll_precision": w.hll_precision,
        "window.time_mode": w.time_mode,
        "window.event_time_column": w.event_time_column,
        "window.emit_trigger": w.emit_trigger.to_toml(),
        "target.retractions": spec.target.retractions,
        "emit.sql": spec.emit.sql if spec.emit else None,
        "run.window_state": spec.run.window_state,
    }
    return {key: value for key, value in doc.items() if key not in _DEFAULTS or value != _DEFAULTS[key]}


def fingerprint(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human lines naming each changed item, e.g. ``window.duration_ms: 60000 -> 30000`` (an item
    left out at its default shows that default: ``window.emit_trigger: 'watermark' -> 'every_batch'``)."""
    def value(doc: dict[str, Any], key: str) -> Any:
        return doc.get(key, _DEFAULTS.get(key))

    return [f"{key}: {value(old, key)!r} -> {value(new, key)!r}" for key in sorted(set(old) | set(new))
            if value(old, key) != value(new, key)]


def refused_change(pipeline: str, written: str, changes: list[str], reset_note: str) -> str:
    """Why a start over state ``written`` for another window spec is refused: what changed, where the
    open windows are when ``[run] window_state`` is among ``changes``, and the way out."""
    moved = (" The open windows are kept where the other window_state keeps them (Spark's state in the "
             "checkpoint, or the driver's in the store), and this one cannot read them."
             if any(change.startswith("run.window_state") for change in changes) else "")
    return (f"pipeline {pipeline}: {written}; changed: {'; '.join(changes) or 'fingerprint'}.{moved} Revert the "
            f"change, or start over with `ematix-dagster reset PIPELINE.toml --yes` ({reset_note}).")
