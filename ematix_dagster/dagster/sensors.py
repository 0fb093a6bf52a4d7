"""Sensors: a keep-alive sensor per long-running pipeline, and a run-failure reporter.

The keep-alive sensor is the only restarter (docs/dagster.md, docs/contract/operations.md). On each evaluation it
requests a run of the pipeline's job only when

1. no run of the pipeline is queued or in progress (runs tagged ``ematix/pipeline``, runs of its
   job, runs whose asset selection includes it);
2. the store's lease is free (the lease is the truth: a run launched from the CLI holds it too), or
   held by the orphaned step of a Dagster run that has ended, which the new run fences and takes
   over (:func:`~ematix_dagster.dagster.watcher.lease_of_finished_run`);
3. the latest checkpoint-consistency check did not fail;
4. the last finished run did not fail terminally (config error, cap hit, fingerprint or checkpoint
   divergence, newer state): it waits until the operator acts (launches the asset by hand, or
   changes the spec, which changes the code version);
5. the last finished run was not canceled by an operator (a run the migration job terminated is
   restarted);
6. after transient failures, an exponential backoff has passed.

Each ``RunRequest`` carries a fresh ``run_key`` (``<pipeline>:<generation>``, the generation kept
in the cursor), and every skip says why.
"""

import json
import logging
import time
from typing import Any, Callable, Optional, Sequence

import dagster as dg

from ematix_dagster.dagster.checks import CHECKPOINT_CHECK, latest_evaluation
from ematix_dagster.dagster.pipeline import (
    CODE_VERSION_TAG,
    ERROR_TAG,
    FAILURE_TAG,
    LAUNCHED_BY_TAG,
    PIPELINE_TAG,
    TERMINATED_BY_TAG,
    EmatixPipeline,
    PipelineLike,
)
from ematix_dagster.dagster.resources import StateStoreResource
from ematix_dagster.dagster.watcher import lease_of_finished_run

ACTIVE_STATUSES = (
    dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING,
)
FINISHED_STATUSES = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)

DEFAULT_BACKOFF_BASE_SECONDS = 30.0
DEFAULT_BACKOFF_MAX_SECONDS = 30 * 60.0


def _belongs(run: Any, pipeline: EmatixPipeline, job_names: Sequence[str]) -> bool:
    if run.tags.get(PIPELINE_TAG) == pipeline.name or run.job_name in job_names:
        return True
    selection = getattr(run, "asset_selection", None)
    if not selection:
        return False
    return pipeline.key in selection


def active_runs(instance: dg.DagsterInstance, pipeline: EmatixPipeline,
                job_names: Sequence[str] = ()) -> list[Any]:
    """Queued or in-progress runs of the pipeline, however they were launched."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=list(ACTIVE_STATUSES)))
    names = tuple(job_names) or (pipeline.job_name,)
    return [r for r in runs if _belongs(r, pipeline, names)]


def finished_run_records(instance: dg.DagsterInstance, pipeline: EmatixPipeline, limit: int = 20) -> list[Any]:
    """The pipeline's latest finished runs, newest first."""
    return list(instance.get_run_records(
        filters=dg.RunsFilter(tags={PIPELINE_TAG: pipeline.name}, statuses=list(FINISHED_STATUSES)), limit=limit))


def checkpoint_check_failed(instance: dg.DagsterInstance, pipeline: EmatixPipeline) -> Optional[str]:
    """The failure text of the latest checkpoint-consistency evaluation, when it failed."""
    evaluation = latest_evaluation(instance, pipeline.check_key(CHECKPOINT_CHECK))
    if evaluation is None or evaluation.passed:
        return None
    return (evaluation.description or "checkpoint and state store disagree").strip()


def _end_time(record: Any) -> float:
    if record.end_time is not None:
        return float(record.end_time)
    return record.update_timestamp.timestamp()


