"""Dagster integration: pipelines as assets, keep-alive sensors, state ops, checks, schedules.

>>> from ematix_dagster.dagster import streaming_pipeline_asset, checks_job  # doctest: +SKIP
>>> clicks = streaming_pipeline_asset("pipelines/clicks_per_minute.toml")             # doctest: +SKIP

Importing this package (and loading a code location built with it) starts no Spark session and
opens no database connection. See ``docs/dagster.md``.
"""

from ematix_dagster.dagster.assets import (
    DEFAULT_RETRY_POLICY,
    PipelineRunConfig,
    run_pipeline_events,
    streaming_pipeline_asset,
    streaming_pipeline_assets,
)
from ematix_dagster.dagster.backfill import backfill_asset, backfill_partitions
from ematix_dagster.dagster.checks import (
    CHECKPOINT_CHECK,
    IDEMPOTENT_TARGET_CHECK,
    LATE_ROW_RATIO_CHECK,
    WATERMARK_LAG_CHECK,
    CheckBounds,
)
from ematix_dagster.dagster.events import DEFAULT_SUMMARY_SECONDS, DEFAULT_THROTTLE_SECONDS, EmatixEventIterator
from ematix_dagster.dagster.jobs import (
    CheckIdempotentTargetConfig,
    MigrateStateConfig,
    ValidateCheckpointConfig,
    asset_run_config,
    checks_job,
    checks_schedule,
    maintenance_job,
    make_check_idempotent_target_op,
    make_migrate_state_op,
    make_validate_checkpoint_op,
    pipeline_job,
    pipeline_schedule,
    state_migration_job,
    state_migration_schedule,
)
from ematix_dagster.dagster.pipeline import (
    CODE_VERSION_TAG,
    ERROR_TAG,
    FAILURE_TAG,
    PIPELINE_TAG,
    TERMINATED_BY_TAG,
    EmatixPipeline,
)
from ematix_dagster.dagster.resources import (
    METRICS_KEY,
    SPARK_KEY,
    STATE_STORE_KEY,
    EmatixSparkResource,
    MetricsResource,
    StateStoreResource,
)
from ematix_dagster.dagster.sensors import keep_alive_decision, keep_alive_sensor, run_failure_sensor
from ematix_dagster.dagster.translator import EmatixTranslator
from ematix_dagster.dagster.watcher import RunWatcher

__all__ = [
    "CHECKPOINT_CHECK", "CODE_VERSION_TAG", "CheckBounds", "CheckIdempotentTargetConfig", "DEFAULT_RETRY_POLICY",
    "DEFAULT_SUMMARY_SECONDS", "DEFAULT_THROTTLE_SECONDS", "ERROR_TAG", "EmatixEventIterator", "EmatixPipeline", "EmatixSparkResource",
    "EmatixTranslator", "FAILURE_TAG", "IDEMPOTENT_TARGET_CHECK", "LATE_ROW_RATIO_CHECK", "METRICS_KEY",
    "MetricsResource", "MigrateStateConfig", "PIPELINE_TAG", "PipelineRunConfig", "SPARK_KEY", "STATE_STORE_KEY",
    "StateStoreResource", "TERMINATED_BY_TAG", "ValidateCheckpointConfig", "WATERMARK_LAG_CHECK", "asset_run_config",
    "backfill_asset", "backfill_partitions", "checks_job", "checks_schedule", "keep_alive_decision", "keep_alive_sensor", "maintenance_job",
    "make_check_idempotent_target_op", "make_migrate_state_op", "make_validate_checkpoint_op",
    "pipeline_job", "pipeline_schedule", "RunWatcher", "run_failure_sensor", "run_pipeline_events", "state_migration_job",
    "state_migration_schedule", "streaming_pipeline_asset", "streaming_pipeline_assets",
]
