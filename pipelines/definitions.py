"""The example code location: eight pipelines as assets, with checks, sensors, jobs and schedules.

Seven pipelines are loaded from the TOML files next to this module; ``revenue-per-channel`` comes from
the Python facade in ``pipelines/examples.py`` (its TOML twin is kept equal by a test, but editing
the TOML changes nothing here).

``dagster dev -w workspace.yaml`` (from the repository root) loads this module. Loading it starts
no Spark session and opens no database connection: Spark starts inside a run, and stores are
opened by runs, sensors, checks and ops only while they need them.

Configuration comes from the environment, with safe local defaults:

================================  ===========================================================
``EMATIX_PG_URL``                 target database (``postgresql://postgres@127.0.0.1:5432/test``)
``EMATIX_STATE_KIND``             ``sqlite`` (default), ``postgres`` or ``in_memory``
``EMATIX_STATE_PATH``             SQLite file (``.ematix/state.db``)
``EMATIX_STATE_URL``              PostgreSQL store URL (read through ``dg.EnvVar``, never logged)
``EMATIX_STATE_SCHEMA``           PostgreSQL store schema (``ematix``)
``EMATIX_SPARK_MASTER``           Spark master (``local[2]``; the driver binds to 127.0.0.1)
``EMATIX_METRICS_PORT``           serve Prometheus metrics on 127.0.0.1:PORT (unset: off)
``EMATIX_MIGRATION_CRON``         state migration schedule (``0 3 * * *``, UTC)
``EMATIX_MIGRATION_RESTART``      ``1``: the migration terminates running pipelines, migrates, lets
                                  the keep-alive sensor restart them (default ``0``: pending)
``EMATIX_CHECKS_CRON``            asset checks schedule (``*/15 * * * *``)
``EMATIX_CHECKS_SCHEDULE``        ``0``: that schedule starts stopped (default ``1``: running)
``EMATIX_KEEP_ALIVE_INTERVAL_S``  keep-alive sensors' minimum interval (``30``)
``EMATIX_KEEP_ALIVE_BACKOFF_S``   first backoff after a transient failure, doubled per failure (``30``)
``EMATIX_MAX_WATERMARK_LAG_S``    every pipeline's ``watermark_lag`` bound (unset: 600 s for the running
                                  pipelines, no lag check for the scheduled ones)
``EMATIX_CHECK_INTERVAL_S``       how often a running pipeline evaluates its lag and late-row checks (``60``)
================================  ===========================================================

Data lives under ``.ematix/`` (inputs in ``.ematix/data``, checkpoints, state, Parquet output);
``python -m pipelines.sample_data`` writes a few minutes of sample input (and, into an empty clicks
directory, the two complete UTC days before today, which the backfill asset can rewrite).
"""

import os
from pathlib import Path

import dagster as dg

from ematix_dagster.dagster import (
    CheckBounds,
    EmatixPipeline,
    EmatixSparkResource,
    MetricsResource,
    StateStoreResource,
    backfill_asset,
    checks_job,
    checks_schedule,
    keep_alive_sensor,
    maintenance_job,
    pipeline_job,
    pipeline_schedule,
    run_failure_sensor,
    state_migration_job,
    state_migration_schedule,
    streaming_pipeline_assets,
)
from ematix_dagster.dagster.checks import DEFAULT_CHECK_INTERVAL_SECONDS
from pipelines.examples import revenue_per_channel  # also sets the EMATIX_PG_URL default

HERE = Path(__file__).resolve().parent


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    return default if value is None or not value.strip() else float(value)


# -- pipelines: seven from TOML files, one from the Python facade -------------------------------------
clicks_per_minute = EmatixPipeline.load(HERE / "clicks_per_minute.toml")
clicks_hopping = EmatixPipeline.load(HERE / "clicks_hopping_5min.toml")
user_sessions = EmatixPipeline.load(HERE / "user_sessions.toml")
card_payments = EmatixPipeline.load(HERE / "card_payments.toml")
embargoed_clicks = EmatixPipeline.load(HERE / "embargoed_clicks.toml")  # a row pipeline: WATERMARK_TS()
hourly_delayed = EmatixPipeline.load(HERE / "clicks_hourly_delayed.toml")  # windows published late: [emit] sql
clicks_redis = EmatixPipeline.load(HERE / "clicks_redis.toml")  # a Redis stream: python -m pipelines.redis_producer
revenue = EmatixPipeline.load(revenue_per_channel)
PIPELINES = [clicks_per_minute, clicks_hopping, user_sessions, card_payments, embargoed_clicks, hourly_delayed,
             clicks_redis, revenue]

