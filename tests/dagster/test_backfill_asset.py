"""The partitioned backfill asset as the operator sees it (no Spark): the target's table name, address and
owners beside the streaming asset's, the ``rewritten_range`` check its step evaluates against the table,
and sample input whose past days are partitions a backfill rewrites."""

from __future__ import annotations

import dataclasses
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ematix_dagster.backfill import BackfillResult
from ematix_dagster.backfill.range import BackfillRange
from ematix_dagster.dagster import (
    EmatixSparkResource,
    MetricsResource,
    StateStoreResource,
    backfill_asset,
    streaming_pipeline_asset,
)
from ematix_dagster.spec import Backfill, PipelineSpec, Target
from tests.dagster_support import small_spec

UTC = timezone.utc
KEY = dg.AssetKey(["per_minute-backfill"])


class NoSpark(EmatixSparkResource):
    """The Spark resource without a JVM: the backfill itself is replaced in these tests."""

    def _init_session(self) -> None:
        self._spark_session = "no session"


def backfilled_spec(tmp_path: Path, pg_dsn: str, schema: str) -> PipelineSpec:
    spec = small_spec(tmp_path, "backfilled", target=Target(kind="postgres", url=pg_dsn, table=f"{schema}.per_minute"))
    return dataclasses.replace(spec, backfill=Backfill(partition="daily", start="2024-01-01")).validate()


def test_the_backfill_asset_names_its_target_table_and_owners_like_the_streaming_asset(tmp_path, monkeypatch):
    monkeypatch.setenv("TARGET_URL", "postgresql://someone:s3cret@db.example:5433/prod")
    spec = small_spec(tmp_path, target=Target(kind="postgres", url="${TARGET_URL}", table="sales.per_minute"))
    spec = dataclasses.replace(spec, backfill=Backfill(partition="daily", start="2024-01-01")).validate()
    streaming = streaming_pipeline_asset(spec, owners=["team:sales"])
    backfill = backfill_asset(spec, owners=["team:sales"])
    stream_spec, backfill_spec = streaming.specs_by_key[streaming.key], backfill.specs_by_key[backfill.key]
    for name in ("dagster/table_name", "dagster/uri"):
        assert backfill_spec.metadata[name] == stream_spec.metadata[name], name
    assert backfill_spec.metadata["dagster/uri"] == "postgresql://db.example:5433/prod"
    assert "s3cret" not in str(backfill_spec.metadata) and "someone" not in str(backfill_spec.metadata)
    assert backfill_spec.owners == stream_spec.owners == ["team:sales"]
    assert [c.name for c in backfill.check_specs] == ["rewritten_range"]
    assert backfill_asset(spec).specs_by_key[backfill.key].owners == []  # the translator's, when none are passed


def test_the_example_backfill_asset_has_the_streaming_assets_table_owners_and_a_check():
    from pipelines import definitions

    repo = definitions.defs.get_repository_def()
    stream = repo.assets_defs_by_key[dg.AssetKey(["public", "user_clicks_1min"])]
    backfill = repo.assets_defs_by_key[dg.AssetKey(["public", "user_clicks_1min-backfill"])]
    stream_spec, backfill_spec = stream.specs_by_key[stream.key], backfill.specs_by_key[backfill.key]
    assert backfill_spec.metadata["dagster/table_name"] == stream_spec.metadata["dagster/table_name"]
    assert backfill_spec.metadata["dagster/uri"] == stream_spec.metadata["dagster/uri"]
    assert backfill_spec.owners == stream_spec.owners == ["team:data-platform"]
    assert {c.name for c in backfill.check_specs} == {"rewritten_range"}


def fake_backfill(pg_dsn: str, table: str, *, reported: int, extra: int = 0):
    """A stand-in for ``run_backfill`` that writes three rows of the range into ``table`` and reports
    ``reported`` of them written; ``extra`` more rows of the range land as if from another writer."""

    def run(spec: PipelineSpec, start: str, end: str, spark=None, progress=print) -> BackfillResult:
        span = BackfillRange.parse(spec.backfill, start, end)
        first = datetime.fromisoformat(start)
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (window_start timestamptz, user_id bigint, clicks bigint)")
            for minute in range(3 + extra):
                conn.execute(f"INSERT INTO {table} VALUES (%s, 1, 2)", (first.replace(minute=minute),))
            conn.execute(f"INSERT INTO {table} VALUES (%s, 1, 2)", (datetime.fromisoformat(end),))  # the next day
        schema = pa.schema([("window_start", pa.timestamp("us", tz="UTC")), ("user_id", pa.int64()),
                            ("clicks", pa.int64())])
        return BackfillResult(spec.pipeline_name, span, windows=3, rows_written=reported, schema=schema)

    return run


