"""A pipeline as a Dagster asset: materializing it runs the streaming query.

``streaming_pipeline_asset(spec_or_path)`` builds the asset (its ``AssetSpec`` from
:mod:`ematix_dagster.dagster.translator`: keyed by the target table, with the spec's hash as code
version); its compute function is a generator that yields the runner's per-batch reports as
Dagster events (:mod:`ematix_dagster.dagster.events`). It ends with a ``MaterializeResult`` (the
run's totals as ``run_*``) when the input is exhausted (``available_now``) or when the run is
terminated. A step that finds itself orphaned (:mod:`ematix_dagster.dagster.watcher`) stops the
query and ends its process without another event. A ``processing_time`` run stays up until then.

All waiting on py4j happens on the runner's background thread; this generator's thread only
waits on a queue, so the ``DagsterExecutionInterruptedError`` of a terminated run lands there.
It is caught in :func:`run_pipeline_events` (it must not leave the compute function: Dagster's op
boundary would turn it into a retry request because the asset has a ``RetryPolicy``), and the
runner stops the query at a batch boundary.

No ``from __future__ import annotations`` here: the module defines a ``dagster.Config``.
"""

import logging
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

import dagster as dg
from pydantic import Field

from ematix_dagster.dagster.check_reports import CheckTimer, StepChecks
from ematix_dagster.dagster.checks import CHECKPOINT_CHECK, DEFAULT_CHECK_BOUNDS, CheckBounds, check_specs
from ematix_dagster.dagster.events import DEFAULT_SUMMARY_SECONDS, DEFAULT_THROTTLE_SECONDS, EmatixEventIterator
from ematix_dagster.dagster.lineage import (
    output_schema_metadata,
    source_location,
    table_size_metadata,
    target_location,
)
from ematix_dagster.dagster.pipeline import (
    CODE_VERSION_TAG,
    ERROR_TAG,
    FAILURE_TAG,
    PIPELINE_TAG,
    EmatixPipeline,
    PipelineLike,
    register,
)
from ematix_dagster.dagster.resources import EmatixSparkResource, MetricsResource, StateStoreResource
from ematix_dagster.dagster.translator import EmatixTranslator
from ematix_dagster.dagster.unreported import unreported_materialization
from ematix_dagster.dagster.versions import batch_provenance
from ematix_dagster.dagster.watcher import DEFAULT_WATCH_INTERVAL_SECONDS, RunWatcher, lease_of_finished_run
from ematix_dagster.errors import CheckpointDiverged, LeaseHeld, LeaseLost
from ematix_dagster.spark.failures.classify import classify
from ematix_dagster.spec import PipelineSpec, spec_warnings

log = logging.getLogger("ematix_dagster")

#: Retries for transient failures (a terminal failure raises ``Failure(allow_retries=False)``; a
#: terminate never reaches it, see :func:`run_pipeline_events`).
DEFAULT_RETRY_POLICY = dg.RetryPolicy(max_retries=2, delay=15, backoff=dg.Backoff.EXPONENTIAL,
                                      jitter=dg.Jitter.PLUS_MINUS)


class PipelineRunConfig(dg.Config):
    """Run configuration of a pipeline asset."""

    throttle_seconds: float = Field(
        default=DEFAULT_THROTTLE_SECONDS,
        description="At most one materialization/observation per this many seconds (0: one per batch with data).",
    )
    summary_seconds: float = Field(
        default=DEFAULT_SUMMARY_SECONDS,
        description="One progress summary line (batches, heartbeat-only batches, rows, windows since the previous "
                    "line) per this many seconds (0: none). No line is logged per batch.",
    )
    watch_seconds: float = Field(
        default=DEFAULT_WATCH_INTERVAL_SECONDS,
        description="How often the step checks that its run is still STARTED and its run worker alive; when not, it "
                    "stops at a batch boundary and releases the lease (0: never).",
    )


def effective_spec(spec: PipelineSpec, state_store: StateStoreResource, metrics: MetricsResource) -> PipelineSpec:
    """The spec with the Dagster resources' store and metrics settings in place."""
    return metrics.apply(state_store.apply(spec))


def _prepare_local_inputs(spec: PipelineSpec) -> None:
    """Create missing local input directories (Spark refuses to stream from a path that does not exist)."""
    for source in spec.resolved().sources:
        if source.kind == "files" and source.path and "://" not in source.path:
            Path(source.path).mkdir(parents=True, exist_ok=True)