# -- assets, with their checks and their inputs as upstream assets --------------------------------------
# .ematix/data/clicks is one asset, read by five pipelines, and the Redis stream ematix:clicks another
# (redis/ematix/clicks-stream, labelled clicks-stream in the graph); each asset's step evaluates its own checks
OWNERS = ["team:data-platform"]
_max_lag = os.environ.get("EMATIX_MAX_WATERMARK_LAG_S")
checks = CheckBounds(max_watermark_lag_seconds=float(_max_lag) if _max_lag else None,
                     check_interval_seconds=_env_seconds("EMATIX_CHECK_INTERVAL_S", DEFAULT_CHECK_INTERVAL_SECONDS))
assets = streaming_pipeline_assets(PIPELINES, owners=OWNERS, checks=checks)
# partitioned backfills of the pipelines with [backfill]: rewrite past days from archived input
backfill_assets = [backfill_asset(p, owners=OWNERS) for p in PIPELINES if p.spec.backfill is not None]

# -- jobs, sensors, schedules -----------------------------------------------------------------------
pipeline_jobs = {p.name: pipeline_job(p) for p in PIPELINES}
keep_alive_sensors = [
    keep_alive_sensor(p, pipeline_jobs[p.name],
                      minimum_interval_seconds=int(_env_seconds("EMATIX_KEEP_ALIVE_INTERVAL_S", 30)),
                      backoff_base_seconds=_env_seconds("EMATIX_KEEP_ALIVE_BACKOFF_S", 30.0))
    for p in PIPELINES if p.long_running
]
failure_sensor = run_failure_sensor()

migration_job = state_migration_job(PIPELINES)
validate_job = maintenance_job(PIPELINES)
all_checks_job = checks_job([a for a in assets if isinstance(a, dg.AssetsDefinition)])

schedules = [
    pipeline_schedule(clicks_hopping, pipeline_jobs[clicks_hopping.name], "*/10 * * * *"),
    state_migration_schedule(migration_job, cron_schedule=os.environ.get("EMATIX_MIGRATION_CRON", "0 3 * * *"),
                             restart_running=_env_flag("EMATIX_MIGRATION_RESTART", False)),
    # on by default: it reads the stores of the pipelines that are not running, nothing else
    checks_schedule(all_checks_job, cron_schedule=os.environ.get("EMATIX_CHECKS_CRON", "*/15 * * * *"),
                    default_status=(dg.DefaultScheduleStatus.RUNNING if _env_flag("EMATIX_CHECKS_SCHEDULE", True)
                                    else dg.DefaultScheduleStatus.STOPPED)),
]


# -- resources --------------------------------------------------------------------------------------
def _state_store() -> StateStoreResource:
    kind = os.environ.get("EMATIX_STATE_KIND", "sqlite")
    if kind == "postgres":
        return StateStoreResource(kind="postgres", url=dg.EnvVar("EMATIX_STATE_URL"),
                                  db_schema=os.environ.get("EMATIX_STATE_SCHEMA", "ematix"))
    if kind == "in_memory":
        return StateStoreResource(kind="in_memory")
    return StateStoreResource(kind="sqlite", path=os.environ.get("EMATIX_STATE_PATH", ".ematix/state.db"))


_metrics_port = os.environ.get("EMATIX_METRICS_PORT")
resources = {
    "spark": EmatixSparkResource(master=os.environ.get("EMATIX_SPARK_MASTER", "local[2]")),
    "state_store": _state_store(),
    "metrics": MetricsResource(enabled=_metrics_port is not None,
                               port=int(_metrics_port) if _metrics_port else None),
}

defs = dg.Definitions(
    assets=[*assets, *backfill_assets],
    jobs=[*pipeline_jobs.values(), migration_job, validate_job, all_checks_job],
    sensors=[*keep_alive_sensors, failure_sensor],
    schedules=schedules,
    resources=resources,
)
