"""A pipeline as a Dagster asset: materializing it runs the streaming query.

``streaming_pipeline_asset(spec_or_path)`` builds the asset (keyed by the target table, with the
spec's hash as code version); its compute function is a generator that turns the runner's
per-batch reports into materializations (windows were written) and observations (rows were
consumed, nothing emitted), throttled; heartbeat-only batches give no event and no log line (a
summary line every ``summary_seconds`` counts them). It ends with a ``MaterializeResult`` (the
run's totals as ``run_*``) when the input is exhausted (``available_now``), when the run is
terminated, or when the step finds itself orphaned (:mod:`ematix_dagster.dagster.watcher`). A
``processing_time`` run stays up until then.

All waiting on py4j happens on the runner's background thread; this generator's thread only
waits on a queue, so the ``DagsterExecutionInterruptedError`` of a terminated run lands there.
It is caught in :func:`run_pipeline_events` (it must not leave the compute function: Dagster's op
boundary would turn it into a retry request because the asset has a ``RetryPolicy``), and the
runner stops the query at a batch boundary.

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
from ematix_dagster.dagster.watcher import DEFAULT_WATCH_INTERVAL_SECONDS, RunWatcher
from ematix_dagster.errors import LeaseHeld
from ematix_dagster.failures import classify
from ematix_dagster.spec import PipelineSpec, spec_warnings
from ematix_dagster.streaming.windows import format_us

log = logging.getLogger("ematix_dagster")

DEFAULT_THROTTLE_SECONDS = 10.0
DEFAULT_SUMMARY_SECONDS = 300.0

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


def _seconds(us: Optional[int]) -> Optional[float]:
    return None if us is None else us / 1e6


def is_heartbeat_only(report: Any) -> bool:
    """A batch that read no rows and emitted nothing (e.g. only the heartbeat ticked)."""
    return (report.rows_in == 0 and report.windows_emitted == 0 and report.corrections == 0
            and report.late_rows == 0 and report.dead_letter_rows == 0)


@dataclass
class _Window:
    """What happened over a stretch of batches (since the previous event, summary, or the start)."""

    batches: int = 0
    idle_batches: int = 0
    rows_in: int = 0
    windows_emitted: int = 0
    corrections: int = 0
    late_rows: int = 0
    dead_letter_rows: int = 0
    rows_by_source: dict[str, int] = field(default_factory=dict)
    first_batch_id: Optional[int] = None

    def add(self, report: Any) -> None:
        if self.first_batch_id is None:
            self.first_batch_id = int(report.batch_id)
        self.batches += 1
        self.idle_batches += int(is_heartbeat_only(report))
        self.rows_in += report.rows_in
        self.windows_emitted += report.windows_emitted
        self.corrections += report.corrections
        self.late_rows += report.late_rows
        self.dead_letter_rows += report.dead_letter_rows
        for name, n in report.rows_by_source.items():
            self.rows_by_source[name] = self.rows_by_source.get(name, 0) + n


def position_metadata(report: Any, now_s: float) -> dict[str, Any]:
    """Where the stream stands after ``report``: batch, state size, watermarks (timestamps) and the lag."""
    meta: dict[str, Any] = {
        "batch_id": int(report.batch_id),
        "state_groups": int(report.state_groups),
        "windows_open": int(report.windows_open),
        "batch_seconds": float(report.seconds),
        "idle_sources": len(report.idle_sources),
    }
    watermark = _seconds(report.watermark)
    if watermark is not None:
        meta["watermark"] = dg.MetadataValue.timestamp(watermark)
        meta["watermark_lag_seconds"] = float(now_s - watermark)  # numeric: the Plots tab draws it
    for name, wm in sorted(report.source_watermarks.items()):
        if wm is not None:
            meta[f"watermark/{name}"] = dg.MetadataValue.timestamp(wm / 1e6)
    return meta


def batch_metadata(report: Any, since: _Window, elapsed_s: float, now_s: float) -> dict[str, Any]:
    """One per-batch event: counts of the batches with data since the previous event, then the position."""
    meta: dict[str, Any] = {
        "batches": since.batches,
        "rows_in": since.rows_in,
        "rows_per_second": float(since.rows_in / elapsed_s) if elapsed_s > 0 else 0.0,
        "windows_emitted": since.windows_emitted,
        "corrections": since.corrections,
        "late_rows": since.late_rows,
        "dead_letter_rows": since.dead_letter_rows,
    }
    for name, n in sorted(since.rows_by_source.items()):
        meta[f"rows_in/{name}"] = n
    meta.update(position_metadata(report, now_s))
    return meta


def run_metadata(totals: _Window, elapsed_s: float) -> dict[str, Any]:
    """The run's totals, under names of their own (``run_*``) so they never join the per-batch series."""
    meta: dict[str, Any] = {
        "run_batches": totals.batches,
        "run_idle_batches": totals.idle_batches,
        "run_rows_in": totals.rows_in,
        "run_windows_emitted": totals.windows_emitted,
        "run_corrections": totals.corrections,
        "run_late_rows": totals.late_rows,
        "run_dead_letter_rows": totals.dead_letter_rows,
        "run_rows_per_second": float(totals.rows_in / elapsed_s) if elapsed_s > 0 else 0.0,
        "run_seconds": float(elapsed_s),
    }
    for name, n in sorted(totals.rows_by_source.items()):
        meta[f"run_rows_in/{name}"] = n
    return meta