def _tag_run(context: Any, tags: Mapping[str, str]) -> None:
    try:
        run_id = context.run.run_id
        current = context.instance.get_run_by_id(run_id)
        missing = {k: v for k, v in tags.items() if current is None or current.tags.get(k) != v}
        if missing:
            context.instance.add_run_tags(run_id, missing)
    except Exception as exc:  # noqa: BLE001 - tags help the sensor; never fail a run for them
        log.warning("could not tag run: %s", exc)


def pipeline_failure(context: Any, pipeline: EmatixPipeline, exc: BaseException) -> dg.Failure:
    """Classify ``exc`` (terminal / transient / lease_held), tag the run, build the ``Failure``."""
    exc = classify(exc, pipeline.name)
    if isinstance(exc, LeaseHeld):
        kind = "lease_held"
    else:
        kind = "terminal" if exc.terminal else "transient"
    _tag_run(context, {FAILURE_TAG: kind, ERROR_TAG: type(exc).__name__})
    text = str(exc).strip() or type(exc).__name__
    advice = {
        "terminal": "terminal: the operator must act (fix the spec, restore or reset the state); the keep-alive "
                    "sensor will not restart this pipeline until then",
        "transient": "transient: retried with backoff",
        "lease_held": "another run holds the pipeline's lease; this run did nothing",
    }[kind]
    if isinstance(exc, LeaseLost):
        advice = "another run took the lease over; this run stopped without committing its batch"
    return dg.Failure(
        description=f"pipeline {pipeline.name}: {type(exc).__name__}: {text} ({advice})",
        metadata={"pipeline": pipeline.name, "failure": kind, "terminal": kind == "terminal",
                  "error": type(exc).__name__},
        allow_retries=kind == "transient",
    )


def _step_checks(context: Any, pipeline: EmatixPipeline, active: Any) -> Optional[StepChecks]:
    """The checks the step's asset declares (None from a plain op, or an asset without checks)."""
    op_context = getattr(context, "op_execution_context", context)
    if not getattr(op_context, "has_assets_def", False) or not op_context.assets_def.check_specs:
        return None
    assets_def = op_context.assets_def
    declared = {spec.name for spec in assets_def.check_specs if spec.asset_key == pipeline.key}
    selected = {key.name for key in op_context.selected_asset_check_keys if key.asset_key == pipeline.key}
    return StepChecks(context.instance, pipeline, CheckBounds.of_asset(assets_def), declared, selected,
                      active=active)


def _position(events: Optional[EmatixEventIterator]) -> str:
    report = None if events is None else events.last_report
    return "before its first batch" if report is None else f"after batch {report.batch_id}"


