"""Health of a pipeline read without Spark and without an orchestrator: whether replays of its target
are idempotent, and its late-row ratio from the stored counters.

The Dagster asset checks (:mod:`ematix_dagster.dagster.checks`) and the Airflow check operator
(:mod:`ematix_dagster.airflow`) evaluate the same rules from here.
"""

from __future__ import annotations

from ematix_dagster.spec import PipelineSpec


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


def late_row_ratio(counters: dict[str, int]) -> tuple[int, int]:
    """(late rows, rows consumed) from the stored counters."""
    consumed = sum(v for k, v in counters.items() if k.startswith("rows_consumed:"))
    return int(counters.get("late_rows_dropped", 0)), int(consumed)


__all__ = ["idempotency_warnings", "late_row_ratio"]