def _span(window: _Window, last_batch_id: int) -> str:
    first = window.first_batch_id
    return f"batch {last_batch_id}" if first is None or first == last_batch_id else f"batches {first}-{last_batch_id}"


def _describe(window: _Window, report: Any) -> str:
    return (f"{_span(window, int(report.batch_id))}: {window.rows_in} rows in, {window.windows_emitted} windows "
            f"emitted (+{window.corrections} corrections), {window.late_rows} late rows, watermark "
            f"{format_us(report.watermark)}")


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


class EmatixEventIterator(Iterator[Any]):
    """Dagster events from a runner's ``BatchReport`` stream (like dagster-sling's event iterator).

    * A batch that wrote windows (finals or corrections) gives an ``AssetMaterialization``; a batch
      that only consumed rows gives an ``AssetObservation``; heartbeat-only batches give nothing.
    * At most one event per ``throttle_seconds`` (by ``clock``); the counts of the batches with
      data in between are added to the next event, which comes at the next batch (heartbeat-only
      or not) once the throttle allows.
    * With ``log`` and ``summary_seconds > 0``: one summary line per ``summary_seconds`` (all
      batches since the previous line, heartbeat-only ones counted, rows, windows, position).
    * Ends with a ``MaterializeResult`` (:meth:`final_result`) when the reports end: the run's totals
      as ``run_*``, the position, and the counts of data batches not yet reported, if any.
    """

    def __init__(self, reports: Iterable[Any], asset_key: dg.AssetKey, *,
                 throttle_seconds: float = DEFAULT_THROTTLE_SECONDS, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 final_metadata: Optional[Callable[[], Mapping[str, Any]]] = None,
                 summary_seconds: float = DEFAULT_SUMMARY_SECONDS, log: Optional[Callable[[str], None]] = None,
                 name: Optional[str] = None) -> None:
        self.asset_key = asset_key
        self.name = name or asset_key.to_user_string()
        self.throttle_seconds = max(0.0, float(throttle_seconds))
        self.summary_seconds = max(0.0, float(summary_seconds))
        self._clock = clock
        self._wall = wall_clock
        self._final_metadata = final_metadata
        self._log = log
        self.totals = _Window()
        self.events_yielded = 0
        self.summaries_logged = 0
        self.last_report: Any = None
        self._started = clock()
        self._since = _Window()
        self._since_started = self._started
        self._last_data: Any = None
        self._reports = reports
        self._inner = self._events(iter(reports))

    def __iter__(self) -> "EmatixEventIterator":
        return self

    def __next__(self) -> Any:
        return next(self._inner)

    def close(self) -> None:
        """Close this iterator and the report stream under it (a runner stops and releases its lease)."""
        self._inner.close()
        close = getattr(self._reports, "close", None)
        if close is not None:
            close()

    def _events(self, reports: Iterator[Any]) -> Iterator[Any]:
        last_event_at: Optional[float] = None
        summary = _Window()
        summary_started = self._started
        for report in reports:
            self.last_report = report
            self.totals.add(report)
            summary.add(report)
            now = self._clock()
            if self._log is not None and self.summary_seconds and now - summary_started >= self.summary_seconds:
                self._log(self._summary_line(summary, now - summary_started, report))
                self.summaries_logged += 1
                summary, summary_started = _Window(), now
            if is_heartbeat_only(report):
                # no event of its own; but data batches held back by the throttle are reported once
                # the throttle allows, not only with the next batch that has data
                if not self._since.batches or (last_event_at is not None
                                               and now - last_event_at < self.throttle_seconds):
                    continue
            else:
                self._since.add(report)
                self._last_data = report
                if last_event_at is not None and now - last_event_at < self.throttle_seconds:
                    continue
            yield self._event(now)
            last_event_at = now
        yield self.final_result()

    def _event(self, now: float) -> Any:
        """The event for the data batches since the previous one (at the last of them)."""
        since, report = self._since, self._last_data
        meta = batch_metadata(report, since, now - self._since_started, self._wall())
        if since.windows_emitted or since.corrections:
            event: Any = dg.AssetMaterialization(asset_key=self.asset_key, metadata=meta,
                                                 description=_describe(since, report))
        else:
            event = dg.AssetObservation(asset_key=self.asset_key, metadata=meta,
                                        description=_describe(since, report) + " (nothing emitted)")
        self.events_yielded += 1
        self._since_started = now
        self._since = _Window()
        return event

    def _summary_line(self, window: _Window, seconds: float, report: Any) -> str:
        lag = ""
        if report.watermark is not None:
            lag = f" (lag {self._wall() - report.watermark / 1e6:.0f} s)"
        return (f"[{self.name}] last {_duration(seconds)}: {window.batches} batches ({window.idle_batches} "
                f"heartbeat-only), {window.rows_in} rows in, {window.windows_emitted} windows emitted "
                f"(+{window.corrections} corrections), {window.late_rows} late rows; at batch {report.batch_id}, "
                f"watermark {format_us(report.watermark)}{lag}, {report.state_groups} state groups")

    def final_result(self, stopped: Optional[str] = None) -> dg.MaterializeResult:
        """The closing ``MaterializeResult`` (also built after a terminate, when the reports did not end)."""
        now = self._clock()
        meta: dict[str, Any] = {}
        r = self.last_report
        if r is not None:
            if self._since.batches:  # data batches the throttle held back: reported here, under per-batch names
                meta.update(batch_metadata(self._last_data, self._since, now - self._since_started, self._wall()))
            meta.update(position_metadata(r, self._wall()))
        meta.update(run_metadata(self.totals, now - self._started))
        if stopped:
            meta["stopped"] = dg.MetadataValue.text(stopped)
        if self._final_metadata is not None:
            meta.update(self._final_metadata())
        return dg.MaterializeResult(metadata=meta)


