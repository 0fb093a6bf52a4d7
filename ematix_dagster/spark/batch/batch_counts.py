"""Reading a batch's counters back from its job's result (``ematix_dagster.spark.batch.batch_job``).

The per-source counters (``ematix_dagster.spark.batch.batch_columns``: observed on a SQL's input, or
hidden aggregates of the partials), the lateness and rejection counters, and whether a batch
planned without the future check may hold a future row.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ematix_dagster.columns import CLASS, LATE_ASSIGNMENTS, REOPENED, ROWS, SOURCE_MAX_PREFIX, SOURCE_ROWS_PREFIX
from ematix_dagster.spark.batch.observed import Observed
from ematix_dagster.spark.batch.rejects import REJECT_REASONS
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.kinds import MICROS_PER_MS
from ematix_dagster.streaming.micro_batch import SourceStats


def batch_counts(spec: PipelineSpec, table: pa.Table, source_stats: Observed | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(per-source counters as ``spark.batch.batch_columns.source_stats`` names them, lateness and
    rejection counters) from the job's result (``rejected``: rows per reason of
    ``ematix_dagster.spark.batch.rejects``).

    Vectorised over the partials table: a sum or max per hidden column, over the class rows
    where the counter is a class's.
    """
    classes = table.column(CLASS)
    classed = classes.null_count < len(classes)  # most batches hold no class row: nothing to filter by
    windowed = pc.is_null(classes) if classed else None

    def total(column: str, where: pa.ChunkedArray | None = None) -> int:
        if column not in table.column_names:
            return 0
        values = table.column(column) if where is None else table.column(column).filter(where)
        return int(pc.sum(values).as_py() or 0)

    def of_class(column: str, name: str) -> int:
        return total(column, pc.equal(classes, name)) if classed else 0

    late: dict[str, Any] = {"late_rows": of_class(ROWS, "late"),
            "late_assignments": total(LATE_ASSIGNMENTS, windowed), "reopened_rows": total(REOPENED, windowed),
            "rejected": {r: n for r in REJECT_REASONS if (n := of_class(ROWS, r))},
            "rows": total(ROWS)}  # every row of the job, each once (with a SQL: the SQL's output rows)
    if source_stats is not None:
        return source_stats.values(), late
    stats: dict[str, Any] = {}
    several = len(spec.sources) > 1
    for i in range(len(spec.sources)):
        rows = f"{SOURCE_ROWS_PREFIX}{i}" if several else ROWS
        stats[f"rows_{i}"] = total(rows)
        stats[f"max_{i}"] = pc.max(table.column(f"{SOURCE_MAX_PREFIX}{i}")).as_py()
        for reason in ("invalid_event_time", "future", "malformed"):
            stats[f"{reason.split('_')[0]}_{i}"] = of_class(rows, reason)
    return stats, late


def sources_of(spec: PipelineSpec, values: dict[str, Any]) -> dict[str, SourceStats]:
    """Each source's statistics from the per-source counters (``spark.batch.batch_columns.source_stats``'
    names)."""
    return {s.name: SourceStats(rows=values[f"rows_{i}"] or 0, max_event_ts=values[f"max_{i}"],
                                invalid=values[f"invalid_{i}"] or 0, future=values[f"future_{i}"] or 0,
                                malformed=values[f"malformed_{i}"] or 0)
            for i, s in enumerate(spec.sources)}


def filtered_rows(sources: dict[str, SourceStats], out_rows: int) -> int:
    """Rows the SQL's WHERE left out: its input (the rows with a valid event time that parsed) less its
    ``out_rows``, each row counted once; a lookup join may also add rows, so never below 0."""
    valid = sum(s.rows - s.invalid - s.future - s.malformed for s in sources.values())
    return max(valid - out_rows, 0)


def may_hold_future_rows(spec: PipelineSpec, table: pa.Table, batch_time_us: int) -> bool:
    """Whether a row of a batch planned without the future check (``spark.plans.window_plan.BatchPlan.late_on_driver``)
    may be in the future: a source's newest valid event time passes the batch time plus its skew."""
    for i, source in enumerate(spec.sources):
        newest = pc.max(table.column(f"{SOURCE_MAX_PREFIX}{i}")).as_py()
        if newest is not None and newest > batch_time_us + source.max_future_skew_ms * MICROS_PER_MS:
            return True
    return False