def keep_alive_decision(instance: dg.DagsterInstance, pipeline: EmatixPipeline, state_store: StateStoreResource, *,
                        job_names: Sequence[str] = (), backoff_base_seconds: float = DEFAULT_BACKOFF_BASE_SECONDS,
                        backoff_max_seconds: float = DEFAULT_BACKOFF_MAX_SECONDS,
                        now: Optional[float] = None) -> Optional[str]:
    """None when a run should be requested now, else the reason to skip."""
    name = pipeline.name
    active = active_runs(instance, pipeline, job_names)
    if active:
        run = active[0]
        return f"pipeline {name}: run {run.run_id} is {run.status.value}"
    try:
        holder = state_store.lease_holder(pipeline.spec)
    except Exception as exc:  # noqa: BLE001 - the store's messages carry no password
        return f"pipeline {name}: cannot ask the state store for the lease ({type(exc).__name__}: {exc}); retrying"
    if holder is not None and not lease_of_finished_run(instance)(holder):
        return f"pipeline {name}: the lease is held by {holder}"
    failed_check = checkpoint_check_failed(instance, pipeline)
    if failed_check is not None:
        return (f"pipeline {name}: the {CHECKPOINT_CHECK} check failed; not restarting until it passes: "
                f"{failed_check}")
    records = finished_run_records(instance, pipeline)
    records = [r for r in records if r.dagster_run.tags.get(FAILURE_TAG) != "lease_held"]
    if not records:
        return None
    last = records[0]
    run = last.dagster_run
    if run.status == dg.DagsterRunStatus.FAILURE and run.tags.get(FAILURE_TAG) == "terminal":
        if run.tags.get(CODE_VERSION_TAG) in (None, pipeline.code_version):
            return (f"pipeline {name}: the last run {run.run_id} failed terminally "
                    f"({run.tags.get(ERROR_TAG, 'error')}); not restarting until the operator acts: fix the cause, "
                    "then launch the asset once by hand (or change the pipeline spec)")
        return None
    if run.status == dg.DagsterRunStatus.CANCELED and not run.tags.get(TERMINATED_BY_TAG):
        return (f"pipeline {name}: the last run {run.run_id} was canceled by an operator; launch the asset by hand "
                "to resume keeping it alive")
    failures = 0
    for record in records:
        r = record.dagster_run
        if r.status != dg.DagsterRunStatus.FAILURE or r.tags.get(FAILURE_TAG) == "terminal":
            break
        failures += 1
    if failures:
        delay = min(backoff_base_seconds * 2 ** (failures - 1), backoff_max_seconds)
        waited = (time.time() if now is None else now) - _end_time(last)
        if waited < delay:
            return (f"pipeline {name}: backing off after {failures} transient failure(s): next start in "
                    f"{delay - waited:.0f} s (last run {run.run_id}: {run.tags.get(ERROR_TAG, 'failure')})")
    return None


def _cursor_generation(cursor: Optional[str]) -> int:
    if not cursor:
        return 0
    try:
        return int(json.loads(cursor).get("generation", 0))
    except (ValueError, AttributeError, TypeError):
        return 0