def run_pipeline_events(context: Any, pipeline: EmatixPipeline, config: PipelineRunConfig,
                        spark: EmatixSparkResource, state_store: StateStoreResource,
                        metrics: MetricsResource) -> Iterator[Any]:
    """The body of a pipeline asset: start the runner and yield its events (also usable from an op).

    Ends with a ``MaterializeResult`` when the input is exhausted (``available_now``) or when the
    run is terminated; the query stops at a batch boundary and the runner releases the lease before
    that result is yielded. When the :class:`~ematix_dagster.dagster.watcher.RunWatcher` finds the
    run worker or the run gone, the query stops the same way and the step process ends without
    yielding anything more.
    """
    from ematix_dagster.spark.runner import PipelineRunner

    name = pipeline.name
    run_id = context.run.run_id
    events: Optional[EmatixEventIterator] = None
    watcher: Optional[RunWatcher] = None
    timer: Optional[CheckTimer] = None
    checks: Optional[StepChecks] = None
    lease = ""
    try:
        _tag_run(context, {PIPELINE_TAG: name, CODE_VERSION_TAG: pipeline.code_version})
        for warning in spec_warnings(pipeline.spec):  # the spec as written, before the resources' settings
            context.log.warning(f"pipeline {name}: {warning}")
        spec = effective_spec(pipeline.spec, state_store, metrics)
        _prepare_local_inputs(spec)
        lease = "; lease released" if spec.state_store.durable else ""
        # The session starts when the runner holds the lease (a second run is refused without a JVM).
        # Per-batch lines are not logged (batch_progress): batches with data become the throttled
        # events below, and the summary line covers the rest (heartbeat-only batches included).
        # A lease still held by a run Dagster has ended (its orphaned step) is taken over: the store
        # fences that step, whose next commit is refused, and this run resumes once it has let go.
        runner = PipelineRunner(spec, spark=lambda: spark.spark_session, metrics=metrics.streaming_metrics(),
                                progress=context.log.info, run_label=f"dagster:{run_id}",
                                batch_progress=lambda report: None,
                                take_over_lease=lease_of_finished_run(context.instance))
        watcher = RunWatcher(context.instance, run_id, runner.request_stop,
                             report=lambda text: context.log.warning(f"pipeline {name}: {text}"),
                             interval_seconds=config.watch_seconds)
        checks = _step_checks(context, pipeline, active=lambda: watcher is None or watcher.reason is None)
        if checks is not None:
            yield from checks.at_start(spec)
            if checks.blocked is not None:
                raise CheckpointDiverged(f"pipeline {name}: the {CHECKPOINT_CHECK} check failed, so the pipeline "
                                         f"does not start:\n{checks.blocked.description}")
        context.log.info(f"pipeline {name}: starting ({spec.run.trigger}); state in "
                         f"{state_store.description(spec)}")
        provenance = batch_provenance(context, pipeline.key, pipeline.code_version)

        def step_metadata() -> dict[str, Any]:
            return {**output_schema_metadata(runner.step), **table_size_metadata(runner.step)}

        events = EmatixEventIterator(
            runner.events(), pipeline.key, throttle_seconds=config.throttle_seconds,
            summary_seconds=config.summary_seconds, log=context.log.info, name=name,
            final_metadata=lambda: {"run_id": run_id}, provenance=provenance, metadata=step_metadata,
            after_report=None if checks is None else checks.after_report,
            catch_up=lambda: unreported_materialization(context.instance, pipeline.key, runner.recovered.record,
                                                        provenance=provenance, metadata=step_metadata))
        watcher.start()
        if checks is not None and pipeline.long_running:
            timer = CheckTimer(checks).start()
        for event in events:
            if watcher.reason is not None:
                # The run is no longer STARTED or its worker is gone: nothing more goes into it. The
                # reports end (MaterializeResult) once the runner has stopped and released the lease.
                if isinstance(event, dg.MaterializeResult):
                    events.close()
                    watcher.end_process()
                continue
            if isinstance(event, dg.MaterializeResult):
                # the reports ended: the runner has stopped the query and released the lease
                why = "input exhausted" if spec.run.trigger == "available_now" else "query ended"
                context.log.info(f"pipeline {name}: stopped at a batch boundary {_position(events)} ({why}){lease}")
            yield event
    except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt):
        # Terminate. Caught here, inside the asset's code: an interrupt that leaves the compute
        # function reaches Dagster's op error boundary, which turns it into a RetryRequested when
        # the op has a RetryPolicy ("failed and has requested a retry"). The runner stops the query
        # at a batch boundary and releases the lease (closing the report stream does both when the
        # interrupt landed outside it); the step then ends with the run's totals and the run reads
        # as CANCELED.
        if events is not None:
            events.close()
        context.log.info(f"pipeline {name}: terminate requested; the streaming query stopped at a batch boundary "
                         f"{_position(events)}{lease}")
        final = events if events is not None else EmatixEventIterator((), pipeline.key)
        if timer is not None:
            timer.close()
        yield final.final_result(stopped="terminated")
        if checks is not None:
            checks.repeat_latest()  # the latest results stand for the final materialization
    except dg.Failure:
        raise
    except Exception as exc:  # noqa: BLE001 - classified, tagged and re-raised as a Failure
        if isinstance(exc, LeaseLost) and watcher is not None:
            # a later run took the lease over: this run has ended for Dagster, so the step says why and
            # ends like an orphan, writing no failure into it
            watcher.reason = str(exc)
            context.log.warning(f"pipeline {name}: {exc}")
        if watcher is not None and watcher.reason is not None:  # the stop broke the query: not this run's
            if events is not None:
                events.close()
            watcher.end_process()
        raise pipeline_failure(context, pipeline, exc) from exc
    finally:
        for closing in (timer, watcher, events):
            if closing is not None:
                closing.close()


