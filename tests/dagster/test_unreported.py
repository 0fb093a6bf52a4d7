"""Batches the store committed and no event reported: the next run reports them once, exactly.

A real (ephemeral) Dagster instance holds the events; the store's record is built by hand, with
the counters a store keeps (cumulative over every run).
"""

from __future__ import annotations

from types import SimpleNamespace

import dagster as dg
import pytest

from ematix_dagster.dagster.events import STORE_COUNTERS, EmatixEventIterator
from ematix_dagster.dagster.unreported import NOTHING_REPORTED, Reported, last_reported, unreported_materialization
from ematix_dagster.dagster.versions import batch_provenance
from tests.dagster.test_events import T0, report

KEY = dg.AssetKey(["public", "clicks"])


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def record(last_batch_id: int, **counters: int):
    return SimpleNamespace(last_batch_id=last_batch_id, watermark=int((T0 + 60 * last_batch_id) * 1e6),
                           counters={k.replace("__", ":"): v for k, v in counters.items()})


def event(instance: dg.DagsterInstance, batch_id: int, counters: dict | None, observation: bool = False) -> None:
    meta = {"batch_id": batch_id}
    if counters is not None:
        meta[STORE_COUNTERS] = dg.MetadataValue.json(counters)
    kind = dg.AssetObservation if observation else dg.AssetMaterialization
    instance.report_runless_asset_event(kind(asset_key=KEY, metadata=meta))


def test_the_gap_between_the_latest_event_and_the_store_is_one_materialization(instance):
    event(instance, 3, {"rows_consumed:clicks": 30, "windows_emitted": 2})
    event(instance, 5, {"rows_consumed:clicks": 50, "windows_emitted": 2, "late_rows_dropped": 1}, observation=True)
    assert last_reported(instance, KEY) == Reported(5, {"rows_consumed:clicks": 50, "windows_emitted": 2,
                                                        "late_rows_dropped": 1})
    stored = record(9, rows_consumed__clicks=81, windows_emitted=6, window_corrections=1, late_rows_dropped=4)
    caught_up = unreported_materialization(instance, KEY, stored)
    assert caught_up is not None
    meta = {k: getattr(v, "value", v) for k, v in caught_up.metadata.items()}
    assert (meta["batches"], meta["rows_in"], meta["rows_in/clicks"], meta["windows_emitted"], meta["corrections"],
            meta["late_rows"], meta["batch_id"]) == (4, 31, 31, 4, 1, 3, 9)
    assert "batches 6-9: committed to the state store by an earlier run" in caught_up.description
    # reported once: with it stored, the store and Dagster agree and nothing is left to report
    instance.report_runless_asset_event(caught_up)
    assert last_reported(instance, KEY) == Reported(9, stored.counters)
    assert unreported_materialization(instance, KEY, stored) is None


def test_nothing_to_report_when_dagster_is_ahead_or_the_store_was_reset_or_counters_are_unknown(instance):
    assert last_reported(instance, KEY) == NOTHING_REPORTED
    assert unreported_materialization(instance, KEY, None) is None  # a pipeline that never ran
    event(instance, 5, {"rows_consumed:clicks": 50})
    assert unreported_materialization(instance, KEY, record(5, rows_consumed__clicks=50)) is None
    # a reset store counts afresh from batch 0: its counters went back, there is no gap to tell
    assert unreported_materialization(instance, KEY, record(7, rows_consumed__clicks=3)) is None
    event(instance, 6, None)  # an event without the store's counters: the gap cannot be told exactly
    assert last_reported(instance, KEY) is None
    assert unreported_materialization(instance, KEY, record(9, rows_consumed__clicks=90)) is None


def test_a_store_ahead_of_a_fresh_instance_is_reported_from_batch_zero(instance):
    caught_up = unreported_materialization(instance, KEY, record(2, rows_consumed__a=5, rows_consumed__b=7))
    assert caught_up is not None
    meta = {k: getattr(v, "value", v) for k, v in caught_up.metadata.items()}
    assert (meta["batches"], meta["rows_in"], meta["rows_in/a"], meta["rows_in/b"]) == (3, 12, 5, 7)


def test_the_catch_up_comes_first_and_carries_the_data_version_of_the_stores_last_batch(instance):
    event(instance, 1, {"rows_consumed:a": 10})
    stored = record(4, rows_consumed__a=25)
    context = SimpleNamespace(instance=instance)
    provenance = batch_provenance(context, KEY, "code-1")
    reports = [report(5, 10, emitted=1, watermark_s=T0 + 600)]
    events = list(EmatixEventIterator(
        iter(reports), KEY, throttle_seconds=0,
        catch_up=lambda: unreported_materialization(instance, KEY, stored, provenance=provenance)))
    assert [type(e).__name__ for e in events] == ["AssetMaterialization", "AssetMaterialization", "MaterializeResult"]
    assert events[0].metadata["batch_id"].value == 4 and events[0].metadata["rows_in"].value == 15
    assert events[0].tags["dagster/data_version"] == "batch 4, watermark 2026-01-01T00:04:00Z"
    assert events[1].metadata["batch_id"].value == 5
