"""Airflow operators that run a pipeline, check and migrate its state, and backfill an interval.

Each task loads the pipeline file when it runs (``pipeline``: a TOML path, relative to
``working_dir`` when given), takes its PostgreSQL URL from an Airflow Connection (``conn_id``, into
the ``${EMATIX_PG_URL}`` placeholder: :mod:`.connection`) and maps the pipeline's failures onto
Airflow's outcomes:

* a lease held by another live writer: ``AirflowSkipException`` naming the holder (this run did nothing);
* a terminal :class:`~ematix_dagster.errors.EmatixError` (a bad setting, a changed spec, a cap):
  ``AirflowFailException``, so the task fails once without retries;
* a transient one (a database or a Spark job that went away): a plain failure, so the task's retries
  run again and resume from the state store.

A retry of the run operator takes the lease over from an earlier try of the same task instance
(its process may be gone without having released it): the store's fence refuses every later commit
of that try, so there are never two writers.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from ematix_dagster.airflow.assets import pipeline_asset, source_assets
from ematix_dagster.airflow.connection import DEFAULT_URL_VARIABLE, export_url
from ematix_dagster.errors import EmatixError, LeaseHeld, LeaseLost
from ematix_dagster.streaming.kinds.time_units import format_us

if TYPE_CHECKING:
    from ematix_dagster.spec import PipelineSpec

MODES = ("available_now", "continuous")


def lease_label(context: Any) -> str:
    """The run label of a task instance's lease: ``airflow:<dag>/<task>/<run id>/try<n>``."""
    ti = context["ti"]
    return f"airflow:{ti.dag_id}/{ti.task_id}/{ti.run_id}/try{ti.try_number}"


def earlier_try(context: Any) -> Any:
    """``acquire_lease``'s take-over rule for a task instance: fence a holder that is an earlier try of
    the same task in the same DAG run (Airflow starts a retry only once that try has ended for it)."""
    ti = context["ti"]
    prefix = f"run=airflow:{ti.dag_id}/{ti.task_id}/{ti.run_id}/try"

    def take_over(holder: str | None) -> bool:
        if not holder or prefix not in holder:
            return False
        tail = holder.split(prefix, 1)[1].split()[0]
        return tail.isdigit() and int(tail) < int(ti.try_number)

    return take_over


def failure(exc: BaseException, name: str) -> BaseException:
    """The Airflow outcome of a pipeline's failure (see the module's text)."""
    from ematix_dagster.spark.failures.classify import classify

    err = classify(exc, name)
    text = f"pipeline {name}: {type(err).__name__}: {str(err).strip() or type(err).__name__}"
    if isinstance(err, LeaseHeld) and not isinstance(err, LeaseLost):
        return AirflowSkipException(f"{text} (another run holds the pipeline's lease: {err.holder}; this run did "
                                    "nothing)")
    if isinstance(err, LeaseLost):
        return AirflowFailException(f"{text} (another run took the lease over; this run stopped without "
                                    "committing its batch)")
    if err.terminal:
        return AirflowFailException(f"{text} (terminal: the operator must act; not retried)")
    return AirflowException(f"{text} (transient: a retry resumes from the state store)")


def spark_jvm_out_of_the_task_group() -> None:
    """Start this process's Spark JVM in a session of its own, before the session is built.

    Airflow signals a task's whole process group when it stops the task (a clear, a mark, a
    timeout): the JVM would get the SIGTERM too and its shutdown hook would stop the SparkContext
    under the running batch. Out of the group, only the task process gets it, and ``on_kill`` stops
    the query at a batch boundary. The JVM still ends with the task process: it exits when its stdin,
    a pipe from this process, closes (a SIGKILLed task included).
    """
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is None:
        SparkContext._ensure_initialized(gateway=launch_gateway(popen_kwargs={"start_new_session": True}))


def _spark(pipeline: str) -> Any:
    """The run's session, started once the runner holds the lease (a refused run starts no JVM)."""
    from ematix_dagster.spark.spark_session import get_spark

    spark_jvm_out_of_the_task_group()
    return get_spark(f"ematix-{pipeline}")


