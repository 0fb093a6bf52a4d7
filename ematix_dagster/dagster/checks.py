"""Asset checks of a pipeline: checkpoint consistency, idempotent target, watermark lag, late rows;
and of its backfill asset: the rewritten range.

The checks are declared on the pipeline's asset (:func:`check_specs`), not as separate
``@asset_check`` steps: a streaming step never ends, so a check step planned after it would show
"Running" for the pipeline's whole life. The asset's own step evaluates them
(:mod:`ematix_dagster.dagster.check_reports`): all four when it starts, from the store (no Spark
session), the checkpoint check blocking the start when it fails; then lag and late rows over its
recent batches after each materialization. The checks job reports them for pipelines that are not
running. The evaluations here are plain functions of the store's values or of a run's batches.

A backfill asset's step evaluates its one check after it has rewritten a range
(:func:`backfill_check_specs`): the backfill reports what it wrote, and the check reads the target
back, so the operator sees what the table holds, not only what was sent to it.
"""

from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Optional

import dagster as dg

from ematix_dagster.dagster.pipeline import EmatixPipeline
from ematix_dagster.errors import ConfigError
from ematix_dagster.health import idempotency_warnings, late_row_ratio
from ematix_dagster.spec import PipelineSpec

if TYPE_CHECKING:
    from ematix_dagster.operations import CheckReport

CHECKPOINT_CHECK = "checkpoint_consistency"
IDEMPOTENT_TARGET_CHECK = "idempotent_target"
WATERMARK_LAG_CHECK = "watermark_lag"
LATE_ROW_RATIO_CHECK = "late_row_ratio"
REWRITTEN_RANGE_CHECK = "rewritten_range"

DEFAULT_MAX_WATERMARK_LAG_SECONDS = 600.0
DEFAULT_MAX_LATE_ROW_RATIO = 0.01
DEFAULT_CHECK_INTERVAL_SECONDS = 60.0
_BOUND = "bound"  # the check spec's metadata entry holding its bound
_INTERVAL = "interval_seconds"  # and how often a running step evaluates it


@dataclass(frozen=True)
class CheckBounds:
    """The bounds of the lag and late-row checks, and how often a running step evaluates them.

    ``max_watermark_lag_seconds`` defaults to 600 s for ``processing_time`` pipelines; for
    ``available_now`` ones the lag check exists only when a bound is given (their watermark stands
    still between runs by design). ``check_interval_seconds``: a running pipeline evaluates both
    checks at least this often, with or without a batch, so that a stalled input fails the lag
    check within its bound plus one interval.
    """

    max_watermark_lag_seconds: Optional[float] = None
    max_late_row_ratio: float = DEFAULT_MAX_LATE_ROW_RATIO
    check_interval_seconds: float = DEFAULT_CHECK_INTERVAL_SECONDS

    def __post_init__(self) -> None:
        if not self.check_interval_seconds > 0:
            raise ConfigError("CheckBounds.check_interval_seconds", f"{self.check_interval_seconds!r} is not > 0",
                              "e.g. 60 (seconds between two evaluations of a running pipeline's checks)")

    def for_pipeline(self, pipeline: EmatixPipeline) -> "CheckBounds":
        if self.max_watermark_lag_seconds is None and pipeline.long_running:
            return replace(self, max_watermark_lag_seconds=DEFAULT_MAX_WATERMARK_LAG_SECONDS)
        return self

    @classmethod
    def of_asset(cls, asset: dg.AssetsDefinition) -> "CheckBounds":
        """The bounds an asset's check specs were declared with."""
        meta = {spec.name: spec.metadata for spec in asset.check_specs}
        lag = meta.get(WATERMARK_LAG_CHECK, {}).get(_BOUND)
        late = meta.get(LATE_ROW_RATIO_CHECK, {}).get(_BOUND)
        interval = meta.get(LATE_ROW_RATIO_CHECK, {}).get(_INTERVAL)
        return cls(None if lag is None else float(lag),
                   DEFAULT_MAX_LATE_ROW_RATIO if late is None else float(late),
                   DEFAULT_CHECK_INTERVAL_SECONDS if interval is None else float(interval))


#: The bounds a pipeline asset's checks get unless told otherwise.
DEFAULT_CHECK_BOUNDS = CheckBounds()