# ---------------------------------------------------------------------------------------------
# Running a pipeline inside a step


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


def _failure(context: Any, pipeline: EmatixPipeline, exc: BaseException) -> dg.Failure:
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
    return dg.Failure(
        description=f"pipeline {pipeline.name}: {type(exc).__name__}: {text} ({advice})",
        metadata={"pipeline": pipeline.name, "failure": kind, "terminal": kind == "terminal",
                  "error": type(exc).__name__},
        allow_retries=kind == "transient",
    )


def _position(events: Optional[EmatixEventIterator]) -> str:
    report = None if events is None else events.last_report
    return "before its first batch" if report is None else f"after batch {report.batch_id}"


def run_pipeline_events(context: Any, pipeline: EmatixPipeline, config: PipelineRunConfig,
                        spark: EmatixSparkResource, state_store: StateStoreResource,
                        metrics: MetricsResource) -> Iterator[Any]:
    """The body of a pipeline asset: start the runner and yield its events (also usable from an op).

    Ends with a ``MaterializeResult`` when the input is exhausted (``available_now``), when the run
    is terminated, or when the :class:`~ematix_dagster.dagster.watcher.RunWatcher` finds the run
    worker or the run gone; in every case the query stops at a batch boundary and the runner
    releases the lease before that result is yielded.
    """
    from ematix_dagster.spark.runner import PipelineRunner

    name = pipeline.name
    run_id = context.run.run_id
    events: Optional[EmatixEventIterator] = None
    watcher: Optional[RunWatcher] = None
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
        runner = PipelineRunner(spec, spark=lambda: spark.spark_session, metrics=metrics.streaming_metrics(),
                                progress=context.log.info, run_label=f"dagster:{run_id}",
                                batch_progress=lambda report: None)
        context.log.info(f"pipeline {name}: starting ({spec.run.trigger}); state in "
                         f"{state_store.description(spec)}")
        events = EmatixEventIterator(runner.events(), pipeline.key, throttle_seconds=config.throttle_seconds,
                                     summary_seconds=config.summary_seconds, log=context.log.info, name=name,
                                     final_metadata=lambda: {"run_id": run_id})
        watcher = RunWatcher(context.instance, run_id, runner.request_stop,
                             report=lambda text: context.log.warning(f"pipeline {name}: {text}"),
                             interval_seconds=config.watch_seconds).start()
        for event in events:
            if isinstance(event, dg.MaterializeResult):
                # the reports ended: the runner has stopped the query and released the lease
                why = watcher.reason or ("input exhausted" if spec.run.trigger == "available_now" else "query ended")
                context.log.info(f"pipeline {name}: stopped at a batch boundary {_position(events)} ({why}){lease}")
                if watcher.reason:
                    event = events.final_result(stopped=watcher.reason)
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
        yield final.final_result(stopped="terminated")
    except dg.Failure:
        raise
    except Exception as exc:  # noqa: BLE001 - classified, tagged and re-raised as a Failure
        raise _failure(context, pipeline, exc) from exc
    finally:
        if watcher is not None:
            watcher.close()
        if events is not None:
            events.close()


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


__all__ = ["DEFAULT_RETRY_POLICY", "DEFAULT_SUMMARY_SECONDS", "DEFAULT_THROTTLE_SECONDS", "EmatixEventIterator",
           "EmatixTranslator", "PipelineRunConfig", "batch_metadata", "effective_spec", "is_heartbeat_only",
           "position_metadata", "run_metadata", "run_pipeline_events", "streaming_pipeline_asset"]
