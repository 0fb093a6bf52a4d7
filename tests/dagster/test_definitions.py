"""The example code location: loads without Spark or databases, names, specs, schedules' run config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg
import pytest

from ematix_dagster.spec import load_pipeline

ROOT = Path(__file__).resolve().parent.parent.parent

EXPECTED_ASSETS = {"public/user_clicks_1min", "ematix/clicks-hopping-5min", "ematix/user-sessions",
                   "ematix/card-payments", "ematix/revenue-per-channel", "ematix/embargoed-clicks",
                   "ematix/clicks-hourly-delayed", "ematix/clicks-redis"}
BACKFILL_ASSETS = {"public/user_clicks_1min-backfill"}  # partitioned, its own check (rewritten_range)
EXPECTED_SOURCES = {"files/ematix/data/clicks", "files/ematix/data/payments", "files/ematix/data/orders-web",
                    "files/ematix/data/orders-mobile", "redis/ematix/clicks-stream"}  # the inputs, as upstream assets
EXPECTED_SENSORS = {"clicks_per_minute_keep_alive", "revenue_per_channel_keep_alive", "ematix_run_failure_sensor"}
EXPECTED_JOBS = {"clicks_per_minute_job", "clicks_hopping_5min_job", "user_sessions_job", "card_payments_job",
                 "revenue_per_channel_job", "embargoed_clicks_job", "clicks_hourly_delayed_job", "clicks_redis_job", "ematix_state_migration_job", "ematix_validate_job",
                 "ematix_checks_job"}
EXPECTED_SCHEDULES = {"clicks_hopping_5min_schedule", "ematix_state_migration_job_schedule",
                      "ematix_checks_job_schedule"}

# Loads the code location with every way to start Spark or open a database connection booby-trapped.
_PROBE = r"""
import json, sqlite3, sys
import psycopg, psycopg_pool
def trap(*a, **k):
    raise AssertionError("loading the definitions opened a connection or started Spark")
