"""Ops, jobs and schedules: run a pipeline, migrate state, validate checkpoints, run the checks.

* ``pipeline_job(p)``: the asset job of one pipeline (tagged ``ematix/pipeline`` so the
  instance's tag concurrency limit of 1 applies); the keep-alive sensor launches it.
* ``state_migration_job(pipelines)`` with its op ``migrate_state`` and
  ``state_migration_schedule`` (daily by default): migrates every pipeline whose lease is free;
  for a running one it records the migration as pending (the next start migrates anyway: state
  is brought forward on load and rewritten by commits) or, with ``restart_running = true``,
  terminates the run, waits for the lease, migrates, and lets the keep-alive sensor restart it.
  ``dry_run = true`` only says what would change.
* ``maintenance_job(pipelines)`` with ops ``validate_checkpoint`` (fails with the explanation)
  and ``check_idempotent_target`` (warns for console targets and missing natural keys).
* ``checks_job`` / ``checks_schedule``: the asset checks of pipelines that are not running, as
  runless evaluations (a running pipeline's step reports its own: :mod:`.check_reports`).

No ``from __future__ import annotations`` here: the module defines ``dagster.Config`` classes.
"""

import time
from typing import Any, Optional, Sequence

import dagster as dg
from pydantic import Field

from ematix_dagster.dagster.check_reports import report_stored_checks
from ematix_dagster.dagster.checks import (
    DEFAULT_CHECK_BOUNDS,
    CheckBounds,
    check_specs,
    checkpoint_problems,
    idempotency_warnings,
)
from ematix_dagster.dagster.pipeline import PIPELINE_TAG, TERMINATED_BY_TAG, EmatixPipeline, PipelineLike
from ematix_dagster.dagster.resources import StateStoreResource
from ematix_dagster.dagster.sensors import active_runs

DEFAULT_MIGRATION_CRON = "0 3 * * *"
DEFAULT_CHECKS_CRON = "*/15 * * * *"


def _pipelines(pipelines: Sequence[PipelineLike]) -> list[EmatixPipeline]:
    loaded = [EmatixPipeline.load(p) for p in pipelines]
    names = [p.name for p in loaded]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"pipeline names must be unique, got {duplicates} twice")
    return loaded


def _selected(pipelines: list[EmatixPipeline], names: Sequence[str]) -> list[EmatixPipeline]:
    if not names:
        return pipelines
    known = {p.name: p for p in pipelines}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise dg.Failure(description=f"unknown pipeline(s) {unknown}; known: {sorted(known)}", allow_retries=False)
    return [known[n] for n in names]


# ---------------------------------------------------------------------------------------------
# State migration


class MigrateStateConfig(dg.Config):
    dry_run: bool = Field(default=False, description="Only say what would change.")
    restart_running: bool = Field(
        default=False,
        description="Terminate a running pipeline's run, migrate, and let the keep-alive sensor restart it "
                    "(default: record the migration as pending; the next start migrates anyway).")
    pipelines: list[str] = Field(default_factory=list, description="Pipeline names; empty: all.")
    lease_wait_seconds: float = Field(default=120.0, description="How long to wait for a terminated run's lease.")


def _wait_for_lease(state_store: StateStoreResource, pipeline: EmatixPipeline, seconds: float) -> Optional[str]:
    deadline = time.monotonic() + seconds
    holder = state_store.lease_holder(pipeline.spec)
    while holder is not None and time.monotonic() < deadline:
        time.sleep(1.0)
        holder = state_store.lease_holder(pipeline.spec)
    return holder


def _migrate_now(spec: Any) -> int:
    from ematix_dagster.operations import leased, opened

    with opened(spec) as store, leased(store, spec, "migrate"):
        return store.migrate_state(spec.pipeline_name)


