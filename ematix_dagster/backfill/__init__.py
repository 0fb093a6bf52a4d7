"""Rewrite the windows of a past time range from archived input (docs/contract/backfill.md).

:func:`run_backfill` takes the pipeline's backfill lock, refuses a range the streaming state may
still change, recomputes the range's windows with the pipeline's own engine
(:mod:`.compute`) and replaces them in the PostgreSQL target in one transaction, with the range's
dead letters when their table is in the target's database: a crash anywhere leaves both as they were.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa
from pyspark.sql import SparkSession

from ematix_dagster import faults
from ematix_dagster.backfill.compute import compute_windows, replaces_dead_letters
from ematix_dagster.backfill.lock import backfill_lock
from ematix_dagster.backfill.range import BackfillRange
from ematix_dagster.errors import BackfillRefused
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.targets.postgres_target import PostgresDeadLetterWriter, PostgresWindowWriter


@dataclass
class BackfillResult:
    """What one backfill did (the CLI's line, Dagster's metadata)."""

    pipeline: str
    span: BackfillRange  # the range rewritten
    windows: int = 0  # distinct window starts rewritten
    rows_written: int = 0
    rows_deleted: int = 0
    rows_read: int = 0
    dead_letters: int = 0  # the range's dead letters written (with a PostgreSQL table beside the target)
    seconds: float = 0.0
    schema: pa.Schema | None = None  # the rows sent to the target (None: the range held no window start)


def run_backfill(spec: PipelineSpec, start: str, end: str, spark: SparkSession | None = None,
                 progress: Callable[[str], None] = lambda line: None) -> BackfillResult:
    """Backfill [start, end) (ISO dates or date-times, whole ``[backfill]`` partitions)."""
    from ematix_dagster.operations import opened

    began = time.perf_counter()
    if spec.backfill is None:
        raise BackfillRefused("backfill", f"pipeline {spec.pipeline_name} has no [backfill] table",
                              "add [backfill] with partition and start (docs/contract/backfill.md)")
    rng = BackfillRange.parse(spec.backfill, start, end)
    resolved = spec.resolved()
    result = BackfillResult(spec.pipeline_name, rng)
    with backfill_lock(resolved):
        with opened(spec) as store:
            record = store.load(spec.pipeline_name, groups=False).record
        rng.refuse_unless_closed(spec, record.watermark if record else None)
        if not rng.has_windows(spec.window):
            progress(f"[{spec.pipeline_name}] backfill: no window starts in the range; nothing to rewrite")
            return result
        with tempfile.TemporaryDirectory(prefix="ematix-backfill-") as scratch:
            computed = compute_windows(spec, rng, Path(scratch), spark, progress)
        result.rows_read = computed.rows_read
        window = spec.window
        # no row at all (an empty range): the table's rows of the range are deleted, nothing written
        writer = PostgresWindowWriter(resolved.target, spec.pipeline_name, computed.rows.schema,
                                      [window.window_start_column, *window.group_by],
                                      store_emit_kind=window.emit_trigger.fires_early)
        letters = (PostgresDeadLetterWriter(resolved.dead_letter, spec.pipeline_name)
                   if resolved.dead_letter is not None and replaces_dead_letters(spec) else None)
        in_transaction = [] if letters is None else [lambda conn: letters.replace_range_in_transaction(
            conn, rng.start_us, rng.end_us, computed.dead_letters)]
        in_transaction.append(lambda conn: faults.point("backfill_commit", "range"))
        try:
            result.rows_deleted = writer.replace_windows(rng.start_us, rng.end_us, computed.rows, in_transaction)
        finally:
            writer.close()
            if letters is not None:
                letters.close()
        result.dead_letters = computed.dead_letters.num_rows if letters is not None else 0
        result.rows_written = computed.rows.num_rows
        result.schema = computed.rows.schema
        if computed.rows.num_rows:
            result.windows = len(set(computed.rows.column(window.window_start_column).to_pylist()))
    result.seconds = time.perf_counter() - began
    return result


__all__ = ["BackfillRange", "BackfillResult", "run_backfill"]