def materialize(asset: dg.AssetsDefinition, day: str) -> dg.ExecuteInMemoryResult:
    resources = {"spark": NoSpark(), "state_store": StateStoreResource(kind="in_memory"),
                 "metrics": MetricsResource(enabled=False)}
    return dg.materialize([asset], partition_key=day, resources=resources, instance=dg.DagsterInstance.ephemeral())


@pytest.mark.parametrize("reported, extra, passed", [(3, 0, True), (3, 1, False)])
def test_the_backfill_step_reads_the_rewritten_range_back(tmp_path, pg_dsn, pg_schema, monkeypatch, reported, extra,
                                                          passed):
    import ematix_dagster.backfill

    table = f"{pg_schema}.per_minute"
    monkeypatch.setattr(ematix_dagster.backfill, "run_backfill", fake_backfill(pg_dsn, table, reported=reported,
                                                                               extra=extra))
    asset = backfill_asset(backfilled_spec(tmp_path, pg_dsn, pg_schema), key=KEY)
    result = materialize(asset, "2024-01-02")
    assert result.success
    (materialization,) = result.get_asset_materialization_events()
    metadata = materialization.materialization.metadata
    assert metadata["rows_written"].value == reported
    columns = [c.name for c in metadata["dagster/column_schema"].value.columns]
    assert columns == ["window_start", "user_id", "clicks"]
    (check,) = result.get_asset_check_evaluations()
    assert (check.check_name, check.passed) == ("rewritten_range", passed)
    assert check.metadata["rows_in_target"].value == 3 + extra  # the next day's row is outside the range
    assert check.severity == dg.AssetCheckSeverity.ERROR
    if not passed:
        assert "another writer" in (check.description or "")


def test_a_target_that_cannot_be_read_back_fails_the_check_not_the_step(tmp_path, pg_dsn, pg_schema, monkeypatch):
    import ematix_dagster.backfill

    monkeypatch.setattr(ematix_dagster.backfill, "run_backfill",
                        fake_backfill(pg_dsn, f"{pg_schema}.elsewhere", reported=3))
    result = materialize(backfill_asset(backfilled_spec(tmp_path, pg_dsn, pg_schema), key=KEY), "2024-01-02")
    assert result.success
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and "cannot read the target back" in (check.description or "")


def test_sample_data_holds_complete_past_days_the_backfill_asset_offers(tmp_path):
    from pipelines import definitions
    from pipelines.sample_data import CLICKS_PER_DAY, past_days, write_sample

    clicks = tmp_path / "clicks"
    first = write_sample(seed=7, root=tmp_path)
    files = sorted(clicks.glob("part-*.parquet"), key=lambda p: p.stat().st_mtime)
    assert files == [p for p in first if p.parent == clicks]
    days = past_days(datetime.now(UTC), 2)
    rows = [pq.read_table(f).to_pylist() for f in files]
    for start, day_rows in zip(days, rows[:2]):  # a file per past day, read before the recent minutes
        assert len(day_rows) == CLICKS_PER_DAY
        assert all(start <= r["ts"] < start + timedelta(days=1) for r in day_rows)
        assert len({r["ts"].hour for r in day_rows}) == 24, "spread over the whole day"
    assert min(r["ts"] for r in rows[2]) > max(r["ts"] for r in rows[1])

    # those days are partitions of the example backfill asset, each with windows to rewrite
    backfill = definitions.defs.get_repository_def().assets_defs_by_key[
        dg.AssetKey(["public", "user_clicks_1min-backfill"])]
    keys = backfill.partitions_def.get_partition_keys()
    assert [d.strftime("%Y-%m-%d") for d in days] == keys[-2:]
    assert all(r["amount"] >= 0 for day_rows in rows[:2] for r in day_rows)  # the pipeline's SQL keeps them

    # a second call adds recent minutes only: a past day now would be late for a stream already past it
    again = write_sample(seed=8, root=tmp_path)
    assert len([p for p in again if p.parent == clicks]) == 1
    assert write_sample(root=tmp_path / "none", days=0)[0].name == "part-00000.parquet"
    assert os.listdir(tmp_path / "none" / "clicks") == ["part-00000.parquet"]