def make_migrate_state_op(pipelines: Sequence[PipelineLike], name: str = "migrate_state") -> dg.OpDefinition:
    """The ``migrate_state`` op over ``pipelines`` (see the module docstring)."""
    known = _pipelines(pipelines)

    @dg.op(name=name, tags={"kind": "ematix"},
           description="Bring stored window state to this version's format for every pipeline whose lease is free.")
    def _migrate_state(context: dg.OpExecutionContext, config: MigrateStateConfig, state_store: StateStoreResource):
        from ematix_dagster.errors import EmatixError
        from ematix_dagster.operations import migrate

        migrated: dict[str, int] = {}
        pending: list[str] = []
        errors: list[tuple[str, EmatixError]] = []
        for p in _selected(known, config.pipelines):
            spec = state_store.apply(p.spec)
            try:
                holder = state_store.lease_holder(p.spec)
                if holder is None:
                    if config.dry_run:
                        for line in migrate(spec, dry_run=True):
                            context.log.info(f"[dry run] {p.name}: {line}")
                        continue
                    migrated[p.name] = _migrate_now(spec)
                    context.log.info(f"{p.name}: rewrote {migrated[p.name]} state blobs")
                    continue
                runs = active_runs(context.instance, p)
                if config.restart_running and runs:
                    if config.dry_run:
                        context.log.info(f"[dry run] {p.name}: would terminate run(s) "
                                         f"{[r.run_id for r in runs]}, migrate, and let the sensor restart it")
                        continue
                    for run in runs:
                        context.instance.add_run_tags(run.run_id, {TERMINATED_BY_TAG: "migrate_state"})
                        context.log.info(f"{p.name}: terminating run {run.run_id} for the migration")
                        try:
                            context.instance.run_coordinator.cancel_run(run.run_id)
                        except Exception as exc:  # noqa: BLE001 - the lease wait below decides
                            context.log.warning(f"{p.name}: terminating run {run.run_id} failed: {exc}")
                    holder = _wait_for_lease(state_store, p, config.lease_wait_seconds)
                    if holder is None:
                        migrated[p.name] = _migrate_now(spec)
                        context.log.info(f"{p.name}: rewrote {migrated[p.name]} state blobs; the keep-alive "
                                         "sensor restarts the pipeline")
                        continue
                what = "would record" if config.dry_run else "recorded"
                context.log.warning(f"{p.name}: the lease is held by {holder}; {what} the migration as pending "
                                    "(applied when the pipeline next starts)")
                if not config.dry_run:
                    pending.append(p.name)
                    yield dg.AssetObservation(asset_key=p.key, metadata={"migration_pending": True,
                                                                         "lease_holder": holder},
                                              description="state migration pending: the pipeline is running")
            except EmatixError as exc:
                context.log.error(f"{p.name}: {type(exc).__name__}: {exc}")
                errors.append((p.name, exc))
        if errors:
            raise dg.Failure(
                description="state migration failed for " + "; ".join(f"{n}: {type(e).__name__}: {e}" for n, e in errors),
                metadata={"failed": len(errors), "migrated_pipelines": len(migrated)},
                allow_retries=not any(e.terminal for _, e in errors))
        yield dg.Output(
            {"migrated": migrated, "pending": pending},
            metadata={"migrated_pipelines": len(migrated), "blobs_rewritten": sum(migrated.values()),
                      "pending": len(pending), "dry_run": config.dry_run})

    return _migrate_state


def state_migration_job(pipelines: Sequence[PipelineLike], name: str = "ematix_state_migration_job") -> dg.JobDefinition:
    op = make_migrate_state_op(pipelines)

    @dg.job(name=name, description="Migrate stored window state of every pipeline (respects leases).",
            tags={"ematix/maintenance": "migrate_state"})
    def _job():
        op()

    return _job


def state_migration_schedule(job: Any, *, cron_schedule: str = DEFAULT_MIGRATION_CRON, dry_run: bool = False,
                             restart_running: bool = False, name: Optional[str] = None,
                             execution_timezone: str = "UTC",
                             default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
                             ) -> dg.ScheduleDefinition:
    """Runs the migration job on ``cron_schedule`` (daily at 03:00 UTC by default)."""
    return dg.ScheduleDefinition(
        name=name or f"{job.name}_schedule", job=job, cron_schedule=cron_schedule,
        execution_timezone=execution_timezone, default_status=default_status,
        run_config={"ops": {"migrate_state": {"config": {"dry_run": dry_run, "restart_running": restart_running}}}},
    )


# ---------------------------------------------------------------------------------------------
# Validation ops


