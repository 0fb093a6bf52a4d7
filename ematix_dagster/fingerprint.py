"""The fingerprint of the state-relevant part of a spec (docs/contract/operations.md).

State written under one window shape cannot be read under another: changing the sources or
their order, the window kind or sizes, group_by, the aggregations, hll_precision or time_mode
refuses to start and names the change. Lateness, caps and idleness may change freely.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.aggregators import make_aggregator
from ematix_dagster.streaming.windows import KINDS


def fingerprint_doc(spec: PipelineSpec) -> dict[str, Any]:
    w = spec.window
    return {
        "sources": [[s.name, s.kind] for s in spec.sources],
        "window.kind": w.kind,
        **KINDS[w.kind].fingerprint(w),
        "window.group_by": list(w.group_by),
        "window.aggregations": [make_aggregator(a, None, w.hll_precision).fingerprint(a) for a in w.aggregations],
        "window.hll_precision": w.hll_precision,
        "window.time_mode": w.time_mode,
        "window.event_time_column": w.event_time_column,
    }


def fingerprint(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human lines naming each changed item, e.g. ``window.duration_ms: 60000 -> 30000``."""
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)]