def check_specs(pipeline: EmatixPipeline, bounds: CheckBounds) -> list[dg.AssetCheckSpec]:
    """The checks declared on a pipeline's asset (``bounds`` already resolved for it)."""
    key = pipeline.key
    every = (f"While the pipeline runs its step evaluates it at least every {bounds.check_interval_seconds:.0f} s, "
             "with or without new data.")
    specs = [
        dg.AssetCheckSpec(CHECKPOINT_CHECK, asset=key, blocking=True,
                          description="Spark's checkpoint and the state store agree (batch ids, offsets, query id, "
                                      "state version, spec fingerprint). Evaluated when a run starts; a failure "
                                      "stops the start, and the keep-alive sensor does not restart the pipeline."),
        dg.AssetCheckSpec(IDEMPOTENT_TARGET_CHECK, asset=key,
                          description="The target makes replays idempotent (upsert on the natural key or batch "
                                      "directories); warns for console targets and missing unique keys."),
        dg.AssetCheckSpec(LATE_ROW_RATIO_CHECK, asset=key,
                          metadata={_BOUND: bounds.max_late_row_ratio, _INTERVAL: bounds.check_interval_seconds},
                          description=f"Late rows dropped / rows read <= {bounds.max_late_row_ratio} (a running "
                                      f"pipeline: over its recent batches; else the stored counters). {every}"),
    ]
    if bounds.max_watermark_lag_seconds is not None:
        bound = float(bounds.max_watermark_lag_seconds)
        specs.append(dg.AssetCheckSpec(WATERMARK_LAG_CHECK, asset=key,
                                       metadata={_BOUND: bound, _INTERVAL: bounds.check_interval_seconds},
                                       description=f"now - global watermark <= {bound:.0f} s. {every}"))
    return specs


