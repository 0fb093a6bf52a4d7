"""Batches the store committed that no Dagster event reported, reported by the next run.

A run can end without reporting batches it committed: a run worker killed with ``kill -9``
leaves its step running as an orphan until it notices (:mod:`ematix_dagster.dagster.watcher`) or
until the next run fences it (the store's lease epoch), and what it commits meanwhile, like the
batches its throttle held back, goes into no event. Every per-batch event carries the store's
counters after its last batch (``store_counters``, cumulative over every run). So the next run,
once it holds the lease and nobody else can commit, compares the store with the latest event and
reports the difference as one materialization: the rows and the data version Dagster shows then
equal the store's however the previous run ended, and nothing is reported twice, because that
materialization carries the store's counters too.

The store keeps no count of early rows or retractions, so the account names windows emitted,
corrections, released rows, late rows and rows read; its table size (``dagster/row_count``) is
the target's own count like every other event's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Optional

import dagster as dg

from ematix_dagster.dagster.events import STORE_COUNTERS
from ematix_dagster.dagster.pipeline import metadata_value
from ematix_dagster.streaming.kinds import format_us


@dataclass(frozen=True)
class Reported:
    """Where Dagster's account of a pipeline stands: the last batch an event covered, and the
    store's counters after it (-1 and none: no event yet)."""

    batch_id: int
    counters: Mapping[str, int]


class Position(NamedTuple):
    """What a materialization's data version names (:func:`~ematix_dagster.dagster.versions.batch_data_version`)."""

    batch_id: int
    watermark: Optional[int]


NOTHING_REPORTED = Reported(-1, {})


def last_reported(instance: dg.DagsterInstance, key: dg.AssetKey) -> Optional[Reported]:
    """The latest materialization or observation of ``key`` that names a batch; None when it
    carries no store counters (an event written before they were), so the gap cannot be told."""
    latest: Optional[Mapping[str, Any]] = None
    for fetch in (instance.fetch_materializations, instance.fetch_observations):
        for record in fetch(key, limit=1).records:
            event = record.asset_materialization or record.asset_observation
            meta = event.metadata if event is not None else {}
            batch_id = metadata_value(meta.get("batch_id"))
            if batch_id is not None and (latest is None or batch_id > metadata_value(latest["batch_id"])):
                latest = meta
    if latest is None:
        return NOTHING_REPORTED
    if STORE_COUNTERS not in latest:
        return None
    counters = metadata_value(latest[STORE_COUNTERS])
    return Reported(int(metadata_value(latest["batch_id"])), {name: int(n) for name, n in counters.items()})


def _sum(counters: Mapping[str, int], prefix: str) -> int:
    return sum(n for name, n in counters.items() if name.startswith(prefix))


def unreported_metadata(record: Any, reported: Reported) -> Optional[dict[str, Any]]:
    """The metadata of the batches after ``reported`` up to the stored ``record``, under the names a
    per-batch event uses; None when there are none (or the store was reset since: its counters went
    back, and it counts afresh)."""
    last = record.last_batch_id if record is not None else None
    if last is None or last <= reported.batch_id:
        return None
    counters = {name: int(n) for name, n in record.counters.items()}
    delta = {name: n - reported.counters.get(name, 0) for name, n in counters.items()}
    if any(n < 0 for n in delta.values()):
        return None
    meta: dict[str, Any] = {
        "batches": last - reported.batch_id,
        "rows_in": _sum(delta, "rows_consumed:"),
        "windows_emitted": delta.get("windows_emitted", 0),
        "corrections": delta.get("window_corrections", 0),
        "late_rows": delta.get("late_rows_dropped", 0),
        "dead_letter_rows": _sum(delta, "dead_letter_rows:"),
        "filtered_rows": _sum(delta, "filtered_rows:"),
    }
    if "released_rows" in counters:
        meta["released_rows"] = delta["released_rows"]
    for name, n in sorted(delta.items()):
        if name.startswith("rows_consumed:"):
            meta[f"rows_in/{name.split(':', 1)[1]}"] = n
    meta["batch_id"] = int(last)
    if record.watermark is not None:
        meta["watermark"] = dg.MetadataValue.timestamp(record.watermark / 1e6)
    meta[STORE_COUNTERS] = dg.MetadataValue.json(dict(sorted(counters.items())))
    return meta


def unreported_materialization(instance: dg.DagsterInstance, key: dg.AssetKey, record: Any, *,
                               provenance: Optional[Callable[[Any], Mapping[str, str]]] = None,
                               metadata: Optional[Callable[[], Mapping[str, Any]]] = None,
                               ) -> Optional[dg.AssetMaterialization]:
    """The materialization reporting what the store committed after Dagster's latest event (None:
    nothing). A materialization even when those batches wrote nothing: like a run's closing
    result, it moves the data version to the store's last batch."""
    reported = last_reported(instance, key)
    if reported is None:
        return None
    meta = unreported_metadata(record, reported)
    if meta is None:
        return None
    if metadata is not None:
        meta.update(metadata())
    first, last = reported.batch_id + 1, int(record.last_batch_id)
    span = f"batch {last}" if first == last else f"batches {first}-{last}"
    position = Position(last, record.watermark)
    return dg.AssetMaterialization(
        asset_key=key, metadata=meta, tags=dict(provenance(position)) if provenance is not None else None,
        description=(f"{span}: committed to the state store by an earlier run that no event reported (it was "
                     f"killed, stopped before its next event, or ran outside Dagster): {meta['rows_in']} rows in, "
                     f"watermark {format_us(record.watermark)}"))


__all__ = ["NOTHING_REPORTED", "Position", "Reported", "last_reported", "unreported_materialization",
           "unreported_metadata"]
