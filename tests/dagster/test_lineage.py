"""Lineage and metadata of pipeline assets: sources as shared upstream assets, a pipeline downstream of
another's output, credential-free addresses, the output's columns, a translator per pipeline (no Spark)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import dagster as dg
import pyarrow as pa

from ematix_dagster.dagster import (
    EmatixPipeline,
    EmatixSparkResource,
    EmatixTranslator,
    MetricsResource,
    StateStoreResource,
    streaming_pipeline_asset,
    streaming_pipeline_assets,
)
from ematix_dagster.dagster.events import EmatixEventIterator
from ematix_dagster.dagster.lineage import output_schema_metadata
from ematix_dagster.metrics import default_metrics
from ematix_dagster.spark.batch.batch_step import BatchStep, EngineCall
from ematix_dagster.spec import PipelineSpec, Source, Target
from ematix_dagster.streaming.durable import Provenance
from ematix_dagster.targets import WindowWriter
from tests.dagster.test_events import KEY, T0, report
from tests.dagster_support import small_spec

CLICKS = dg.AssetKey(["files", "ematix", "data", "clicks"])


def graph(assets) -> dict[dg.AssetKey, set[dg.AssetKey]]:
    """Each asset's upstream keys, as the loaded Definitions see them."""
    resources = {"spark": EmatixSparkResource(), "state_store": StateStoreResource(),
                 "metrics": MetricsResource(enabled=False)}
    asset_graph = dg.Definitions(assets=assets, resources=resources).get_repository_def().asset_graph
    return {key: set(asset_graph.get(key).parent_keys) for key in asset_graph.get_all_asset_keys()}


def test_the_example_location_shares_the_clicks_input_and_gives_every_source_an_upstream_asset():
    from pipelines import definitions

    asset_graph = definitions.defs.get_repository_def().asset_graph
    readers = {key.to_user_string() for key in asset_graph.get(CLICKS).child_keys}
    assert readers == {"public/user_clicks_1min", "ematix/clicks-hopping-5min", "ematix/user-sessions",
                       "ematix/embargoed-clicks", "ematix/clicks-hourly-delayed", "public/user_clicks_1min-backfill"}
    assert asset_graph.get(CLICKS).is_external and not asset_graph.get(CLICKS).is_materializable
    revenue = asset_graph.get(dg.AssetKey(["ematix", "revenue-per-channel"]))
    assert {k.to_user_string() for k in revenue.parent_keys} == {"files/ematix/data/orders-web",
                                                                  "files/ematix/data/orders-mobile"}
    uri = asset_graph.get(CLICKS).metadata["dagster/uri"]
    assert uri == (Path.cwd() / ".ematix" / "data" / "clicks").as_uri()


def test_no_two_inputs_of_the_example_location_share_a_label():
    """The asset graph labels a node with its key's last part: the clicks files and the clicks Redis
    stream were two nodes both labelled "clicks"."""
    from pipelines import definitions

    asset_graph = definitions.defs.get_repository_def().asset_graph
    sources = [key for key in asset_graph.get_all_asset_keys() if asset_graph.get(key).is_external]
    labels = {key.to_user_string(): key.path[-1] for key in sources}
    assert len(set(labels.values())) == len(labels) == 5, labels
    assert labels["files/ematix/data/clicks"] == "clicks"
    assert labels["redis/ematix/clicks-stream"] == "clicks-stream"
    redis = asset_graph.get(dg.AssetKey(["redis", "ematix", "clicks-stream"]))
    assert redis.description == "Input of streaming pipelines: Redis stream(s) `ematix:clicks`."


def test_a_pipeline_reading_another_ones_parquet_output_is_downstream_of_it(tmp_path):
    first = small_spec(tmp_path / "a", "first")
    second = small_spec(tmp_path / "b", "second")
    reads_first = Source(name="clicks", kind="files", format="parquet", path=str(tmp_path / "a" / "out") + "/",
                         schema="user_id BIGINT, amount DOUBLE, ts TIMESTAMP", event_time_column="ts")
    second = second.__class__(**{**second.__dict__, "sources": (reads_first,)}).validate()
    parents = graph(streaming_pipeline_assets([first, second]))
    assert parents[dg.AssetKey(["ematix", "second"])] == {dg.AssetKey(["ematix", "first"])}
    # the first one reads its own input, an upstream asset of its own; nothing stands for the shared directory
    assert parents[dg.AssetKey(["ematix", "first"])] == {dg.AssetKey(["files", *str(tmp_path / "a" / "in").strip("/").split("/")])}
    assert len(parents) == 3


def test_target_addresses_carry_no_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("TARGET_URL", "postgresql://someone:s3cret@db.example:5433/prod?sslmode=require")
    spec = small_spec(tmp_path, target=Target(kind="postgres", url="${TARGET_URL}", table="sales.per_minute"))
    meta = streaming_pipeline_asset(spec).specs_by_key[dg.AssetKey(["sales", "per_minute"])].metadata
    assert meta["dagster/uri"] == "postgresql://db.example:5433/prod"
    assert meta["dagster/table_name"] == "sales.per_minute"
    assert "s3cret" not in str(meta) and "someone" not in str(meta)
    monkeypatch.delenv("TARGET_URL")  # unresolvable where the location loads: the table name only
    meta = streaming_pipeline_asset(spec).specs_by_key[dg.AssetKey(["sales", "per_minute"])].metadata
    assert "dagster/uri" not in meta and meta["dagster/table_name"] == "sales.per_minute"
    parquet = streaming_pipeline_asset(small_spec(tmp_path, "to-parquet"))
    assert parquet.specs_by_key[parquet.key].metadata["dagster/uri"] == (tmp_path / "out").as_uri()


