"""The windows of a backfill range, computed by the pipeline's own engine over its archived input.

The range's windows are recomputed by the same code that streams them (same SQL, aggregators,
bad-row rules and caps), run on a *derived* spec: the sources read from their archive paths, the
SQL reads only the rows whose event time the range's windows contain
(:func:`~ematix_dagster.sql.time_range.restricted_to`), the lateness spans the whole range so no
row is late, in-memory state, and an ``available_now`` run whose end-of-input flush emits every
window as ``final`` into a scratch parquet directory, which is read back here, as are its dead
letters when the backfill rewrites them (:func:`replaces_dead_letters`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from ematix_dagster.backfill.range import BackfillRange
from ematix_dagster.columns import EVENT_TS
from ematix_dagster.spec import DeadLetter, EmitTrigger, PipelineSpec, Run, StateStoreConfig, Target
from ematix_dagster.sql.time_range import restricted_to


@dataclass
class ComputedWindows:
    rows: pa.Table  # the range's window rows, as the streaming engine writes them (``_emit_kind`` final)
    rows_read: int  # input rows the derived run read (the range's event times and the rest of its files)
    dead_letters: pa.Table  # the run's dead letters whose event time is in the range (when they are kept)


def replaces_dead_letters(spec: PipelineSpec) -> bool:
    """Whether a backfill rewrites the range's dead letters too: a PostgreSQL dead-letter table in
    the target's database, so that they change in the target's transaction."""
    resolved = spec.resolved()
    dl = resolved.dead_letter
    return dl is not None and dl.kind == "postgres" and dl.url == resolved.target.url


def derived_spec(spec: PipelineSpec, rng: BackfillRange, scratch: Path) -> PipelineSpec:
    """``spec`` as a one-shot run over the range's input (see the module docstring)."""
    assert spec.backfill is not None
    window = spec.window
    lo, hi = rng.input_us(window)
    archives = {s.name: s.path for s in spec.backfill.sources}
    sources = tuple(replace(s, path=archives.get(s.name, s.path), max_files_per_trigger=None) for s in spec.sources)
    whole_range_ms = math.ceil((hi - lo) / 1_000) + 1
    return replace(
        spec,
        pipeline_name=f"{spec.pipeline_name}-backfill",
        sources=sources,
        transform_sql=restricted_to(spec.transform_sql, lo, hi),
        shape=replace(window, lateness_ms=whole_range_ms, late_data="drop", allowed_lateness_ms=None,
                            emit_trigger=EmitTrigger(), crash_recovery="at_least_once"),
        target=Target(kind="parquet", path=str(scratch / "windows")),
        dead_letter=(DeadLetter(kind="parquet", path=str(scratch / "dead_letters"),
                                include_source_row=spec.dead_letter.include_source_row)
                     if spec.dead_letter is not None and replaces_dead_letters(spec) else None),
        state_store=StateStoreConfig(kind="in_memory"),
        run=Run(checkpoint_location=str(scratch / "checkpoint"), trigger="available_now", end_of_input="flush"),
        metrics_port=None,
        emit=None,  # the range's windows go to the table now, whatever [emit] holds back when streaming
        backfill=None,
    ).validate()


def compute_windows(spec: PipelineSpec, rng: BackfillRange, scratch: Path, spark: SparkSession | None,
                    progress: Callable[[str], None]) -> ComputedWindows:
    """Run the derived spec and keep the windows that start in the range."""
    from ematix_dagster.spark.runner import PipelineRunner

    derived = derived_spec(spec, rng, scratch)
    progress(f"[{spec.pipeline_name}] backfill {rng}: recomputing its windows in one run over the archived input; "
             "the target's rows of the range are replaced in one transaction at the end")
    summary = PipelineRunner(derived, spark=spark, progress=progress, batch_progress=lambda report: None,
                             announce=False).run()
    rows = _in_range(scratch / "windows", spec.window.window_start_column, rng)
    return ComputedWindows(rows, summary.rows_in, _in_range(scratch / "dead_letters", EVENT_TS, rng))


def _in_range(directory: Path, time_column: str, rng: BackfillRange) -> pa.Table:
    """The rows a parquet writer left in ``directory`` whose ``time_column`` is in the range."""
    files = sorted(directory.glob("batch_id=*/*.parquet"))
    if not files:
        return pa.table({})
    rows = pa.concat_tables([pq.read_table(f) for f in files], promote_options="permissive")
    at = pc.cast(rows.column(time_column), pa.int64())
    return rows.filter(pc.fill_null(pc.and_(pc.greater_equal(at, rng.start_us), pc.less(at, rng.end_us)), False))


__all__ = ["ComputedWindows", "compute_windows", "derived_spec", "replaces_dead_letters"]
