"""Asset checks of a pipeline: checkpoint consistency, idempotent target, watermark lag, late rows.

They read what the store persisted (record, watermark, counters), not process-local Prometheus
counters, so they work from any process. A never-ending asset step never reaches its checks:
run them in their own job on a schedule (``jobs.checks_job`` / ``jobs.checks_schedule``).

While the checkpoint check fails (severity ERROR) the keep-alive sensor does not restart the
pipeline.
"""

import time
from typing import Any, Callable, Optional

import dagster as dg

from ematix_dagster.dagster.pipeline import EmatixPipeline, PipelineLike
from ematix_dagster.dagster.resources import StateStoreResource
from ematix_dagster.spec import PipelineSpec

CHECKPOINT_CHECK = "checkpoint_consistency"
IDEMPOTENT_TARGET_CHECK = "idempotent_target"
WATERMARK_LAG_CHECK = "watermark_lag"
LATE_ROW_RATIO_CHECK = "late_row_ratio"

DEFAULT_MAX_WATERMARK_LAG_SECONDS = 600.0
DEFAULT_MAX_LATE_ROW_RATIO = 0.01


# ---------------------------------------------------------------------------------------------
# Evaluations (plain functions: the ops reuse them)


def checkpoint_problems(spec: PipelineSpec) -> tuple[list[Any], dict[str, Any]]:
    """``operations.check`` on ``spec`` (resources already applied): problems and metadata."""
    from ematix_dagster.operations import check

    report = check(spec)
    meta: dict[str, Any] = {
        "store": report.store,
        "last_batch_id": report.record.last_batch_id if report.record and report.record.last_batch_id is not None
        else -1,
        "lease": report.lease_holder or "free",
        "problems": len(report.problems),
    }
    return report.problems, meta


def idempotency_warnings(spec: PipelineSpec) -> list[str]:
    """Why replays of this pipeline could duplicate output (empty: idempotent)."""
    warnings: list[str] = []
    target = spec.target
    window = spec.window_spec
    if window is None:  # a row pipeline upserts on its [target] key, or (without one) replaces the batch's rows
        key, written, state = list(target.key), "rows", "the watermark"
    else:
        key, written, state = [window.window_start_column, *window.group_by], "windows", "window state"
    if target.kind == "console":
        warnings.append(f"the console target is not idempotent: a replayed batch prints its {written} again "
                        "(at-least-once); use a postgres or parquet target")
    elif target.kind == "postgres" and key:
        warnings.extend(_postgres_key_warnings(spec, key))
    if not spec.state_store.durable:
        warnings.append(f"the state store is in memory: {state} is lost when the run ends, and a restart "
                        "refuses the existing checkpoint; configure a sqlite or postgres store")
    return warnings


def _postgres_key_warnings(spec: PipelineSpec, key: list[str]) -> list[str]:
    from ematix_dagster.errors import EmatixError
    from ematix_dagster.targets import PostgresTable

    target = spec.resolved().target
    keys = ", ".join(key)
    table = PostgresTable(target.url, target.table, spec.pipeline_name, "target")
    try:
        conn = table.connect()
    except EmatixError as exc:
        return [f"cannot inspect the target table: {exc}"]
    try:
        oid = table.table_oid(conn)
        if oid is None:
            if target.create_table:
                return []  # created at start with UNIQUE NULLS NOT DISTINCT (key)
            return [f"table {target.table} does not exist and create_table is false"]
        indexes = [set(cols) for cols, _ in table.unique_indexes(conn, oid)]
        conn.rollback()
    finally:
        table.close()
    if set(key) not in indexes:
        return [f"table {target.table} has no unique key on the natural key ({keys}): upserts cannot make "
                f"replays idempotent; ALTER TABLE {target.table} ADD UNIQUE NULLS NOT DISTINCT ({keys})"]
    return []


def stored_progress(spec: PipelineSpec) -> dict[str, Any]:
    """Watermark and counters as persisted in the store."""
    from ematix_dagster.operations import summary

    return summary(spec, windows=False)


def late_row_ratio(counters: dict[str, int]) -> tuple[int, int]:
    """(late rows, rows consumed) from the stored counters."""
    consumed = sum(v for k, v in counters.items() if k.startswith("rows_consumed:"))
    return int(counters.get("late_rows_dropped", 0)), int(consumed)


def evaluate_checkpoint(pipeline: EmatixPipeline, spec: PipelineSpec) -> dg.AssetCheckResult:
    problems, meta = checkpoint_problems(spec)
    text = "\n".join(f"- {p}" for p in problems) or "checkpoint and state store agree"
    return dg.AssetCheckResult(
        asset_key=pipeline.key, check_name=CHECKPOINT_CHECK, passed=not problems,
        severity=dg.AssetCheckSeverity.ERROR,
        description=text, metadata={**meta, "codes": ", ".join(p.code for p in problems) or "none"},
    )


def evaluate_idempotent_target(pipeline: EmatixPipeline, spec: PipelineSpec) -> dg.AssetCheckResult:
    warnings = idempotency_warnings(spec)
    from ematix_dagster.stores import guarantee

    return dg.AssetCheckResult(
        asset_key=pipeline.key, check_name=IDEMPOTENT_TARGET_CHECK, passed=not warnings,
        severity=dg.AssetCheckSeverity.WARN,
        description="\n".join(f"- {w}" for w in warnings) or "replays rewrite identical rows",
        metadata={"guarantee": guarantee(spec), "warnings": len(warnings), "target": spec.target.kind},
    )