class TeamTranslator(EmatixTranslator):
    """Keys, groups, owners and kinds per pipeline, and sources keyed by a catalog name."""

    def get_asset_key(self, pipeline: EmatixPipeline) -> dg.AssetKey:
        return dg.AssetKey(["analytics", pipeline.python_name])

    def get_group_name(self, pipeline: EmatixPipeline) -> str:
        return "growth" if pipeline.name.startswith("clicks") else "finance"

    def get_owners(self, pipeline: EmatixPipeline) -> list[str]:
        return [f"team:{self.get_group_name(pipeline)}"]

    def get_kinds(self, pipeline: EmatixPipeline) -> set[str]:
        return {"spark", "s3"}

    def get_source_asset_key(self, pipeline: EmatixPipeline, source: Source) -> dg.AssetKey:
        return dg.AssetKey(["raw", source.name])


def test_a_translator_sets_keys_groups_owners_kinds_and_source_keys_per_pipeline(tmp_path):
    assets = streaming_pipeline_assets([small_spec(tmp_path / "c", "clicks-a"), small_spec(tmp_path / "p", "pay-b")],
                                       translator=TeamTranslator())
    specs = {spec.key: spec for a in assets if isinstance(a, dg.AssetsDefinition) for spec in a.specs}
    clicks, pay = specs[dg.AssetKey(["analytics", "clicks_a"])], specs[dg.AssetKey(["analytics", "pay_b"])]
    assert (clicks.group_name, clicks.owners, clicks.kinds) == ("growth", ["team:growth"], {"spark", "s3"})
    assert (pay.group_name, pay.owners) == ("finance", ["team:finance"])
    # both read a source named "clicks": the translator's key makes it one upstream asset
    assert graph(assets)[clicks.key] == graph(assets)[pay.key] == {dg.AssetKey(["raw", "clicks"])}


def test_the_output_columns_and_the_rows_written_go_on_materializations():
    schema = pa.schema([("window_start", pa.timestamp("us", tz="UTC")), ("user_id", pa.int64()),
                        ("clicks", pa.int64())])
    columns = output_schema_metadata(SimpleNamespace(schema=schema))["dagster/column_schema"].columns
    assert [(c.name, c.type) for c in columns] == [("window_start", "timestamp[us, tz=UTC]"),
                                                   ("user_id", "int64"), ("clicks", "int64")]
    step = BatchStep(spec=cast(PipelineSpec, None), call=cast(EngineCall, SimpleNamespace(schema=schema)),
                     target=cast(WindowWriter, None), dead_letter=None, store=None, metrics=default_metrics(),
                     progress=print, provenance=Provenance())
    assert output_schema_metadata(step)["dagster/column_schema"].columns == columns  # the runner's step: its call's
    assert output_schema_metadata(None) == {}  # before the query started

    reports = [report(0, 5, watermark_s=T0 + 30), report(1, 4, emitted=3, corrections=1, watermark_s=T0 + 90)]
    events = list(EmatixEventIterator(reports, KEY, throttle_seconds=0,
                                      metadata=lambda: output_schema_metadata(SimpleNamespace(schema=schema))))
    observation, materialization, final = events
    assert "rows_written" not in observation.metadata  # consumed rows only
    assert materialization.metadata["rows_written"].value == 4  # 3 windows + 1 correction written
    assert "dagster/column_schema" in materialization.metadata and "dagster/column_schema" in final.metadata


def test_the_table_size_is_the_targets_own_count_and_never_fails_a_materialization():
    from ematix_dagster.dagster.lineage import table_size_metadata
    from ematix_dagster.errors import TargetError

    assert table_size_metadata(SimpleNamespace(target_row_count=lambda: 47)) == {"dagster/row_count": 47}
    assert table_size_metadata(SimpleNamespace(target_row_count=lambda: None)) == {}  # parquet, console
    assert table_size_metadata(None) == {}  # before the query started

    def unreachable() -> int:
        raise TargetError("target public.t: connection refused")

    assert table_size_metadata(SimpleNamespace(target_row_count=unreachable)) == {}


def test_kafka_topics_are_upstream_assets_and_rate_sources_have_none():
    from ematix_dagster.dagster.lineage import default_source_key, source_uri

    kafka = Source(name="orders", kind="kafka", bootstrap_servers="k1:9092,k2:9092", topic="shop.orders")
    assert default_source_key(kafka) == dg.AssetKey(["kafka", "shop_orders-topic"])
    assert source_uri(kafka) == "kafka://k1:9092/shop.orders"
    rate = Source(name="ticks", kind="rate", rows_per_second=5)
    assert default_source_key(rate) is None and source_uri(rate) is None