class EmatixOperator(BaseOperator):
    """What the operators share: the pipeline file, its Connection and the working directory."""

    template_fields: Sequence[str] = ("pipeline",)
    ui_color = "#e8f1fa"

    def __init__(self, *, pipeline: str, conn_id: str | None = None, url_variable: str = DEFAULT_URL_VARIABLE,
                 working_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = str(pipeline)
        self.conn_id = conn_id
        self.url_variable = url_variable
        self.working_dir = working_dir

    def load_spec(self) -> PipelineSpec:
        """Load the pipeline in the task process: working directory entered, Connection's URL in place."""
        from ematix_dagster.spec import load_pipeline

        if self.working_dir:
            os.chdir(self.working_dir)
        export_url(self.conn_id, self.url_variable)
        try:
            return load_pipeline(self.pipeline)
        except EmatixError as exc:
            raise failure(exc, Path(self.pipeline).stem) from exc


class EmatixRunOperator(EmatixOperator):
    """Run a pipeline inside the task.

    ``mode="available_now"`` reads the input there is and ends (schedule it; give the DAG
    ``max_active_runs=1``). ``mode="continuous"`` runs the streaming query in the task until it is
    stopped: ``on_kill`` (the task was cleared, marked or timed out) stops it at a batch boundary and
    releases the lease. Each batch logs one progress line; the task's XCom value is the run's
    summary: ``batches``, ``rows_in``, ``rows_emitted``, ``late_rows``, ``watermark``,
    ``last_batch_id``. The outlet is the pipeline's target (:func:`~.assets.pipeline_asset`), the
    inlets its inputs.
    """

    template_fields: Sequence[str] = ("pipeline", "mode")

    def __init__(self, *, pipeline: str, mode: str = "available_now", **kwargs: Any) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        working_dir = kwargs.get("working_dir")
        # the pipeline file is read where the DAG is parsed, for its Assets (a bad setting shows as the
        # DAG's import error naming the key); pass outlets and inlets to read it only when the task runs
        if "outlets" not in kwargs:
            kwargs["outlets"] = [pipeline_asset(pipeline, working_dir)]
        if "inlets" not in kwargs:
            kwargs["inlets"] = source_assets(pipeline, working_dir)
        super().__init__(pipeline=pipeline, **kwargs)
        self.mode = mode
        self._runner: Any = None
        self._killed = False

    def execute(self, context: Any) -> dict[str, Any]:
        from ematix_dagster.spark.runner import PipelineRunner

        spec = self.load_spec()
        name = spec.pipeline_name
        trigger = "available_now" if self.mode == "available_now" else "processing_time"
        spec = dataclasses.replace(spec, run=dataclasses.replace(spec.run, trigger=trigger))
        summary: dict[str, Any] = {"pipeline": name, "mode": self.mode, "batches": 0, "rows_in": 0,
                                   "rows_emitted": 0, "late_rows": 0, "watermark": None, "last_batch_id": None}
        try:
            # one line per batch that read or wrote rows; a continuous query's heartbeat-only batches
            # (one a second when no input arrives) log none
            self._runner = runner = PipelineRunner(spec, spark=lambda: _spark(name), progress=self.log.info,
                                                   run_label=lease_label(context),
                                                   take_over_lease=earlier_try(context),
                                                   batch_progress=lambda report: self._progress(report, name))
            for report in runner.events():
                summary["batches"] += 1
                summary["rows_in"] += report.rows_in
                summary["rows_emitted"] += report.rows_written
                summary["late_rows"] += report.count("late_rows")
                summary["last_batch_id"] = report.batch_id
                if report.watermark is not None:
                    summary["watermark"] = format_us(report.watermark)
        except (AirflowException, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - every failure gets its Airflow outcome
            raise failure(exc, name) from exc
        if self._killed:
            raise AirflowException(f"pipeline {name}: stopped on request at a batch boundary after batch "
                                   f"{summary['last_batch_id']}; lease released")
        self.log.info("pipeline %s: %s batches, %s rows in, %s rows emitted, %s late rows; watermark %s", name,
                      summary["batches"], summary["rows_in"], summary["rows_emitted"], summary["late_rows"],
                      summary["watermark"])
        return summary

    def _progress(self, report: Any, name: str) -> None:
        if report.rows_in or report.rows_written or report.count("late_rows"):
            self.log.info("%s", report.progress_line(name))

    def on_kill(self) -> None:
        """Stop the query at a batch boundary (the batch in flight commits first); the runner then
        releases the lease as ``execute`` leaves."""
        self._killed = True
        if self._runner is not None:
            self._runner.request_stop()


class EmatixCheckOperator(EmatixOperator):
    """The health checks the Dagster asset evaluates, from the store (no Spark).

    ``checkpoint_consistency`` (checkpoint and store agree: ``operations.check``) fails the task;
    ``idempotent_target``, ``late_row_ratio`` (stored counters, bound ``max_late_row_ratio``) and
    ``watermark_lag`` (only with ``max_watermark_lag_seconds``) are warnings unless ``fail_on_warn``.
    The XCom value maps each check to ``{"passed": ..., "description": ...}``.
    """

    def __init__(self, *, pipeline: str, max_late_row_ratio: float = 0.01,
                 max_watermark_lag_seconds: float | None = None, fail_on_warn: bool = False, **kwargs: Any) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        self.max_late_row_ratio = max_late_row_ratio
        self.max_watermark_lag_seconds = max_watermark_lag_seconds
        self.fail_on_warn = fail_on_warn

    def execute(self, context: Any) -> dict[str, Any]:
        import time

        from ematix_dagster.health import idempotency_warnings, late_row_ratio
        from ematix_dagster.operations import check

        spec = self.load_spec()
        name = spec.pipeline_name
        try:
            report = check(spec)
            warnings = idempotency_warnings(spec)
        except Exception as exc:  # noqa: BLE001
            raise failure(exc, name) from exc
        record = report.record
        results: dict[str, dict[str, Any]] = {
            "checkpoint_consistency": {"passed": report.healthy, "severity": "error",
                                       "description": "; ".join(str(p) for p in report.problems)
                                       or "checkpoint and state store agree"},
            "idempotent_target": {"passed": not warnings, "severity": "warn",
                                  "description": "; ".join(warnings) or "replays rewrite identical rows"},
        }
        late, consumed = late_row_ratio(record.counters if record else {})
        ratio = late / consumed if consumed else 0.0
        results["late_row_ratio"] = {"passed": ratio <= self.max_late_row_ratio, "severity": "warn",
                                     "description": f"{late} late rows of {consumed} read ({ratio:.2%}; bound "
                                                    f"{self.max_late_row_ratio:.2%})"}
        if self.max_watermark_lag_seconds is not None:
            watermark = record.watermark if record else None
            lag = None if watermark is None else time.time() - watermark / 1e6
            results["watermark_lag"] = {
                "passed": lag is not None and lag <= self.max_watermark_lag_seconds, "severity": "warn",
                "description": "no watermark stored yet" if lag is None else
                f"watermark lag {lag:.0f} s (bound {self.max_watermark_lag_seconds:.0f} s)"}
        for check_name, result in results.items():
            self.log.info("pipeline %s: %s %s: %s", name, check_name, "passed" if result["passed"] else "FAILED",
                          result["description"])
        failed = [n for n, r in results.items() if not r["passed"] and (r["severity"] == "error" or self.fail_on_warn)]
        if failed:
            raise AirflowFailException(f"pipeline {name}: checks failed: " + "; ".join(
                f"{n}: {results[n]['description']}" for n in failed))
        return results


class EmatixMigrateOperator(EmatixOperator):
    """Bring the pipeline's stored state blobs to the current version (``operations.migrate``).

    It takes the pipeline's lease for the rewrite: while a run holds it the task is skipped, naming
    the holder (schedule it again later); ``preview`` only says what would change.
    """

    def __init__(self, *, pipeline: str, preview: bool = False, **kwargs: Any) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        self.preview = preview

    def execute(self, context: Any) -> list[str]:
        from ematix_dagster.operations import migrate

        spec = self.load_spec()
        try:
            lines = migrate(spec, dry_run=self.preview)
        except Exception as exc:  # noqa: BLE001
            raise failure(exc, spec.pipeline_name) from exc
        for line in lines:
            self.log.info("pipeline %s: %s", spec.pipeline_name, line)
        return lines


class EmatixBackfillOperator(EmatixOperator):
    """Rewrite the windows of ``[start, end)`` (by default the DAG run's data interval) from archived input.

    The interval must be whole ``[backfill]`` partitions: a misaligned one is refused before anything
    runs, the message naming the aligned boundaries to use (terminal: no retry). Run it from a DAG
    whose timetable gives data intervals matching the partitions
    (``CronDataIntervalTimetable("@daily", timezone="UTC")`` for ``partition = "daily"``; a plain cron
    string gives runs a point in time in Airflow 3) with ``catchup=True``, or from ``airflow backfill create``. The XCom value: range, windows, rows written, replaced and read.
    """

    template_fields: Sequence[str] = ("pipeline", "start", "end")

    def __init__(self, *, pipeline: str, start: str = "{{ data_interval_start }}",
                 end: str = "{{ data_interval_end }}", **kwargs: Any) -> None:
        working_dir = kwargs.get("working_dir")
        if "outlets" not in kwargs:
            kwargs["outlets"] = [pipeline_asset(pipeline, working_dir)]
        super().__init__(pipeline=pipeline, **kwargs)
        self.start = start
        self.end = end

    def execute(self, context: Any) -> dict[str, Any]:
        from ematix_dagster.backfill import run_backfill

        spec = self.load_spec()
        start, end = _iso(self.start), _iso(self.end)
        if start == end:
            raise AirflowFailException(
                f"backfill {spec.pipeline_name}: the interval [{start}, {end}) is empty: the DAG's timetable gives "
                "runs a point in time (a cron string in Airflow 3); schedule it with CronDataIntervalTimetable "
                "(e.g. CronDataIntervalTimetable(\"@daily\", timezone=\"UTC\")) or pass start and end")
        try:
            result = run_backfill(spec, start, end, progress=self.log.info)
        except Exception as exc:  # noqa: BLE001
            raise failure(exc, spec.pipeline_name) from exc
        self.log.info("backfill %s: %s rewritten: %s windows, %s rows", spec.pipeline_name, result.span,
                      result.windows, result.rows_written)
        return {"pipeline": spec.pipeline_name, "range": str(result.span), "windows_rewritten": result.windows,
                "rows_written": result.rows_written, "rows_replaced": result.rows_deleted,
                "rows_read": result.rows_read}


def _iso(value: Any) -> str:
    """A rendered interval bound as ISO text (``2026-01-01 00:00:00+00:00`` and datetimes alike)."""
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return text.strip().replace(" ", "T", 1)


__all__ = ["EmatixBackfillOperator", "EmatixCheckOperator", "EmatixMigrateOperator", "EmatixOperator",
           "EmatixRunOperator", "MODES", "earlier_try", "failure", "lease_label"]
