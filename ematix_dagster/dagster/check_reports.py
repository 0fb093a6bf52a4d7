"""Who evaluates a pipeline asset's checks, and when (docs/dagster.md, "Asset checks").

* **The streaming step, when it starts** (:meth:`StepChecks.at_start`): every declared check from
  what the store holds, before the query starts, so that none of them shows "Running" for the
  pipeline's life. A failed ``checkpoint_consistency`` (blocking) stops the start. These results
  belong to the run, so Dagster keeps them attached to each of its per-batch materializations.
* **The streaming step, while it runs**: lag and late rows over its recent batches, reported as
  runless evaluations of the latest materialization, after each materialization
  (:meth:`StepChecks.after_report`) and on time, every ``check_interval_seconds``, whether or not
  a batch came (:class:`CheckTimer`): a pipeline whose input stopped fails its lag check within the
  bound plus one interval. The state store is not read for them: the batch reports carry the
  numbers. A check that could not be evaluated at the start (a pipeline that never ran) is yielded
  by the step once its first batch gives it a value.
* **The streaming step, when it stops** (:meth:`StepChecks.repeat_latest`): the latest lag and
  late-row results again, as evaluations of the run's final materialization, so that a failed
  check stays failed after a terminate instead of reading "Not evaluated".
* **The checks job** (:func:`report_stored_checks`), for pipelines that are not running: from the
  store, as runless evaluations; a check whose latest evaluation passed on the same stored batch is
  not evaluated again, and lag and late rows of a pipeline that never ran are skipped, not passed.

Nothing here starts a Spark session: the checks read the store (and the checkpoint's files).
"""

import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Optional

import dagster as dg

# Not exported by dagster: without it a runless evaluation is matched to a materialization by
# timestamps, and SQLite's event log keeps whole seconds, so it would read as "Not evaluated".
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from ematix_dagster.dagster.checks import (
    CHECKPOINT_CHECK,
    LATE_ROW_RATIO_CHECK,
    WATERMARK_LAG_CHECK,
    CheckBounds,
    evaluate_checkpoint,
    evaluate_idempotent_target,
    late_row_ratio,
    late_row_ratio_result,
    latest_evaluation,
    watermark_lag_result,
)
from ematix_dagster.dagster.pipeline import EmatixPipeline, metadata_value
from ematix_dagster.spec import PipelineSpec

log = logging.getLogger("ematix_dagster")

#: How many of a run's latest batches the running lag and late-row results cover.
RECENT_BATCHES = 100
#: The checks a running step evaluates again and again (the others once, when it starts).
RUNNING_CHECKS = frozenset({LATE_ROW_RATIO_CHECK, WATERMARK_LAG_CHECK})


def stored_results(pipeline: EmatixPipeline, spec: PipelineSpec, bounds: CheckBounds,
                   now_s: Optional[float] = None) -> list[dg.AssetCheckResult]:
    """The checks from what the store holds (``spec``: the resources applied), one read of it: the
    checkpoint check's record gives lag and late rows, only once a batch is stored (a pipeline that
    never ran has nothing to measure)."""
    return _stored(pipeline, spec, bounds, now_s)[0]


def _stored(pipeline: EmatixPipeline, spec: PipelineSpec, bounds: CheckBounds,
            now_s: Optional[float]) -> tuple[list[dg.AssetCheckResult], Optional[Any]]:
    """:func:`stored_results` and the stored record they were computed from."""
    from ematix_dagster.operations import check

    report = check(spec)
    record = report.record
    last = record.last_batch_id if record is not None else None
    results = [evaluate_checkpoint(pipeline, report),
               evaluate_idempotent_target(pipeline, spec, -1 if last is None else int(last))]
    if record is None or last is None:
        return results, None
    late, consumed = late_row_ratio(record.counters)
    results.append(late_row_ratio_result(pipeline, late, consumed, last, bounds.max_late_row_ratio,
                                         "every stored batch"))
    if bounds.max_watermark_lag_seconds is not None and record.watermark is not None:
        results.append(watermark_lag_result(pipeline, record.watermark, last, bounds.max_watermark_lag_seconds,
                                            time.time() if now_s is None else now_s))
    return results, record