def streaming_pipeline_asset(
    pipeline: PipelineLike,
    *,
    translator: Optional[EmatixTranslator] = None,
    description: Optional[str] = None,
    key: Optional[Union[dg.AssetKey, str, Sequence[str]]] = None,
    owners: Optional[Sequence[str]] = None,
    tags: Optional[Mapping[str, str]] = None,
    group_name: Optional[str] = None,
    pool: Optional[str] = None,
    retry_policy: Optional[dg.RetryPolicy] = DEFAULT_RETRY_POLICY,
    deps: Optional[Iterable[Any]] = None,
    checks: Optional[CheckBounds] = DEFAULT_CHECK_BOUNDS,
) -> dg.AssetsDefinition:
    """An asset that runs the pipeline when materialized.

    ``pipeline`` is a TOML path, a ``PipelineSpec`` or a ``@streaming_pipeline`` object. The asset
    needs the resources ``spark`` (:class:`EmatixSparkResource`), ``state_store``
    (:class:`StateStoreResource`) and ``metrics`` (:class:`MetricsResource`); its pool
    (``ematix-<pipeline>``, limit 1 in ``dagster.yaml``) and the store's lease keep one run per
    pipeline however it is launched. Without ``deps`` it depends on its sources' upstream assets
    (``translator.get_source_asset_key``); :func:`streaming_pipeline_assets` also defines them.
    ``checks`` bounds the asset's checks (:mod:`ematix_dagster.dagster.checks`; None: no checks),
    which its own step evaluates (:mod:`ematix_dagster.dagster.check_reports`).

    >>> # clicks = streaming_pipeline_asset("pipelines/clicks_per_minute.toml")
    """
    p = EmatixPipeline.load(pipeline, description)
    translator = translator or EmatixTranslator()
    if key is not None:
        p = EmatixPipeline(p.spec, p.description, p.source_path, dg.AssetKey.from_coercible(key))
    spec_def = translator.get_asset_spec(p)
    p = EmatixPipeline(p.spec, p.description, p.source_path, spec_def.key)
    register(p)
    if deps is None:
        deps = _unique(translator.get_source_asset_key(p, source) for source in p.spec.sources)
    asset_tags = {**spec_def.tags, **(tags or {})}
    pool_name = pool or f"ematix-{p.name}"

    @dg.asset(
        key=spec_def.key,
        description=spec_def.description,
        owners=list(owners) if owners is not None else list(spec_def.owners),
        tags=asset_tags,
        kinds=set(spec_def.kinds),
        code_version=spec_def.code_version,
        group_name=group_name or spec_def.group_name,
        metadata=dict(spec_def.metadata),
        pool=pool_name,
        retry_policy=retry_policy,
        op_tags={PIPELINE_TAG: p.name},
        deps=list(deps) or None,
        check_specs=None if checks is None else check_specs(p, checks.for_pipeline(p)),
    )
    def _pipeline_asset(context: dg.AssetExecutionContext, config: PipelineRunConfig, spark: EmatixSparkResource,
                        state_store: StateStoreResource, metrics: MetricsResource):
        yield from run_pipeline_events(context, p, config, spark, state_store, metrics)

    return _pipeline_asset


def _unique(keys: Iterable[Optional[dg.AssetKey]]) -> list[dg.AssetKey]:
    return list(dict.fromkeys(key for key in keys if key is not None))


def streaming_pipeline_assets(pipelines: Sequence[PipelineLike], *, translator: Optional[EmatixTranslator] = None,
                              **asset_options: Any) -> list[Union[dg.AssetsDefinition, dg.AssetSpec]]:
    """The pipelines' assets and their sources' upstream assets, with the lineage between them.

    A source reading what another of these pipelines writes (its Parquet directory) depends on that
    pipeline's asset; every other source on its upstream asset (an external ``AssetSpec``), one per
    key, so pipelines reading the same input share it. ``asset_options`` go to
    :func:`streaming_pipeline_asset` for every pipeline.
    """
    translator = translator or EmatixTranslator()
    loaded = [EmatixPipeline.load(p) for p in pipelines]
    writers = {location: translator.get_asset_key(p) for p in loaded
               if (location := target_location(p.spec.target)) is not None}
    assets: list[Union[dg.AssetsDefinition, dg.AssetSpec]] = []
    sources: dict[dg.AssetKey, dg.AssetSpec] = {}
    for p in loaded:
        deps: list[Optional[dg.AssetKey]] = []
        for source in p.spec.sources:
            key = writers.get(source_location(source) or "")
            if key is None and (source_spec := translator.get_source_asset_spec(p, source)) is not None:
                key = sources.setdefault(source_spec.key, source_spec).key
            deps.append(key)
        assets.append(streaming_pipeline_asset(p, translator=translator, deps=_unique(deps), **asset_options))
    return [*assets, *sources.values()]


__all__ = ["DEFAULT_RETRY_POLICY", "PipelineRunConfig", "effective_spec", "run_pipeline_events",
           "streaming_pipeline_asset", "streaming_pipeline_assets"]
