"""``[run] window_state`` (``ematix_dagster/spec/window_state.py``, docs/contract/window-state.md): what
``"executors"`` refuses and warns of, key by key, and how the mode enters the spec and its fingerprint."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.fingerprint import describe_changes, fingerprint, fingerprint_doc
from ematix_dagster.spec import Source, dump_pipeline, load_pipeline_str, spec_warnings
from ematix_dagster.spec.window_state import executor_refusals
from tests.e2e.lateness_helpers import DDL, files_source, make_spec

AGGREGATIONS: list[dict[str, Any]] = [
    {"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "sum_v"},
    {"agg": "count_distinct", "column": "page", "as": "pages"},
    {"agg": "count_distinct", "column": "v", "as": "exact_v", "mode": "exact", "max_distinct_values_per_group": 100},
]


def doc(tmp: Path, window_state: str = "executors", **window: Any) -> dict[str, Any]:
    """A two-source tumbling pipeline as TOML keys."""
    return {
        "pipeline_name": "modes",
        "sources": [files_source("a", tmp / "a", fmt="json"), files_source("b", tmp / "b", fmt="json")],
        "transform": {"window": {"kind": "tumbling", "duration_ms": 60_000, "group_by": ["k"],
                                 "aggregations": AGGREGATIONS[:2], **window}},
        "target": {"kind": "parquet", "path": str(tmp / "out")},
        "run": {"checkpoint_location": str(tmp / "cp"), "window_state": window_state},
    }


def load(document: dict[str, Any]):
    return load_pipeline_str(tomli_w.dumps(document))


def test_the_refusals_name_each_key_spark_cannot_honour(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "refused", [files_source("a", tmp_path / "a", schema=DDL, on_unreadable_file="skip"),
                                           files_source("b", tmp_path / "b", schema=DDL)],
                     {"kind": "session", "gap_ms": 10_000, "max_session_duration_ms": 60_000, "group_by": ["k"],
                      "late_data": "reopen", "allowed_lateness_ms": 5_000, "emit_trigger": "every_batch",
                      "source_idleness_ms": 30_000, "aggregations": AGGREGATIONS}, end_of_input="flush")
    found = {(r.key, r.refused) for r in executor_refusals(spec)}
    assert found == {
        ("transform.window.kind", False), ("transform.window.late_data", True),
        ("transform.window.emit_trigger", True), ("transform.window.max_groups_per_window", False),
        ("transform.window.aggregations[3].max_distinct_values_per_group", False),
        ("transform.window.source_idleness_ms", True), ("sources[0].on_unreadable_file", True),
        ("sources[1]", False), ("run.end_of_input", True),
    }
    sliding = make_spec(tmp_path, "sliding", [files_source("a", tmp_path / "a", fmt="json", schema=DDL)],
                        {"kind": "sliding", "duration_ms": 60_000, "max_events_per_group": 10, "group_by": ["k"],
                         "aggregations": [{"agg": "count", "as": "n"}]})
    assert [(r.key, r.refused) for r in executor_refusals(sliding)] == [
        ("transform.window.kind", True), ("transform.window.late_data", False),
        ("transform.window.max_groups_per_window", False)]
    kafka = replace(sliding, sources=(Source(name="orders", kind="kafka", bootstrap_servers="k:9092",
                                             topic="orders", event_time_column="ts"),))
    assert ("sources[0].kind", True) in {(r.key, r.refused) for r in executor_refusals(kafka)}


def test_idleness_of_several_sources_is_refused_only_when_set(tmp_path: Path) -> None:
    """Spark's min watermark has no idle sources: the default idleness is a warning, a chosen one refused."""
    spec = load(doc(tmp_path))
    assert ("transform.window.source_idleness_ms", False) in {(r.key, r.refused) for r in executor_refusals(spec)}
    with pytest.raises(PipelineConfigError) as refused:
        load(doc(tmp_path, source_idleness_ms=5_000))
    assert refused.value.key == "transform.window.source_idleness_ms"
    assert 'not supported with window_state = "executors"' in str(refused.value)
    assert 'window_state = "driver"' in str(refused.value)


@pytest.mark.parametrize(("window", "key"), [
    ({"kind": "sliding", "max_events_per_group": 10}, "transform.window.kind"),
    ({"late_data": "reopen", "allowed_lateness_ms": 1_000}, "transform.window.late_data"),
    ({"emit_trigger": "every_batch"}, "transform.window.emit_trigger"),
])
def test_validate_refuses_a_key_spark_cannot_honour_naming_it(tmp_path: Path, window: dict[str, Any], key: str) -> None:
    document = doc(tmp_path, max_groups_per_window=10, **window)
    load({**document, "run": {**document["run"], "window_state": "driver"}})  # valid on the driver
    with pytest.raises(PipelineConfigError) as refused:
        load(document)
    assert refused.value.key == key


def test_a_row_pipeline_and_an_unknown_mode_are_refused(tmp_path: Path) -> None:
    rows = doc(tmp_path)
    rows["transform"] = {"sql": "SELECT * FROM source"}
    rows["target"] = {"kind": "parquet", "path": str(tmp_path / "rows")}
    with pytest.raises(PipelineConfigError) as refused:
        load(rows)
    assert refused.value.key == "run.window_state"
    with pytest.raises(PipelineConfigError) as unknown:
        load(doc(tmp_path, window_state="cluster"))
    assert unknown.value.key == "run.window_state" and "'cluster'" in str(unknown.value)


def test_max_groups_per_window_is_required_on_the_driver_only_and_warned_of_on_the_executors(tmp_path: Path) -> None:
    spec = load(doc(tmp_path))
    assert spec.window.max_groups_per_window is None
    assert not any("max_groups_per_window" in w for w in spec_warnings(spec))
    with pytest.raises(PipelineConfigError) as mandatory:
        load(doc(tmp_path, window_state="driver"))
    assert mandatory.value.key == "transform.window.max_groups_per_window"
    assert 'window_state = "executors"' in str(mandatory.value)
    capped = load(doc(tmp_path, max_groups_per_window=10))
    assert [w for w in spec_warnings(capped) if w.startswith("transform.window.max_groups_per_window")] == [
        "transform.window.max_groups_per_window does not apply: the windows' state is in RocksDB on the executors, "
        "bounded by their disks, not by the driver's memory"]
    assert not spec_warnings(load(doc(tmp_path, window_state="driver", max_groups_per_window=10)))


def test_the_mode_round_trips_and_enters_the_fingerprint_only_when_not_driver(tmp_path: Path) -> None:
    executors = load(doc(tmp_path, max_groups_per_window=10))
    assert load_pipeline_str(dump_pipeline(executors)) == executors
    driver = replace(executors, run=replace(executors.run, window_state="driver"))
    assert "run.window_state" not in fingerprint_doc(driver)  # a driver pipeline keeps its fingerprint
    assert fingerprint(fingerprint_doc(driver)) != fingerprint(fingerprint_doc(executors))
    assert describe_changes(fingerprint_doc(driver), fingerprint_doc(executors)) == [
        "run.window_state: 'driver' -> 'executors'"]
