"""A row pipeline (docs/contract/row-pipelines.md) in the Dagster integration: its asset and checks are defined
and described without a window, before its runner exists."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from ematix_dagster.dagster import EmatixPipeline, streaming_pipeline_asset
from ematix_dagster.dagster.checks import idempotency_warnings
from ematix_dagster.dagster.translator import EmatixTranslator
from ematix_dagster.spec import PipelineSpec, load_pipeline_str
from tests.spec.toml_samples import ROW_TOML, mutated_toml


def _spec(tmp_path: Path, **changes: object) -> PipelineSpec:
    return load_pipeline_str(mutated_toml({"state_store.path": str(tmp_path / "state.db"),
                                           "run.checkpoint_location": str(tmp_path / "cp"), **changes}, ROW_TOML))


def test_the_asset_describes_the_rows_it_writes(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    asset = streaming_pipeline_asset(spec)
    asset_spec = asset.specs_by_key[asset.key]
    assert asset.key == dg.AssetKey(["public", "clicks_delayed"])
    assert f"rows of `{spec.transform_sql}` over clicks into postgres `public.clicks_delayed`" in \
        (asset_spec.description or "")
    assert asset_spec.tags["ematix/window"] == "none"
    assert EmatixPipeline.from_asset(asset).spec == spec
    assert {c.name for c in asset.check_specs} == {"checkpoint_consistency", "idempotent_target", "late_row_ratio"}


def test_a_windowed_description_is_unchanged() -> None:
    windowed = load_pipeline_str(mutated_toml({}))
    text = EmatixTranslator().get_description(EmatixPipeline(spec=windowed))
    assert text == ("Streaming pipeline `user-clicks-per-minute`: tumbling windows of 60 s per user_id over clicks "
                    "into parquet `data/out/user-clicks-per-minute` (trigger available_now).")


def test_idempotency_warnings_speak_of_rows(tmp_path: Path) -> None:
    console = _spec(tmp_path, target={"kind": "console"})
    assert idempotency_warnings(console) == [
        "the console target is not idempotent: a replayed batch prints its rows again (at-least-once); use a "
        "postgres or parquet target"]
    # without a key the rows are replaced by their release batch (_batch_id): no unique index to look for
    keyless = _spec(tmp_path, **{"target.key": []})
    assert idempotency_warnings(keyless) == []
