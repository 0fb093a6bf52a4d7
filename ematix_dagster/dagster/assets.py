"""A pipeline as a Dagster asset: materializing it runs the streaming query.

``streaming_pipeline_asset(spec_or_path)`` builds the asset (keyed by the target table, with the
spec's hash as code version); its compute function is a generator that turns the runner's
per-batch reports into materializations (windows were written) and observations (rows were
consumed, nothing emitted), throttled, and ends with a ``MaterializeResult`` when the input is
exhausted (``available_now``). A ``processing_time`` run stays up until it is terminated.

All waiting on py4j happens on the runner's background thread; this generator's thread only
waits on a queue, so the ``DagsterExecutionInterruptedError`` of a terminated run lands there and
the runner stops the query at a batch boundary (DESIGN.md §4).

No ``from __future__ import annotations`` here: the module defines a ``dagster.Config``.
"""

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import dagster as dg
from pydantic import Field

from ematix_dagster.dagster.pipeline import (
    CODE_VERSION_TAG, ERROR_TAG, FAILURE_TAG, NAME_METADATA_KEY, PIPELINE_TAG, TOML_METADATA_KEY, EmatixPipeline,
    PipelineLike, register, toml_metadata,
)
from ematix_dagster.dagster.resources import EmatixSparkResource, MetricsResource, StateStoreResource
from ematix_dagster.errors import EmatixError, LeaseHeld
from ematix_dagster.spec import PipelineSpec

log = logging.getLogger("ematix_dagster")

DEFAULT_THROTTLE_SECONDS = 10.0

#: Retries for transient failures (a terminal failure raises ``Failure(allow_retries=False)``).
DEFAULT_RETRY_POLICY = dg.RetryPolicy(max_retries=2, delay=15, backoff=dg.Backoff.EXPONENTIAL,
                                      jitter=dg.Jitter.PLUS_MINUS)


class PipelineRunConfig(dg.Config):
    """Run configuration of a pipeline asset."""

    throttle_seconds: float = Field(
        default=DEFAULT_THROTTLE_SECONDS,
        description="At most one materialization/observation per this many seconds (0: one per batch with data).",
    )


# ---------------------------------------------------------------------------------------------
# Translator


class EmatixTranslator:
    """Maps a pipeline to its ``AssetSpec``; subclass and override a ``get_*`` method to customise.

    Mirrors dagster-sling's ``DagsterSlingTranslator``.
    """

    def get_asset_key(self, pipeline: EmatixPipeline) -> dg.AssetKey:
        return pipeline.key

    def get_description(self, pipeline: EmatixPipeline) -> str:
        spec = pipeline.spec
        w = spec.window
        size = f"{w.duration_ms // 1000} s" if w.duration_ms % 1000 == 0 else f"{w.duration_ms} ms"
        shape = f"{w.kind} windows of {size}" + (f" every {w.hop // 1000} s" if w.kind == "hopping" else "")
        by = f" per {', '.join(w.group_by)}" if w.group_by else ""
        sources = ", ".join(s.name for s in spec.sources)
        target = spec.target.table or spec.target.path or spec.target.kind
        head = pipeline.description.strip()
        line = (f"Streaming pipeline `{spec.pipeline_name}`: {shape}{by} over {sources} into {spec.target.kind} "
                f"`{target}` (trigger {spec.run.trigger}).")
        return f"{head}\n\n{line}" if head else line

    def get_owners(self, pipeline: EmatixPipeline) -> Sequence[str]:
        return []

    def get_tags(self, pipeline: EmatixPipeline) -> Mapping[str, str]:
        spec = pipeline.spec
        return {PIPELINE_TAG: spec.pipeline_name, "ematix/trigger": spec.run.trigger,
                "ematix/window": spec.window.kind, "ematix/target": spec.target.kind}

    def get_kinds(self, pipeline: EmatixPipeline) -> set[str]:
        kinds = {"spark"}
        if pipeline.spec.target.kind in ("postgres", "parquet"):
            kinds.add(pipeline.spec.target.kind)
        return kinds

    def get_code_version(self, pipeline: EmatixPipeline) -> str:
        return pipeline.code_version

    def get_group_name(self, pipeline: EmatixPipeline) -> Optional[str]:
        return "ematix"

    def get_metadata(self, pipeline: EmatixPipeline) -> Mapping[str, Any]:
        spec = pipeline.spec
        meta: dict[str, Any] = {
            NAME_METADATA_KEY: spec.pipeline_name,
            TOML_METADATA_KEY: toml_metadata(spec),
            "ematix/trigger": spec.run.trigger,
            "ematix/checkpoint": spec.run.checkpoint_location,
        }
        if pipeline.source_path is not None:
            meta["ematix/toml_path"] = dg.MetadataValue.path(str(pipeline.source_path))
        if spec.target.kind == "postgres" and spec.target.table:
            meta["dagster/table_name"] = spec.target.table
        return meta

    def get_asset_spec(self, pipeline: EmatixPipeline) -> dg.AssetSpec:
        return dg.AssetSpec(
            key=self.get_asset_key(pipeline), description=self.get_description(pipeline),
            owners=list(self.get_owners(pipeline)), tags=dict(self.get_tags(pipeline)),
            kinds=self.get_kinds(pipeline), code_version=self.get_code_version(pipeline),
            group_name=self.get_group_name(pipeline), metadata=dict(self.get_metadata(pipeline)),
        )