def backfill_check_specs(key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    """The checks declared on a backfill asset (its step evaluates them after the rewrite)."""
    return [dg.AssetCheckSpec(
        REWRITTEN_RANGE_CHECK, asset=key,
        description="After a backfill, the target holds exactly the rows it wrote for the range: as many rows whose "
                    "window starts in the range as the backfill wrote (none left from before, none from another "
                    "writer).")]


# ---------------------------------------------------------------------------------------------
# Evaluations


def checkpoint_problems(spec: PipelineSpec) -> tuple[list[Any], dict[str, Any]]:
    """``operations.check`` on ``spec`` (resources already applied): problems and metadata."""
    from ematix_dagster.operations import check

    report = check(spec)
    return report.problems, _checkpoint_metadata(report)


def _checkpoint_metadata(report: "CheckReport") -> dict[str, Any]:
    record = report.record
    return {
        "store": report.store,
        "last_batch_id": record.last_batch_id if record and record.last_batch_id is not None else -1,
        "lease": report.lease_holder or "free",
        "problems": len(report.problems),
    }


def range_row_count(spec: PipelineSpec, start: datetime, end: datetime) -> int:
    """Rows of the PostgreSQL target whose window starts in [start, end), read back after a backfill."""
    from psycopg import sql

    from ematix_dagster.targets import PostgresTable

    target = spec.resolved().target
    column = sql.Identifier(spec.window.window_start_column)
    table = PostgresTable(target.url, target.table, spec.pipeline_name, "target")
    try:
        conn = table.connect()
        row = conn.execute(sql.SQL("SELECT count(*) FROM {t} WHERE {c} >= %s AND {c} < %s").format(
            t=table.ident, c=column), (start, end)).fetchone()
        conn.rollback()
    finally:
        table.close()
    return int(row[0]) if row else 0


def evaluate_rewritten_range(key: dg.AssetKey, spec: PipelineSpec, start: datetime, end: datetime, span: str,
                             written: int) -> dg.AssetCheckResult:
    """The backfill of [start, end) (``span``, as its result names it) wrote ``written`` rows: does the
    target hold as many? A target that cannot be read back fails the check instead of the step, whose
    rewrite has committed."""
    import psycopg

    from ematix_dagster.errors import EmatixError

    try:
        in_target = range_row_count(spec, start, end)
    except (EmatixError, psycopg.Error) as exc:
        return dg.AssetCheckResult(asset_key=key, check_name=REWRITTEN_RANGE_CHECK, passed=False,
                                   severity=dg.AssetCheckSeverity.ERROR,
                                   description=f"cannot read the target back: {exc}",
                                   metadata={"range": span, "rows_written": written})
    passed = in_target == written
    return dg.AssetCheckResult(
        asset_key=key, check_name=REWRITTEN_RANGE_CHECK, passed=passed, severity=dg.AssetCheckSeverity.ERROR,
        description=(f"the target holds {in_target} rows of {span}; the backfill wrote {written}"
                     + ("" if passed else ": another writer has changed the range since the rewrite committed")),
        metadata={"range": span, "rows_written": written, "rows_in_target": in_target})


def evaluate_checkpoint(pipeline: EmatixPipeline, report: "CheckReport") -> dg.AssetCheckResult:
    """The check from ``operations.check``'s report (its record also serves the other checks)."""
    problems = report.problems
    text = "\n".join(f"- {p}" for p in problems) or "checkpoint and state store agree"
    return dg.AssetCheckResult(
        asset_key=pipeline.key, check_name=CHECKPOINT_CHECK, passed=not problems,
        severity=dg.AssetCheckSeverity.ERROR, description=text,
        metadata={**_checkpoint_metadata(report), "codes": ", ".join(p.code for p in problems) or "none"},
    )


def evaluate_idempotent_target(pipeline: EmatixPipeline, spec: PipelineSpec, last_batch_id: int) -> dg.AssetCheckResult:
    warnings = idempotency_warnings(spec)
    from ematix_dagster.stores import guarantee

    return dg.AssetCheckResult(
        asset_key=pipeline.key, check_name=IDEMPOTENT_TARGET_CHECK, passed=not warnings,
        severity=dg.AssetCheckSeverity.WARN,
        description="\n".join(f"- {w}" for w in warnings) or "replays rewrite identical rows",
        metadata={"guarantee": guarantee(spec), "warnings": len(warnings), "target": spec.target.kind,
                  "last_batch_id": int(last_batch_id)},
    )


def latest_evaluation(instance: dg.DagsterInstance, key: dg.AssetCheckKey) -> Optional[dg.AssetCheckEvaluation]:
    """The check's latest finished evaluation (None: never evaluated, or one is planned in a run)."""
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key([key]).get(key)
    event = latest.event.dagster_event if latest is not None and latest.event is not None else None
    data = event.event_specific_data if event is not None else None
    return data if isinstance(data, dg.AssetCheckEvaluation) else None


def watermark_lag_result(pipeline: EmatixPipeline, watermark_us: int, last_batch_id: int, max_lag_seconds: float,
                         now_s: float) -> dg.AssetCheckResult:
    lag = now_s - watermark_us / 1e6
    passed = lag <= max_lag_seconds
    return dg.AssetCheckResult(
        asset_key=pipeline.key, check_name=WATERMARK_LAG_CHECK, passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=(f"watermark lag {lag:.0f} s " + ("<=" if passed else ">") + f" {max_lag_seconds:.0f} s"
                     f" after batch {last_batch_id}"),
        metadata={"watermark_lag_seconds": float(lag), "watermark": dg.MetadataValue.timestamp(watermark_us / 1e6),
                  "max_lag_seconds": float(max_lag_seconds), "last_batch_id": int(last_batch_id)})


def late_row_ratio_result(pipeline: EmatixPipeline, late: int, consumed: int, last_batch_id: int, max_ratio: float,
                          over: str) -> dg.AssetCheckResult:
    """``over``: which batches the counts cover (the run's recent ones, or all the stored counters)."""
    ratio = late / consumed if consumed else 0.0
    passed = ratio <= max_ratio
    return dg.AssetCheckResult(
        asset_key=pipeline.key, check_name=LATE_ROW_RATIO_CHECK, passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"{late} late rows of {consumed} read ({ratio:.2%}; bound {max_ratio:.2%}) over {over}",
        metadata={"late_rows": late, "rows_consumed": consumed, "late_row_ratio": float(ratio),
                  "max_late_row_ratio": float(max_ratio), "over": over, "last_batch_id": int(last_batch_id)})


__all__ = ["CHECKPOINT_CHECK", "CheckBounds", "DEFAULT_CHECK_BOUNDS", "DEFAULT_CHECK_INTERVAL_SECONDS",
           "IDEMPOTENT_TARGET_CHECK", "LATE_ROW_RATIO_CHECK", "REWRITTEN_RANGE_CHECK", "WATERMARK_LAG_CHECK",
           "backfill_check_specs", "check_specs", "evaluate_checkpoint", "evaluate_idempotent_target",
           "evaluate_rewritten_range", "idempotency_warnings", "late_row_ratio", "latest_evaluation",
           "late_row_ratio_result", "range_row_count", "watermark_lag_result"]