class ValidateCheckpointConfig(dg.Config):
    pipelines: list[str] = Field(default_factory=list, description="Pipeline names; empty: all.")


class CheckIdempotentTargetConfig(dg.Config):
    pipelines: list[str] = Field(default_factory=list, description="Pipeline names; empty: all.")
    fail_on_warning: bool = Field(default=False, description="Fail instead of warning.")


def make_validate_checkpoint_op(pipelines: Sequence[PipelineLike],
                                name: str = "validate_checkpoint") -> dg.OpDefinition:
    known = _pipelines(pipelines)

    @dg.op(name=name, tags={"kind": "ematix"},
           description="Compare each pipeline's Spark checkpoint with its state store; fail with the explanation.")
    def _validate(context: dg.OpExecutionContext, config: ValidateCheckpointConfig, state_store: StateStoreResource):
        bad: list[str] = []
        for p in _selected(known, config.pipelines):
            problems, meta = checkpoint_problems(state_store.apply(p.spec))
            if problems:
                for problem in problems:
                    context.log.error(f"{p.name}: {problem}")
                bad.append(f"{p.name}: " + " | ".join(str(x) for x in problems))
            else:
                context.log.info(f"{p.name}: checkpoint and state store agree ({meta['store']}, "
                                 f"batch {meta['last_batch_id']})")
        if bad:
            raise dg.Failure(description="\n".join(bad), metadata={"pipelines_with_problems": len(bad)},
                             allow_retries=False)
        return dg.Output(None, metadata={"pipelines_checked": len(_selected(known, config.pipelines))})

    return _validate


def make_check_idempotent_target_op(pipelines: Sequence[PipelineLike],
                                    name: str = "check_idempotent_target") -> dg.OpDefinition:
    known = _pipelines(pipelines)

    @dg.op(name=name, tags={"kind": "ematix"},
           description="Warn for targets that make replays duplicate output (console, no natural key).")
    def _check(context: dg.OpExecutionContext, config: CheckIdempotentTargetConfig, state_store: StateStoreResource):
        warnings: list[str] = []
        for p in _selected(known, config.pipelines):
            for text in idempotency_warnings(state_store.apply(p.spec)):
                context.log.warning(f"{p.name}: {text}")
                warnings.append(f"{p.name}: {text}")
        if warnings and config.fail_on_warning:
            raise dg.Failure(description="\n".join(warnings), metadata={"warnings": len(warnings)},
                             allow_retries=False)
        return dg.Output(warnings, metadata={"warnings": len(warnings)})

    return _check


def maintenance_job(pipelines: Sequence[PipelineLike], name: str = "ematix_validate_job") -> dg.JobDefinition:
    validate = make_validate_checkpoint_op(pipelines)
    idempotent = make_check_idempotent_target_op(pipelines)

    @dg.job(name=name, description="Validate checkpoints and target idempotency of every pipeline.",
            tags={"ematix/maintenance": "validate"})
    def _job():
        validate()
        idempotent()

    return _job


# ---------------------------------------------------------------------------------------------
# Asset jobs and schedules


#: Run tag read by Dagster's run retries (``run_retries`` in ``dagster.yaml``).
MAX_RETRIES_TAG = "dagster/max_retries"


def pipeline_job(pipeline: PipelineLike, *, name: Optional[str] = None) -> Any:
    """The job that materializes one pipeline asset; its runs carry ``ematix/pipeline``.

    A long-running pipeline's job also carries ``dagster/max_retries = 0``: its keep-alive sensor is
    its one restarter, so instance-wide run retries (if someone enables them) never launch a second.
    """
    p = EmatixPipeline.load(pipeline)
    tags = {PIPELINE_TAG: p.name}
    if p.long_running:
        tags[MAX_RETRIES_TAG] = "0"
    return dg.define_asset_job(name=name or p.job_name, selection=dg.AssetSelection.assets(p.key),
                               tags=tags,
                               description=f"Run pipeline {p.name} ({p.spec.run.trigger}).")


