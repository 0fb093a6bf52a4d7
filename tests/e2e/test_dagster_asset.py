"""Materialize an available_now pipeline asset with Dagster on real Spark and a real PostgreSQL store.

Two materializations (the second resumes from the store after new input arrives), then the target
table is compared with a pandas ground truth, the per-batch events with the input, and the asset
checks and the keep-alive decision run on the state the runs left.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import dagster as dg
import pandas as pd
import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from ematix_dagster.dagster import (
    CODE_VERSION_TAG,
    PIPELINE_TAG,
    EmatixPipeline,
    EmatixSparkResource,
    MetricsResource,
    StateStoreResource,
    asset_run_config,
    checks_job,
    keep_alive_decision,
    streaming_pipeline_asset,
)
from ematix_dagster.operations import summary
from ematix_dagster.spec import Aggregation, PipelineSpec, Run, Source, StateStoreConfig, Target, Window
from tests.dagster_support import latest_check_evaluations

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SCHEMA = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))])
DURATION_S = 60


def rows(*items: tuple[int, float, float]) -> list[dict]:
    return [{"user_id": u, "amount": a, "ts": T0 + timedelta(seconds=s)} for u, a, s in items]


FILES_RUN_1 = [
    rows((1, 1.0, 5), (2, 2.0, 12), (1, 3.5, 20), (2, 1.25, 33), (1, 4.0, 47), (3, 2.0, 50)),
    rows((1, 1.5, 61), (3, 2.5, 70), (2, 3.0, 88), (1, 0.5, 95), (2, 1.0, 101), (3, 6.0, 110)),
    rows((2, 2.0, 125), (1, 1.0, 140), (1, 2.0, 150), (3, 3.0, 160), (2, 4.0, 170),
         (1, 9.0, 10)),  # event time 10 s: its window ended before the watermark of batch 2 -> late
]
FILES_RUN_2 = [rows((9, 1.0, 600))]  # moves the watermark past the open window


def ground_truth(files: list[list[dict]], lateness_s: float = 0.0) -> pd.DataFrame:
    """Independent pandas model: late rows by the watermark before their batch, then closed windows only."""
    kept, seen_max = [], None
    for batch in files:
        frame = pd.DataFrame(batch)
        frame["start"] = frame["ts"].dt.floor(f"{DURATION_S}s")
        if seen_max is not None:
            watermark_before = seen_max - pd.Timedelta(seconds=lateness_s)
            frame = frame[frame["start"] + pd.Timedelta(seconds=DURATION_S) > watermark_before]
        kept.append(frame)
        batch_max = pd.DataFrame(batch)["ts"].max()
        seen_max = batch_max if seen_max is None else max(seen_max, batch_max)
    data = pd.concat(kept)
    final_watermark = seen_max - pd.Timedelta(seconds=lateness_s)
    data = data[data["start"] + pd.Timedelta(seconds=DURATION_S) <= final_watermark]
    out = data.groupby(["start", "user_id"]).agg(clicks=("amount", "size"), amount_sum=("amount", "sum")).reset_index()
    return out.sort_values(["start", "user_id"]).reset_index(drop=True)


def test_materialize_an_available_now_pipeline_asset_end_to_end(spark, pg_dsn, pg_schema, batch_files, tmp_path):
    files = batch_files("clicks")
    spec = PipelineSpec(
        pipeline_name="dagster-e2e-clicks",
        sources=(Source(name="clicks", kind="files", format="parquet", path=str(files.directory),
                        schema="user_id BIGINT, amount DOUBLE, ts TIMESTAMP", event_time_column="ts",
                        max_files_per_trigger=1),),
        shape=Window(kind="tumbling", duration_ms=DURATION_S * 1000, group_by=("user_id",),
                           max_groups_per_window=1_000,
                           aggregations=(Aggregation(agg="count", as_="clicks"),
                                         Aggregation(agg="sum", column="amount", as_="amount_sum"))),
        target=Target(kind="postgres", url=pg_dsn, table=f"{pg_schema}.clicks_1min", create_table=True),
        state_store=StateStoreConfig(kind="sqlite", path=str(tmp_path / "never-used.db")),  # the resource overrides it
        run=Run(trigger="available_now", checkpoint_location=str(tmp_path / "checkpoint")),
    ).validate()
    asset = streaming_pipeline_asset(spec)
    assert asset.key == dg.AssetKey([pg_schema, "clicks_1min"])
    pipeline = EmatixPipeline.from_asset(asset)
    store = StateStoreResource(kind="postgres", url=pg_dsn, db_schema=pg_schema)
    spark_resource = EmatixSparkResource()
    resources = {"spark": spark_resource, "state_store": store, "metrics": MetricsResource(enabled=False)}
    defs = dg.Definitions(assets=[asset], jobs=[checks_job([asset])], resources=resources)
    run_config = asset_run_config(asset, throttle_seconds=0)  # one event per batch with data

    with dg.DagsterInstance.ephemeral() as instance:
        for batch in FILES_RUN_1:
            files.write(batch, SCHEMA)
        first = dg.materialize([asset], instance=instance, resources=resources, run_config=run_config)
        assert first.success
        tags = instance.get_run_by_id(first.run_id).tags
        assert tags[PIPELINE_TAG] == spec.pipeline_name and tags[CODE_VERSION_TAG] == pipeline.code_version

        # per-batch events: batch 0 only consumed rows (an observation), batches 1-2 wrote windows
        observations = [e for e in first.all_events if e.event_type_value == "ASSET_OBSERVATION"]
        materializations = first.asset_materializations_for_node(asset.op.name)
        assert [o.event_specific_data.asset_observation.metadata["batch_id"].value for o in observations] == [0]
        per_batch, final = materializations[:-1], materializations[-1]
        assert [m.metadata["batch_id"].value for m in per_batch] == [1, 2]
        # the step's own checks: from the store at the start (a fresh pipeline: nothing to measure yet), late
        # rows once its first batch ran; none is left planned (it would show "Running" in the UI)
        in_step = {e.check_name: e for e in first.get_asset_check_evaluations()}
        assert set(in_step) == {"checkpoint_consistency", "idempotent_target", "late_row_ratio"}
        assert in_step["checkpoint_consistency"].passed and in_step["idempotent_target"].passed
        assert in_step["late_row_ratio"].metadata["rows_consumed"].value == 6  # batch 0 alone
        # after each materialization, late rows over the run's recent batches, runless: batches 0-2, 1 of 18
        running = latest_check_evaluations(instance, asset.key)["late_row_ratio"]
        assert running.metadata["late_rows"].value == 1 and running.metadata["rows_consumed"].value == 18
        assert "batches 0-2 of this run" in running.description and not running.passed
        assert [m.metadata["rows_in"].value for m in per_batch] == [6, 6]
        assert [m.metadata["windows_emitted"].value for m in per_batch] == [3, 3]
        assert [m.metadata["late_rows"].value for m in per_batch] == [0, 1]
        batch2 = per_batch[1].metadata
        assert isinstance(batch2["watermark"], dg.TimestampMetadataValue)
        assert batch2["watermark"].value == (T0 + timedelta(seconds=170)).timestamp()
        assert batch2["watermark/clicks"].value == batch2["watermark"].value
        assert batch2["watermark_lag_seconds"].value > 0
        assert batch2["state_groups"].value == 3  # window [120 s, 180 s) stays open: users 1, 2, 3
        # run totals under their own names (a per-batch series never gets a run total as its last point)
        assert final.metadata["run_rows_in"].value == 18 and final.metadata["run_late_rows"].value == 1
        assert final.metadata["run_batches"].value == 3 and "rows_in" not in final.metadata

        # the Spark resource reused the test session and left it running
        assert not spark_resource.created_session
        assert spark.range(3).count() == 3

        # new input; the second run resumes from the PostgreSQL store
        for batch in FILES_RUN_2:
            files.write(batch, SCHEMA)
        second = dg.materialize([asset], instance=instance, resources=resources, run_config=run_config)
        assert second.success
        last = second.asset_materializations_for_node(asset.op.name)[-1]
        assert last.metadata["batch_id"].value == 3 and last.metadata["run_windows_emitted"].value == 3

        expected = ground_truth(FILES_RUN_1 + FILES_RUN_2)
        with psycopg.connect(pg_dsn) as conn:
            cur = conn.execute(sql.SQL("SELECT window_start, user_id, clicks, amount_sum FROM {} "
                                       "ORDER BY window_start, user_id").format(sql.Identifier(pg_schema, "clicks_1min")))
            actual = pd.DataFrame(cur.fetchall(), columns=["start", "user_id", "clicks", "amount_sum"])
        actual["start"] = pd.to_datetime(actual["start"], utc=True)
        expected["start"] = expected["start"].dt.tz_convert("UTC")
        assert len(expected) == 9
        assert actual[["start", "user_id", "clicks"]].to_dict("records") == \
            expected[["start", "user_id", "clicks"]].to_dict("records")
        assert actual["amount_sum"].tolist() == pytest.approx(expected["amount_sum"].tolist())

        # the state lives where the resource put it (PostgreSQL), not in the spec's SQLite file
        stored = summary(store.apply(spec))
        assert stored["last_batch_id"] == 3 and stored["lease_holder"] is None
        assert not (tmp_path / "never-used.db").exists()

        # the second run's step reported late rows over its own batch (3: none late of 1)
        late = latest_check_evaluations(instance, asset.key)["late_row_ratio"]
        assert late.metadata["late_rows"].value == 0 and late.metadata["rows_consumed"].value == 1 and late.passed

        # the checks job reads that state: consistent checkpoint, idempotent target; late rows passed on the
        # same stored batch (3), so not evaluated again
        assert defs.resolve_job_def("ematix_checks_job").execute_in_process(instance=instance).success
        evaluations = latest_check_evaluations(instance, asset.key)
        assert evaluations["checkpoint_consistency"].passed, evaluations["checkpoint_consistency"].description
        assert evaluations["checkpoint_consistency"].metadata["last_batch_id"].value == 3
        assert evaluations["idempotent_target"].passed
        assert evaluations["late_row_ratio"] == late

        # nothing runs, the lease is free, the last run succeeded: a keep-alive sensor would start it
        assert keep_alive_decision(instance, pipeline, store) is None