def evaluate_watermark_lag(pipeline: EmatixPipeline, spec: PipelineSpec, max_lag_seconds: float,
                           now: Optional[float] = None) -> dg.AssetCheckResult:
    progress = stored_progress(spec)
    watermark_us = progress["watermark"]
    now = time.time() if now is None else now
    if watermark_us is None:
        return dg.AssetCheckResult(
            asset_key=pipeline.key, check_name=WATERMARK_LAG_CHECK, passed=True,
            severity=dg.AssetCheckSeverity.WARN, description="no watermark yet (the pipeline has not run)",
            metadata={"max_lag_seconds": float(max_lag_seconds)})
    lag = now - watermark_us / 1e6
    passed = lag <= max_lag_seconds
    return dg.AssetCheckResult(
        asset_key=pipeline.key, check_name=WATERMARK_LAG_CHECK, passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=(f"watermark lag {lag:.0f} s " + ("<=" if passed else ">") + f" {max_lag_seconds:.0f} s"),
        metadata={"watermark_lag_seconds": float(lag), "watermark": dg.MetadataValue.timestamp(watermark_us / 1e6),
                  "max_lag_seconds": float(max_lag_seconds),
                  "last_batch_id": progress["last_batch_id"] if progress["last_batch_id"] is not None else -1})


def evaluate_late_row_ratio(pipeline: EmatixPipeline, spec: PipelineSpec, max_ratio: float) -> dg.AssetCheckResult:
    progress = stored_progress(spec)
    late, consumed = late_row_ratio(progress["counters"])
    ratio = late / consumed if consumed else 0.0
    passed = ratio <= max_ratio
    return dg.AssetCheckResult(
        asset_key=pipeline.key, check_name=LATE_ROW_RATIO_CHECK, passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"{late} late rows of {consumed} consumed ({ratio:.2%}; bound {max_ratio:.2%})",
        metadata={"late_rows": late, "rows_consumed": consumed, "late_row_ratio": float(ratio),
                  "max_late_row_ratio": float(max_ratio)})


# ---------------------------------------------------------------------------------------------
# Factory


def pipeline_asset_checks(
    pipeline: PipelineLike,
    *,
    max_watermark_lag_seconds: Optional[float] = None,
    max_late_row_ratio: float = DEFAULT_MAX_LATE_ROW_RATIO,
) -> list[dg.AssetChecksDefinition]:
    """The four checks of a pipeline asset (``pipeline``: the asset, a spec or a TOML path).

    ``max_watermark_lag_seconds`` defaults to 600 s for ``processing_time`` pipelines; for
    ``available_now`` ones the lag check is only made when a bound is given (their watermark
    stands still between runs by design).
    """
    p = EmatixPipeline.load(pipeline)
    if max_watermark_lag_seconds is None and p.long_running:
        max_watermark_lag_seconds = DEFAULT_MAX_WATERMARK_LAG_SECONDS
    prefix = p.python_name

    def build(check_name: str, description: str,
              evaluate: Callable[[PipelineSpec], dg.AssetCheckResult]) -> dg.AssetChecksDefinition:
        @dg.asset_check(asset=p.key, name=check_name, description=description, blocking=False)
        def _check(state_store: StateStoreResource) -> dg.AssetCheckResult:
            return evaluate(state_store.apply(p.spec))

        _check.__name__ = f"{prefix}_{check_name}"  # type: ignore[attr-defined]  # a definition, not a function
        return _check

    checks = [
        build(CHECKPOINT_CHECK, "Spark's checkpoint and the state store agree (batch ids, offsets, query id, "
                                "state version, spec fingerprint). While this fails the pipeline is not restarted.",
              lambda spec: evaluate_checkpoint(p, spec)),
        build(IDEMPOTENT_TARGET_CHECK, "The target makes replays idempotent (upsert on the natural key or "
                                       "batch directories); warns for console targets and missing unique keys.",
              lambda spec: evaluate_idempotent_target(p, spec)),
        build(LATE_ROW_RATIO_CHECK, f"Late rows dropped / rows consumed (stored counters) <= {max_late_row_ratio}.",
              lambda spec: evaluate_late_row_ratio(p, spec, max_late_row_ratio)),
    ]
    if max_watermark_lag_seconds is not None:
        bound = float(max_watermark_lag_seconds)
        checks.append(build(WATERMARK_LAG_CHECK, f"now - global watermark (stored) <= {bound:.0f} s.",
                            lambda spec: evaluate_watermark_lag(p, spec, bound)))
    return checks


__all__ = ["CHECKPOINT_CHECK", "IDEMPOTENT_TARGET_CHECK", "LATE_ROW_RATIO_CHECK", "WATERMARK_LAG_CHECK",
           "evaluate_checkpoint", "evaluate_idempotent_target", "evaluate_late_row_ratio", "evaluate_watermark_lag",
           "idempotency_warnings", "late_row_ratio", "pipeline_asset_checks"]
