"""The fingerprint of the state-relevant spec (docs/contract/operations.md): ``emit_trigger`` and ``[target]
retractions`` are part of it (docs/contract/emission.md) without changing the fingerprint of a pipeline that uses
neither, and a run over state written under another trigger is refused before Spark starts, naming the change. A row
pipeline's fingerprint holds its sources, SQL text, time_mode and event_time_column (docs/contract/row-pipelines.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import pytest
from prometheus_client import CollectorRegistry

from ematix_dagster.errors import FingerprintChanged
from ematix_dagster.fingerprint import describe_changes, fingerprint, fingerprint_doc
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.operations import check, summary
from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spec import EmitTrigger, PipelineSpec, Target, load_pipeline_str
from tests.dagster_support import commit_state, small_spec
from tests.spec.toml_samples import DELETE, FULL_TOML, MINIMAL_TOML, ROW_TOML, mutated_toml


@pytest.mark.parametrize(("toml", "expected"), [
    (FULL_TOML, "c050c5265e54a98060618413f4c623a3"),
    (MINIMAL_TOML, "320ed00d9d663995aa57a7fb45129821"),
], ids=["full", "minimal"])
def test_fingerprints_from_before_emission_triggers_stand(toml: str, expected: str) -> None:
    """The values stored by state written before the emission keys existed."""
    spec = load_pipeline_str(toml)
    assert fingerprint(fingerprint_doc(spec)) == expected
    assert fingerprint(fingerprint_doc(replace(spec, shape=replace(spec.window, emit_trigger="watermark")))) == expected


def _with(spec: PipelineSpec, trigger: str | dict[str, int] = "watermark", retractions: bool = False) -> PipelineSpec:
    return replace(spec, shape=replace(spec.window, emit_trigger=trigger),
                   target=replace(spec.target, retractions=retractions)).validate()


def test_the_trigger_and_retractions_are_fingerprinted() -> None:
    base = load_pipeline_str(MINIMAL_TOML)
    variants = [_with(base), _with(base, "every_batch"), _with(base, {"count": 10}), _with(base, {"count": 20}),
                _with(base, {"interval_ms": 10}), _with(base, "every_batch", retractions=True)]
    assert len({fingerprint(fingerprint_doc(s)) for s in variants}) == len(variants)
    assert fingerprint_doc(variants[2])["window.emit_trigger"] == {"count": 10}
    assert fingerprint_doc(variants[-1])["target.retractions"] is True


def test_a_change_is_described_with_the_default_it_left() -> None:
    base = load_pipeline_str(MINIMAL_TOML)
    old, new = fingerprint_doc(base), fingerprint_doc(_with(base, {"count": 10}, retractions=True))
    assert describe_changes(old, new) == ["target.retractions: False -> True",
                                          "window.emit_trigger: 'watermark' -> {'count': 10}"]
    assert describe_changes(new, old) == ["target.retractions: True -> False",
                                          "window.emit_trigger: {'count': 10} -> 'watermark'"]


def _no_spark() -> NoReturn:
    raise AssertionError("a run refused at preflight must not start Spark")


def test_a_changed_trigger_on_existing_state_is_refused_before_spark(tmp_path: Path) -> None:
    written = small_spec(tmp_path)
    commit_state(written)  # a batch committed under the watermark trigger
    changed = replace(written, shape=replace(written.window, emit_trigger=EmitTrigger(kind="every_batch")))
    runner = PipelineRunner(changed, spark=_no_spark, metrics=StreamingMetrics(CollectorRegistry()),
                            progress=lambda _line: None)
    with pytest.raises(FingerprintChanged) as info:
        runner.start()
    text = str(info.value)
    assert "window.emit_trigger: 'watermark' -> 'every_batch'" in text
    assert "ematix-dagster reset PIPELINE.toml --yes" in text and "Revert the change" in text
    problems = {p.code: p for p in check(changed).problems}
    assert "window.emit_trigger: 'watermark' -> 'every_batch'" in problems["fingerprint_changed"].message
    # the same state with the trigger it was written under is not refused for it
    assert "fingerprint_changed" not in {p.code for p in check(written).problems}


def test_turning_retractions_on_over_existing_state_is_refused(tmp_path: Path) -> None:
    written = small_spec(tmp_path)
    commit_state(written)
    changed = replace(written, target=Target(kind="parquet", path=str(tmp_path / "out"), retractions=True))
    problems = {p.code: p for p in check(changed).problems}
    assert "target.retractions: False -> True" in problems["fingerprint_changed"].message


def _row_spec(tmp_path: Path, **changes: object) -> PipelineSpec:
    """The row sample with its store and checkpoint under ``tmp_path``."""
    return load_pipeline_str(mutated_toml({"state_store.path": str(tmp_path / "state.db"),
                                           "run.checkpoint_location": str(tmp_path / "cp"), **changes}, ROW_TOML))


def test_a_row_pipelines_fingerprint_is_its_sources_sql_and_time(tmp_path: Path) -> None:
    spec = _row_spec(tmp_path)
    assert fingerprint_doc(spec) == {"sources": [["clicks", "files"]], "transform.sql": spec.transform_sql,
                                     "transform.time_mode": "event", "transform.event_time_column": "_event_ts"}
    assert fingerprint(fingerprint_doc(spec)) == "b6bb94b5be5587f8f2cdcebaf621f5a0"
    same = [_row_spec(tmp_path, **{"transform.lateness_ms": 0, "transform.source_idleness_ms": 1_000,
                                   "transform.max_buffered_rows": 5, "target.key": DELETE})]
    assert {fingerprint(fingerprint_doc(s)) for s in same} == {fingerprint(fingerprint_doc(spec))}
    changed = _row_spec(tmp_path, **{"transform.sql": "SELECT user_id, _event_ts FROM source WHERE "
                                                      "_event_ts <= WATERMARK_TS()"})
    assert [line.split(":")[0] for line in describe_changes(fingerprint_doc(spec), fingerprint_doc(changed))] \
        == ["transform.sql"]
    processing = _row_spec(tmp_path, **{"transform.time_mode": "processing"})
    assert describe_changes(fingerprint_doc(spec), fingerprint_doc(processing)) \
        == ["transform.time_mode: 'event' -> 'processing'"]


def test_a_changed_sql_over_a_row_pipelines_state_is_named_by_check(tmp_path: Path) -> None:
    written = _row_spec(tmp_path)
    commit_state(written)
    assert "fingerprint_changed" not in {p.code for p in check(written).problems}
    changed = replace(written, transform_sql="SELECT user_id, _event_ts FROM source "
                                             "WHERE _event_ts + INTERVAL 1 HOUR <= WATERMARK_TS()").validate()
    assert "transform.sql: " in {p.code: p for p in check(changed).problems}["fingerprint_changed"].message
    assert summary(written)["last_batch_id"] == 3  # no window kind to break the state down by


def test_a_row_pipeline_over_a_windowed_pipelines_state_is_named_by_check(tmp_path: Path) -> None:
    windowed = small_spec(tmp_path)
    commit_state(windowed)
    rows = _row_spec(tmp_path, pipeline_name=windowed.pipeline_name)
    message = {p.code: p for p in check(rows).problems}["fingerprint_changed"].message
    assert "window.kind: 'tumbling' -> None" in message and "transform.sql: None -> " in message
