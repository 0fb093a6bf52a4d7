"""A row pipeline's SQL analysed by Spark (``spark.plans.row_plan``): its output columns in SELECT order, without the
engine's hidden ones, and the SQL's problems named on ``transform.sql``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spark.plans.row_plan import analyse_rows
from ematix_dagster.spark.sources.readers import union_sources
from ematix_dagster.spec import PipelineSpec, load_pipeline_str
from tests.spec.toml_samples import DELETE, ROW_TOML, mutated_toml


def _spec(tmp_path: Path, sql: str) -> PipelineSpec:
    (tmp_path / "clicks").mkdir(exist_ok=True)
    cap = {} if "WATERMARK_TS" in sql else {"transform.max_buffered_rows": DELETE}
    return load_pipeline_str(mutated_toml({"sources[0].path": str(tmp_path / "clicks"), "transform.sql": sql, **cap},
                                          ROW_TOML)).resolved()


def test_the_output_is_the_select_list_in_order(spark, tmp_path: Path) -> None:
    spec = _spec(tmp_path, "SELECT page, amount * 2 AS doubled, user_id FROM source "
                           "WHERE page = 'a' OR _event_ts + INTERVAL 1 MINUTE <= WATERMARK_TS()")
    schema = analyse_rows(spark, spec, union_sources(spark, spec))
    assert [(f.name, f.dataType.simpleString()) for f in schema.fields] == [
        ("page", "string"), ("doubled", "double"), ("user_id", "bigint")]


def test_a_release_time_that_is_not_a_timestamp_is_named(spark, tmp_path: Path) -> None:
    spec = _spec(tmp_path, "SELECT user_id FROM source WHERE page <= WATERMARK_TS()")
    with pytest.raises(PipelineConfigError) as info:
        analyse_rows(spark, spec, union_sources(spark, spec))
    assert info.value.key == "transform.sql" and "does not run" in str(info.value)