# ---------------------------------------------------------------------------------------------
# Batch reports -> Dagster events


def _epoch_seconds(us: Optional[int]) -> Optional[float]:
    return None if us is None else us / 1e6


def is_heartbeat_only(report: Any) -> bool:
    """A batch that read no rows and emitted nothing (e.g. only the heartbeat ticked)."""
    return (report.rows_in == 0 and report.windows_emitted == 0 and report.corrections == 0
            and report.late_rows == 0 and report.dead_letter_rows == 0)


@dataclass
class _Window:
    """What happened since the previous event (throttled batches accumulate here)."""

    batches: int = 0
    rows_in: int = 0
    windows_emitted: int = 0
    corrections: int = 0
    late_rows: int = 0
    dead_letter_rows: int = 0
    rows_by_source: dict[str, int] = field(default_factory=dict)

    def add(self, report: Any) -> None:
        self.batches += 1
        self.rows_in += report.rows_in
        self.windows_emitted += report.windows_emitted
        self.corrections += report.corrections
        self.late_rows += report.late_rows
        self.dead_letter_rows += report.dead_letter_rows
        for name, n in report.rows_by_source.items():
            self.rows_by_source[name] = self.rows_by_source.get(name, 0) + n


def batch_metadata(report: Any, since: _Window, elapsed_s: float, now_s: float) -> dict[str, Union[int, float]]:
    """Numeric metadata of one event: the last batch's position plus counts since the previous event."""
    meta: dict[str, Union[int, float]] = {
        "batch_id": int(report.batch_id),
        "batches": since.batches,
        "rows_in": since.rows_in,
        "rows_per_second": float(since.rows_in / elapsed_s) if elapsed_s > 0 else 0.0,
        "windows_emitted": since.windows_emitted,
        "corrections": since.corrections,
        "late_rows": since.late_rows,
        "dead_letter_rows": since.dead_letter_rows,
        "state_groups": int(report.state_groups),
        "windows_open": int(report.windows_open),
        "batch_seconds": float(report.seconds),
    }
    for name, n in sorted(since.rows_by_source.items()):
        meta[f"rows_in/{name}"] = n
    watermark = _epoch_seconds(report.watermark)
    if watermark is not None:
        meta["watermark"] = watermark
        meta["watermark_lag_seconds"] = float(now_s - watermark)
    for name, wm in sorted(report.source_watermarks.items()):
        if wm is not None:
            meta[f"watermark/{name}"] = float(wm / 1e6)
    meta["idle_sources"] = len(report.idle_sources)
    return meta