def keep_alive_sensor(
    pipeline: PipelineLike,
    job: Any,
    *,
    name: Optional[str] = None,
    minimum_interval_seconds: int = 30,
    backoff_base_seconds: float = DEFAULT_BACKOFF_BASE_SECONDS,
    backoff_max_seconds: float = DEFAULT_BACKOFF_MAX_SECONDS,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """Keeps one run of a long-running pipeline alive (see the module docstring).

    ``job`` is the pipeline's job (``jobs.pipeline_job``). Sensors start STOPPED by default:
    turn them on in the UI (or pass ``default_status=RUNNING``).
    """
    p = EmatixPipeline.load(pipeline)
    job_name = getattr(job, "name", p.job_name)

    @dg.sensor(name=name or f"{p.python_name}_keep_alive", job=job, minimum_interval_seconds=minimum_interval_seconds,
               default_status=default_status,
               description=f"Keeps one run of pipeline {p.name} alive (lease-aware, backoff after transient "
                           "failures, never after terminal ones).")
    def _keep_alive(context: dg.SensorEvaluationContext, state_store: StateStoreResource):
        reason = keep_alive_decision(context.instance, p, state_store, job_names=(job_name,),
                                     backoff_base_seconds=backoff_base_seconds, backoff_max_seconds=backoff_max_seconds)
        if reason is not None:
            return dg.SensorResult(skip_reason=dg.SkipReason(reason))
        generation = _cursor_generation(context.cursor) + 1
        request = dg.RunRequest(run_key=f"{p.name}:{generation}",
                                tags={PIPELINE_TAG: p.name, LAUNCHED_BY_TAG: "keep_alive_sensor"})
        return dg.SensorResult(run_requests=[request], cursor=json.dumps({"generation": generation}))

    return _keep_alive


def describe_failure(run: Any, step_failures: Sequence[Any] = ()) -> str:
    """One line per failed run: pipeline (or job), classification, error, what happens next."""
    pipeline = run.tags.get(PIPELINE_TAG)
    errors = []
    for event in step_failures:
        data = getattr(event, "step_failure_data", None)
        err = getattr(data, "error", None)
        user = getattr(data, "user_failure_data", None)
        text = getattr(user, "description", None) or (err.message if err is not None and err.message else None)
        if text:
            errors.append(text.strip().splitlines()[0])
        elif err is not None:
            errors.append(err.cls_name or "error")
    detail = "; ".join(errors) or run.tags.get(ERROR_TAG, "see the run's logs")
    if pipeline is None:
        return f"job {run.job_name}: run {run.run_id} failed: {detail}"
    kind = run.tags.get(FAILURE_TAG, "unclassified, treated as transient")
    action = {"terminal": "the operator must act; the keep-alive sensor will not restart it",
              "lease_held": "another run holds the lease; nothing to do"}.get(
        kind, "a keep-alive sensor restarts it after its backoff")
    return f"pipeline {pipeline}: run {run.run_id} failed ({kind}): {detail} -> {action}"


def tag_unclassified_failure(instance: dg.DagsterInstance, run: Any, step_failures: Sequence[Any] = (),
                             failure_event: Any = None) -> Any:
    """Give a failed pipeline run that no step classified the ``ematix/failure`` tag; returns the run as tagged.

    A step classifies its own failure. A run that failed outside its step (the run worker was
    killed, run monitoring gave up on it) carries no class; it counts as transient (the keep-alive
    sensor restarts it after its backoff) and ``ematix/error`` says what Dagster saw: the step
    failure's error class, else the run's failure reason (``UNEXPECTED_TERMINATION``, ...).
    """
    if run.tags.get(PIPELINE_TAG) is None or run.tags.get(FAILURE_TAG) is not None:
        return run
    error = None
    for event in step_failures:
        err = getattr(getattr(event, "step_failure_data", None), "error", None)
        error = error or getattr(err, "cls_name", None)
    reason = getattr(getattr(failure_event, "event_specific_data", None), "failure_reason", None)
    error = error or (reason.value if reason is not None else "RunFailure")
    instance.add_run_tags(run.run_id, {FAILURE_TAG: "transient", ERROR_TAG: error})
    return instance.get_run_by_id(run.run_id) or run


def failure_log_level(run: Any) -> int:
    """WARNING for a pipeline run whose failure is transient (the keep-alive sensor restarts it: nothing for
    an operator to do yet), ERROR for every other failed run."""
    transient = run.tags.get(PIPELINE_TAG) is not None and run.tags.get(FAILURE_TAG) == "transient"
    return logging.WARNING if transient else logging.ERROR


def run_failure_sensor(
    *,
    name: str = "ematix_run_failure_sensor",
    monitored_jobs: Optional[Sequence[Any]] = None,
    report: Optional[Callable[[str], None]] = None,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
) -> dg.SensorDefinition:
    """Reports failed runs (pipeline runs with their terminal/transient class) to the sensor log and ``report``.

    A pipeline run that failed outside its step is tagged transient first (:func:`tag_unclassified_failure`).
    It never requests a run: restarting is the keep-alive sensor's job alone.
    """

    @dg.run_failure_sensor(name=name, monitored_jobs=list(monitored_jobs) if monitored_jobs else None,
                           default_status=default_status,
                           description="Reports failed ematix pipeline runs; does not restart them.")
    def _report(context: dg.RunFailureSensorContext):
        step_failures = context.get_step_failure_events()
        run = tag_unclassified_failure(context.instance, context.dagster_run, step_failures, context.failure_event)
        text = describe_failure(run, step_failures)
        context.log.log(failure_log_level(run), text)
        if report is not None:
            report(text)
        return None

    return _report


__all__ = ["ACTIVE_STATUSES", "active_runs", "checkpoint_check_failed", "describe_failure", "failure_log_level",
           "keep_alive_decision",
           "keep_alive_sensor", "run_failure_sensor", "tag_unclassified_failure"]