def as_evaluation(result: dg.AssetCheckResult, target: Optional[Any]) -> dg.AssetCheckEvaluation:
    """A result as a runless evaluation of the materialization ``target`` (an event log record;
    None: the asset has none)."""
    assert result.asset_key is not None and result.check_name is not None
    materialization = None if target is None else AssetCheckEvaluationTargetMaterializationData(
        storage_id=target.storage_id, run_id=target.run_id, timestamp=target.timestamp)
    return dg.AssetCheckEvaluation(asset_key=result.asset_key, check_name=result.check_name, passed=result.passed,
                                   metadata=result.metadata, severity=result.severity,
                                   description=result.description, blocking=result.check_name == CHECKPOINT_CHECK,
                                   target_materialization_data=materialization)


def latest_materialization(instance: dg.DagsterInstance, key: dg.AssetKey) -> Optional[Any]:
    """The asset's latest materialization's event log record."""
    records = instance.fetch_materializations(key, limit=1).records
    return records[0] if records else None


class StepChecks:
    """The checks as a pipeline's streaming step evaluates them (see the module docstring).

    ``declared``: the check names the asset declares, ``selected`` those its run selected (the
    others are reported as runless evaluations, never yielded); ``active()``: false once the step's
    run is no longer STARTED, after which nothing more is reported. :meth:`after_report` runs on
    the step's thread and :meth:`evaluate_on_time` on the :class:`CheckTimer`'s, hence the lock.
    """

    def __init__(self, instance: dg.DagsterInstance, pipeline: EmatixPipeline, bounds: CheckBounds,
                 declared: set[str], selected: set[str], active: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.time) -> None:
        self._instance = instance
        self._pipeline = pipeline
        self.bounds = bounds
        self._declared = declared
        self._pending = selected & declared
        self._active = active
        self._clock = clock
        self._lock = threading.RLock()
        self._recent: deque[tuple[int, int, int]] = deque(maxlen=RECENT_BATCHES)  # (batch id, late, rows in)
        self._watermark: Optional[tuple[int, int]] = None  # (batch id, watermark µs)
        self._reported_for: Optional[int] = None
        #: the latest result of each check evaluated while running: what stands after the run stops
        self.latest: dict[str, dg.AssetCheckResult] = {}
        self.blocked: Optional[dg.AssetCheckResult] = None

    def at_start(self, spec: PipelineSpec) -> list[dg.AssetCheckResult]:
        """The selected checks from the store, to yield (the others are reported runless). A failed
        checkpoint check is kept as :attr:`blocked`: the step must not start. The stored watermark
        is where the lag is measured from until this run's first batch moves it."""
        stored, record = _stored(self._pipeline, spec, self.bounds, self._clock())
        results = [r for r in stored if r.check_name in self._declared]
        if record is not None and record.watermark is not None:
            self._watermark = (int(record.last_batch_id), int(record.watermark))
        self.blocked = next((r for r in results if r.check_name == CHECKPOINT_CHECK and not r.passed), None)
        target = latest_materialization(self._instance, self._pipeline.key)
        for result in results:
            if result.check_name not in self._pending:
                self._instance.report_runless_asset_event(as_evaluation(result, target))
        selected = [r for r in results if r.check_name in self._pending]
        self._pending -= {r.check_name for r in selected}
        self._remember(r for r in results if r.check_name in RUNNING_CHECKS)
        return selected

    def after_report(self, report: Any, event: Any) -> Iterator[dg.AssetCheckResult]:
        """After each batch's ``report`` (None at the end) and the ``event`` it gave, if any."""
        with self._lock:
            if report is not None:
                self._recent.append((int(report.batch_id), report.count("late_rows"), int(report.rows_in)))
                if report.watermark is not None:
                    self._watermark = (int(report.batch_id), int(report.watermark))
            materialized = isinstance(event, (dg.AssetMaterialization, dg.MaterializeResult))
            if not self._active() or not self._recent or not (self._pending or materialized):
                return
            results = self._running_results()
            first = [r for r in results if r.check_name in self._pending]
            self._pending -= {r.check_name for r in first}
            self._remember(first)
        yield from first
        if materialized:
            self._report([r for r in results if r not in first], once_per_materialization=True)

    def evaluate_on_time(self) -> None:
        """Lag and late rows now, as runless evaluations of the latest materialization, whether or
        not a batch came since: a stalled input shows as a growing lag, not as the last batch's."""
        with self._lock:
            if not self._active():
                return
            # a check still pending is yielded by the step with its first value, not reported here
            self._report([r for r in self._running_results() if r.check_name not in self._pending],
                         once_per_materialization=False)

    def repeat_latest(self) -> None:
        """After the run's final materialization: the latest results again, as its evaluations, so
        that stopping a run leaves a failed check failed instead of "Not evaluated"."""
        with self._lock:
            self._report(list(self.latest.values()), once_per_materialization=False)

    def _running_results(self) -> list[dg.AssetCheckResult]:
        """From this run's recent batches (late rows: none yet, no result) and the latest watermark."""
        results = []
        if self._recent:
            first_id, last_id = self._recent[0][0], self._recent[-1][0]
            late = sum(batch[1] for batch in self._recent)
            rows = sum(batch[2] for batch in self._recent)
            span = f"batch {last_id}" if first_id == last_id else f"batches {first_id}-{last_id} of this run"
            results.append(late_row_ratio_result(self._pipeline, late, rows, last_id,
                                                 self.bounds.max_late_row_ratio, span))
        if self.bounds.max_watermark_lag_seconds is not None and self._watermark is not None:
            batch_id, watermark_us = self._watermark
            results.append(watermark_lag_result(self._pipeline, watermark_us, batch_id,
                                                self.bounds.max_watermark_lag_seconds, self._clock()))
        return [r for r in results if r.check_name in self._declared]

    def _remember(self, results: Iterable[dg.AssetCheckResult]) -> None:
        for result in results:
            self.latest[str(result.check_name)] = result

    def _report(self, results: list[dg.AssetCheckResult], once_per_materialization: bool) -> None:
        """Runless evaluations of ``results`` on the latest materialization stored."""
        with self._lock:
            try:
                latest = latest_materialization(self._instance, self._pipeline.key)
                if once_per_materialization and latest is not None and latest.storage_id == self._reported_for:
                    return
                for result in results:
                    self._instance.report_runless_asset_event(as_evaluation(result, latest))
                self._remember(results)
                if latest is not None:
                    self._reported_for = latest.storage_id
            except Exception as exc:  # noqa: BLE001 - a check report must never stop the pipeline
                log.warning("pipeline %s: could not report its checks: %s", self._pipeline.name, exc)