class EmatixEventIterator(Iterator[Any]):
    """Dagster events from a runner's ``BatchReport`` stream (like dagster-sling's event iterator).

    * A batch that wrote windows (finals or corrections) gives an ``AssetMaterialization``; a batch
      that only consumed rows gives an ``AssetObservation``; heartbeat-only batches give nothing.
    * At most one event per ``throttle_seconds`` (by ``clock``); the counts of batches in between
      are added to the next event, and the final ``MaterializeResult`` holds the run's totals.
    * The iterator ends with the ``MaterializeResult`` when the reports end (``available_now``).
    """

    def __init__(self, reports: Iterable[Any], asset_key: dg.AssetKey, *,
                 throttle_seconds: float = DEFAULT_THROTTLE_SECONDS, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 final_metadata: Optional[Callable[[], Mapping[str, Any]]] = None) -> None:
        self.asset_key = asset_key
        self.throttle_seconds = max(0.0, float(throttle_seconds))
        self._clock = clock
        self._wall = wall_clock
        self._final_metadata = final_metadata
        self.totals = _Window()
        self.events_yielded = 0
        self.last_report: Any = None
        self._inner = self._events(iter(reports))

    def __iter__(self) -> "EmatixEventIterator":
        return self

    def __next__(self) -> Any:
        return next(self._inner)

    def close(self) -> None:
        self._inner.close()

    def _events(self, reports: Iterator[Any]) -> Iterator[Any]:
        started = self._clock()
        last_event_at: Optional[float] = None
        since = _Window()
        since_started = started
        for report in reports:
            self.last_report = report
            self.totals.add(report)
            if is_heartbeat_only(report):
                continue
            since.add(report)
            now = self._clock()
            if last_event_at is not None and now - last_event_at < self.throttle_seconds:
                continue
            meta = batch_metadata(report, since, now - since_started, self._wall())
            if since.windows_emitted or since.corrections:
                event: Any = dg.AssetMaterialization(asset_key=self.asset_key, metadata=meta,
                                                     description=f"batch {report.batch_id}: windows written")
            else:
                event = dg.AssetObservation(asset_key=self.asset_key, metadata=meta,
                                            description=f"batch {report.batch_id}: rows consumed, nothing emitted")
            self.events_yielded += 1
            last_event_at = since_started = now
            since = _Window()
            yield event
        yield dg.MaterializeResult(metadata=self._summary(self._clock() - started))

    def _summary(self, elapsed_s: float) -> dict[str, Any]:
        t = self.totals
        meta: dict[str, Any] = {
            "batches": t.batches, "rows_in": t.rows_in, "windows_emitted": t.windows_emitted,
            "corrections": t.corrections, "late_rows": t.late_rows, "dead_letter_rows": t.dead_letter_rows,
            "rows_per_second": float(t.rows_in / elapsed_s) if elapsed_s > 0 else 0.0,
        }
        r = self.last_report
        if r is not None:
            meta["batch_id"] = int(r.batch_id)
            meta["state_groups"] = int(r.state_groups)
            meta["windows_open"] = int(r.windows_open)
            if r.watermark is not None:
                meta["watermark"] = r.watermark / 1e6
                meta["watermark_lag_seconds"] = float(self._wall() - r.watermark / 1e6)
            for name, wm in sorted(r.source_watermarks.items()):
                if wm is not None:
                    meta[f"watermark/{name}"] = float(wm / 1e6)
        if self._final_metadata is not None:
            meta.update(self._final_metadata())
        return meta


# ---------------------------------------------------------------------------------------------
# Running a pipeline inside a step


def effective_spec(spec: PipelineSpec, state_store: StateStoreResource, metrics: MetricsResource) -> PipelineSpec:
    """The spec with the Dagster resources' store and metrics settings in place."""
    return metrics.apply(state_store.apply(spec))


def _prepare_local_inputs(spec: PipelineSpec) -> None:
    """Create missing local input directories (Spark refuses to stream from a path that does not exist)."""
    for source in spec.sources:
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