def asset_run_config(pipeline: PipelineLike, *, throttle_seconds: Optional[float] = None,
                     summary_seconds: Optional[float] = None, watch_seconds: Optional[float] = None) -> dict[str, Any]:
    """Run config for a pipeline asset's ``PipelineRunConfig`` (empty: defaults)."""
    values = {"throttle_seconds": throttle_seconds, "summary_seconds": summary_seconds,
              "watch_seconds": watch_seconds}
    config = {k: float(v) for k, v in values.items() if v is not None}
    if not config:
        return {}
    p = EmatixPipeline.load(pipeline)
    return {"ops": {p.key.to_python_identifier(): {"config": config}}}


def pipeline_schedule(pipeline: PipelineLike, job: Any, cron_schedule: str, *, name: Optional[str] = None,
                      execution_timezone: str = "UTC", throttle_seconds: Optional[float] = None,
                      default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
                      ) -> dg.ScheduleDefinition:
    """Periodic runs of an ``available_now`` pipeline (each run processes what arrived since the last).

    Runs carry ``ematix/pipeline`` (from the job), so a run still going when the next tick comes
    waits in the queue (tag concurrency limit) and the lease keeps it from running twice.
    """
    p = EmatixPipeline.load(pipeline)
    return dg.ScheduleDefinition(name=name or f"{p.python_name}_schedule", job=job, cron_schedule=cron_schedule,
                                 execution_timezone=execution_timezone, default_status=default_status,
                                 run_config=asset_run_config(p, throttle_seconds=throttle_seconds) or None,
                                 tags={PIPELINE_TAG: p.name})


def checks_job(pipelines: Sequence[PipelineLike], name: str = "ematix_checks_job") -> dg.JobDefinition:
    """A job reporting the checks of pipelines that are not running (a running pipeline's step
    reports its own), as runless evaluations, from the store: no Spark session, no pool slot."""
    loaded = _pipelines(pipelines)
    bounds = {p.name: _check_bounds(p, value) for p, value in zip(loaded, pipelines)}

    @dg.op(name="report_checks", description="Evaluate the checks of the ematix pipelines that are not running.",
           tags={"ematix/maintenance": "checks"})
    def report_checks(context: dg.OpExecutionContext, state_store: StateStoreResource) -> None:
        for p in loaded:
            if active_runs(context.instance, p):
                context.log.info(f"pipeline {p.name}: running; its step reports its checks")
                continue
            declared, check_bounds = bounds[p.name]
            reported, skipped = report_stored_checks(context.instance, p, state_store.apply(p.spec), check_bounds,
                                                     declared)
            context.log.info(f"pipeline {p.name}: reported {', '.join(reported) or 'no check'}"
                             + (f"; skipped {', '.join(sorted(skipped))} (never ran, or passed on the same stored "
                                "batch)" if skipped else ""))

    @dg.job(name=name, description="Asset checks of the ematix pipelines that are not running (checkpoint, "
                                   "idempotency, watermark lag, late rows).",
            tags={"ematix/maintenance": "checks"})
    def _job():
        report_checks()

    return _job


def _check_bounds(pipeline: EmatixPipeline, value: PipelineLike) -> tuple[set[str], CheckBounds]:
    """The checks an asset declares and their bounds (the defaults for a spec or a path)."""
    if isinstance(value, dg.AssetsDefinition):
        return {spec.name for spec in value.check_specs}, CheckBounds.of_asset(value)
    bounds = DEFAULT_CHECK_BOUNDS.for_pipeline(pipeline)
    return {spec.name for spec in check_specs(pipeline, bounds)}, bounds


def checks_schedule(job: Any, *, cron_schedule: str = DEFAULT_CHECKS_CRON, name: Optional[str] = None,
                    execution_timezone: str = "UTC",
                    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
                    ) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(name=name or f"{job.name}_schedule", job=job, cron_schedule=cron_schedule,
                                 execution_timezone=execution_timezone, default_status=default_status)


__all__ = ["CheckIdempotentTargetConfig", "DEFAULT_CHECKS_CRON", "DEFAULT_MIGRATION_CRON", "MigrateStateConfig",
           "ValidateCheckpointConfig", "checks_job", "checks_schedule", "maintenance_job",
           "asset_run_config", "make_check_idempotent_target_op", "make_migrate_state_op", "make_validate_checkpoint_op",
           "pipeline_job", "pipeline_schedule", "state_migration_job", "state_migration_schedule"]