psycopg.connect = trap
psycopg.Connection.connect = classmethod(trap)
psycopg_pool.ConnectionPool.__init__ = trap
sqlite3.connect = trap
import pyspark
pyspark.SparkContext.__init__ = trap
import dagster as dg
from pipelines.definitions import defs
dg.Definitions.validate_loadable(defs)
repo = defs.get_repository_def()
from pyspark import SparkContext
print(json.dumps({
    "assets": sorted(k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()),
    "checks": sorted(f"{k.asset_key.to_user_string()}:{k.name}" for k in repo.asset_graph.asset_check_keys),
    "sensors": sorted(s.name for s in repo.sensor_defs),
    "jobs": sorted(j.name for j in repo.get_all_jobs() if not j.name.startswith("__")),
    "schedules": sorted(s.name for s in repo.schedule_defs),
    "spark": SparkContext._active_spark_context is not None,
}))
"""


def test_loading_the_code_location_starts_no_spark_and_opens_no_connection():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("EMATIX_PG_URL", None)  # the location supplies its safe local default
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not found["spark"]
    assert set(found["assets"]) == EXPECTED_ASSETS | BACKFILL_ASSETS | EXPECTED_SOURCES
    assert EXPECTED_SENSORS <= set(found["sensors"])
    assert EXPECTED_JOBS <= set(found["jobs"])
    assert EXPECTED_SCHEDULES <= set(found["schedules"])
    for asset in EXPECTED_ASSETS:
        for check in ("checkpoint_consistency", "idempotent_target", "late_row_ratio"):
            assert f"{asset}:{check}" in found["checks"]
    # the lag check exists for the long-running pipelines only
    assert "public/user_clicks_1min:watermark_lag" in found["checks"]
    assert "ematix/clicks-hopping-5min:watermark_lag" not in found["checks"]
    assert "ematix/card-payments:watermark_lag" not in found["checks"]
    assert "public/user_clicks_1min-backfill:rewritten_range" in found["checks"]


@pytest.mark.slow
def test_dagster_cli_validates_the_workspace():
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "passed validation" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def location():
    from pipelines import definitions

    return definitions


def test_each_example_exists_as_toml_and_as_python_facade_with_the_same_spec(location):
    from pipelines.examples import PIPELINES

    files = {"clicks-per-minute": "clicks_per_minute.toml", "clicks-hopping-5min": "clicks_hopping_5min.toml",
             "user-sessions": "user_sessions.toml", "card-payments": "card_payments.toml",
             "revenue-per-channel": "revenue_per_channel.toml", "embargoed-clicks": "embargoed_clicks.toml",
             "clicks-hourly-delayed": "clicks_hourly_delayed.toml", "clicks-redis": "clicks_redis.toml"}
    assert set(PIPELINES) == set(files)
    for name, file in files.items():
        assert load_pipeline(ROOT / "pipelines" / file) == PIPELINES[name].spec, name
    kinds = {p.spec.window.kind for p in PIPELINES.values() if not p.spec.is_row_pipeline}
    assert kinds == {"tumbling", "hopping", "session", "sliding"}
    assert PIPELINES["clicks-per-minute"].spec.target.kind == "postgres"
    assert PIPELINES["clicks-hopping-5min"].spec.window.duration_ms == 300_000
    assert PIPELINES["clicks-hopping-5min"].spec.window.hop_ms == 60_000
    assert len(PIPELINES["revenue-per-channel"].spec.sources) == 2
    assert PIPELINES["card-payments"].spec.window.duration_ms == 600_000
    assert PIPELINES["card-payments"].spec.window.max_events_per_group is not None
    embargo = PIPELINES["embargoed-clicks"].spec
    assert embargo.is_row_pipeline and embargo.rows is not None and embargo.rows.max_buffered_rows
    assert "WATERMARK_TS()" in (embargo.transform_sql or "")
    delayed = PIPELINES["clicks-hourly-delayed"].spec
    assert delayed.window.duration_ms == 3_600_000 and delayed.emit is not None
    assert "window_end + INTERVAL 1 HOUR <= WATERMARK_TS()" in delayed.emit.sql


def test_asset_spec_keys_kinds_tags_and_an_environment_free_code_version(location, monkeypatch):
    from ematix_dagster.dagster import EmatixPipeline, streaming_pipeline_asset

    repo = location.defs.get_repository_def()
    clicks = repo.assets_defs_by_key[dg.AssetKey(["public", "user_clicks_1min"])]
    spec = clicks.specs_by_key[clicks.key]
    assert spec.kinds == {"spark", "postgres"} and spec.owners == ["team:data-platform"]
    assert spec.tags["ematix/pipeline"] == "clicks-per-minute"
    assert spec.code_version and "Clicks per user per minute" in (spec.description or "")
    assert "${EMATIX_PG_URL}" in spec.metadata["ematix/pipeline_toml"].value  # the placeholder, not the value
    hopping = repo.assets_defs_by_key[dg.AssetKey(["ematix", "clicks-hopping-5min"])]
    assert hopping.specs_by_key[hopping.key].kinds == {"spark", "parquet"}
    # the code version hashes the spec, not the environment's values
    monkeypatch.setenv("EMATIX_PG_URL", "postgresql://someone:secret@db.example:5433/prod")
    again = streaming_pipeline_asset(ROOT / "pipelines" / "clicks_per_minute.toml")
    assert again.code_versions_by_key[again.key] == spec.code_version
    assert "secret" not in str(again.specs_by_key[again.key].metadata)
    # the asset's metadata carries the spec back
    assert EmatixPipeline.from_asset(clicks).spec == load_pipeline(ROOT / "pipelines" / "clicks_per_minute.toml")


def test_schedules_produce_run_config_their_jobs_accept(location):
    repo = location.defs.get_repository_def()
    when = datetime(2026, 1, 2, 3, 0, tzinfo=timezone.utc)
    seen = 0
    for schedule in repo.schedule_defs:
        context = dg.build_schedule_context(scheduled_execution_time=when, repository_def=repo)
        data = schedule.evaluate_tick(context)
        assert data.run_requests, schedule.name
        for request in data.run_requests:
            job = repo.get_job(schedule.job_name)
            dg.validate_run_config(job, request.run_config)  # raises on invalid config
            seen += 1
    assert seen == len(repo.schedule_defs) >= 3
    migration = repo.get_schedule_def("ematix_state_migration_job_schedule")
    assert migration.cron_schedule == "0 3 * * *"
    tick = migration.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=when, repository_def=repo))
    config = tick.run_requests[0].run_config["ops"]["migrate_state"]["config"]
    assert config == {"dry_run": False, "restart_running": False}


def test_a_configured_migration_schedule_and_a_throttled_pipeline_schedule_validate(location):
    from ematix_dagster.dagster import pipeline_schedule, state_migration_schedule

    repo = location.defs.get_repository_def()
    custom = state_migration_schedule(location.migration_job, cron_schedule="30 1 * * 0", dry_run=True,
                                      restart_running=True, name="weekly_dry_run")
    throttled = pipeline_schedule(location.clicks_hopping, location.pipeline_jobs["clicks-hopping-5min"],
                                  "0 * * * *", name="hourly", throttle_seconds=0)
    for schedule in (custom, throttled):
        data = schedule.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=datetime.now(timezone.utc)))
        request = data.run_requests[0]
        dg.validate_run_config(repo.get_job(schedule.job_name), request.run_config)
    assert custom.cron_schedule == "30 1 * * 0"
    assert throttled.evaluate_tick(dg.build_schedule_context()).run_requests[0].run_config == {
        "ops": {"ematix__clicks_hopping_5min": {"config": {"throttle_seconds": 0.0}}}}


def test_pipeline_jobs_run_their_asset_with_its_checks_and_the_checks_job_reads_stores(location):
    repo = location.defs.get_repository_def()
    # the asset's own step evaluates its checks: no separate check step that a never-ending step would hold back
    assert list(repo.get_job("clicks_per_minute_job").graph.node_dict) == ["public__user_clicks_1min"]
    asset = location.defs.resolve_assets_def(dg.AssetKey.from_user_string("public/user_clicks_1min"))
    assert {c.name for c in asset.check_specs} == {"checkpoint_consistency", "idempotent_target", "late_row_ratio",
                                                   "watermark_lag"}
    assert [c.name for c in asset.check_specs if c.blocking] == ["checkpoint_consistency"]
    checks = sum(len(location.defs.resolve_assets_def(dg.AssetKey.from_user_string(key)).check_specs)
                 for key in EXPECTED_ASSETS)
    assert checks == 26  # three per pipeline (8), watermark_lag for the two long-running ones
    assert list(repo.get_job("ematix_checks_job").graph.node_dict) == ["report_checks"]
    schedule = repo.get_schedule_def("ematix_checks_job_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert repo.get_job("clicks_per_minute_job").tags["ematix/pipeline"] == "clicks-per-minute"