def _failure(context: Any, pipeline: EmatixPipeline, exc: BaseException) -> dg.Failure:
    """Classify ``exc`` (terminal / transient / lease_held), tag the run, build the ``Failure``."""
    if isinstance(exc, LeaseHeld):
        kind = "lease_held"
    elif isinstance(exc, EmatixError):
        kind = "terminal" if exc.terminal else "transient"
    else:
        kind = "transient"  # a Spark or driver failure outside the engine: retrying may help
    _tag_run(context, {FAILURE_TAG: kind, ERROR_TAG: type(exc).__name__})
    text = str(exc).strip() or type(exc).__name__
    advice = {
        "terminal": "terminal: the operator must act (fix the spec, restore or reset the state); the keep-alive "
                    "sensor will not restart this pipeline until then",
        "transient": "transient: retried with backoff",
        "lease_held": "another run holds the pipeline's lease; this run did nothing",
    }[kind]
    return dg.Failure(
        description=f"pipeline {pipeline.name}: {type(exc).__name__}: {text} ({advice})",
        metadata={"pipeline": pipeline.name, "failure": kind, "terminal": kind == "terminal",
                  "error": type(exc).__name__},
        allow_retries=kind == "transient",
    )


def run_pipeline_events(context: Any, pipeline: EmatixPipeline, config: PipelineRunConfig,
                        spark: EmatixSparkResource, state_store: StateStoreResource,
                        metrics: MetricsResource) -> Iterator[Any]:
    """The body of a pipeline asset: start the runner and yield its events (also usable from an op)."""
    from ematix_dagster.spark.runner import PipelineRunner

    _tag_run(context, {PIPELINE_TAG: pipeline.name, CODE_VERSION_TAG: pipeline.code_version})
    try:
        spec = effective_spec(pipeline.spec, state_store, metrics)
        if spec.state_store.durable:
            # Ask the lease before starting Spark: a second run fails fast (the runner re-checks atomically).
            holder = state_store.lease_holder(spec)
            if holder is not None:
                from state_store._common import lease_held

                raise lease_held(spec.pipeline_name, state_store.description(spec), holder)
        _prepare_local_inputs(spec)
        session = spark.spark_session
        run_id = context.run.run_id
        runner = PipelineRunner(spec, spark=session, metrics=metrics.streaming_metrics(),
                                progress=context.log.info, run_label=f"dagster:{run_id}")
        context.log.info(f"pipeline {spec.pipeline_name}: starting ({spec.run.trigger}); state in "
                         f"{state_store.description(spec)}")
        events = EmatixEventIterator(runner.events(), pipeline.key, throttle_seconds=config.throttle_seconds,
                                     final_metadata=lambda: {"run_id": run_id})
        try:
            yield from events
        finally:
            events.close()
    except dg.Failure:
        raise
    except dg.DagsterExecutionInterruptedError:
        raise
    except Exception as exc:  # noqa: BLE001 - classified, tagged and re-raised as a Failure
        raise _failure(context, pipeline, exc) from exc


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
) -> dg.AssetsDefinition:
    """An asset that runs the pipeline when materialized.

    ``pipeline`` is a TOML path, a ``PipelineSpec`` or a ``@streaming_pipeline`` object. The asset
    needs the resources ``spark`` (:class:`EmatixSparkResource`), ``state_store``
    (:class:`StateStoreResource`) and ``metrics`` (:class:`MetricsResource`); its pool
    (``ematix-<pipeline>``, limit 1 in ``dagster.yaml``) and the store's lease keep one run per
    pipeline however it is launched.

    >>> # clicks = streaming_pipeline_asset("pipelines/clicks_per_minute.toml")
    """
    p = EmatixPipeline.load(pipeline, description)
    translator = translator or EmatixTranslator()
    if key is not None:
        p = EmatixPipeline(p.spec, p.description, p.source_path, dg.AssetKey.from_coercible(key))
    spec_def = translator.get_asset_spec(p)
    p = EmatixPipeline(p.spec, p.description, p.source_path, spec_def.key)
    register(p)
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
        deps=list(deps) if deps else None,
    )
    def _pipeline_asset(context: dg.AssetExecutionContext, config: PipelineRunConfig, spark: EmatixSparkResource,
                        state_store: StateStoreResource, metrics: MetricsResource):
        yield from run_pipeline_events(context, p, config, spark, state_store, metrics)

    return _pipeline_asset


__all__ = ["DEFAULT_RETRY_POLICY", "DEFAULT_THROTTLE_SECONDS", "EmatixEventIterator", "EmatixTranslator",
           "PipelineRunConfig", "batch_metadata", "effective_spec", "is_heartbeat_only", "run_pipeline_events",
           "streaming_pipeline_asset"]