class CheckTimer:
    """Calls :meth:`StepChecks.evaluate_on_time` every ``bounds.check_interval_seconds`` on a
    daemon thread, from :meth:`start` until :meth:`close`."""

    def __init__(self, checks: StepChecks) -> None:
        self._checks = checks
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "CheckTimer":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ematix-checks", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._done.wait(self._checks.bounds.check_interval_seconds):
            self._checks.evaluate_on_time()


def _unchanged(instance: dg.DagsterInstance, pipeline: EmatixPipeline, result: dg.AssetCheckResult) -> bool:
    """The check's latest evaluation passed on the same stored batch as ``result``."""
    assert result.check_name is not None
    evaluation = latest_evaluation(instance, pipeline.check_key(result.check_name))
    if evaluation is None or not evaluation.passed:
        return False
    before = evaluation.metadata.get("last_batch_id")
    now = result.metadata.get("last_batch_id")
    return before is not None and now is not None and metadata_value(before) == metadata_value(now)


def report_stored_checks(instance: dg.DagsterInstance, pipeline: EmatixPipeline, spec: PipelineSpec,
                         bounds: CheckBounds, declared: set[str]) -> tuple[list[str], list[str]]:
    """The checks job's part for one pipeline that is not running: (reported, skipped) check names."""
    results = [r for r in stored_results(pipeline, spec, bounds) if r.check_name in declared]
    target = latest_materialization(instance, pipeline.key)
    reported, skipped = [], sorted(declared - {str(r.check_name) for r in results})  # never ran: nothing to measure
    for result in results:
        if _unchanged(instance, pipeline, result):
            skipped.append(str(result.check_name))
            continue
        instance.report_runless_asset_event(as_evaluation(result, target))
        reported.append(str(result.check_name))
    return reported, skipped


__all__ = ["CheckTimer", "RECENT_BATCHES", "RUNNING_CHECKS", "StepChecks", "as_evaluation", "latest_materialization", "report_stored_checks",
           "stored_results"]
