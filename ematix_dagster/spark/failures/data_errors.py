"""A batch that fails on a value in its input: the same rows fail again on every retry.

Spark reports such failures with SQLSTATE class 22 ("data exception": a failed ANSI cast, an
overflow, a division by zero in an expression ``safe_sql`` cannot guard). Retrying the batch
replays the same rows, so the error is terminal and names what the batch read: the operator
has to fix or remove those rows. Windowed and row pipelines classify them alike.
"""

from __future__ import annotations

from pathlib import Path

from ematix_dagster.errors import BatchDataError, first_line
from ematix_dagster.spark.input import checkpoint
from ematix_dagster.spark.input.checkpoint import batch_files
from ematix_dagster.spark.recovery import checkpoint_offsets
from ematix_dagster.spec import PipelineSpec


def is_data_error(exc: BaseException) -> bool:
    """Spark failed on a value (SQLSTATE class 22, "data exception"): the same rows fail again."""
    state = exc.getSqlState() if hasattr(exc, "getSqlState") else None
    return isinstance(state, str) and state.startswith("22")


def data_error(spec: PipelineSpec, batch_id: int, exc: BaseException) -> BatchDataError:
    """The terminal error for a batch that failed on its data, naming what it read."""
    cp = spec.run.checkpoint_location
    inputs = []
    for i, source in enumerate(spec.sources):
        if source.kind == "files":
            files = [Path(url).name for url in batch_files(cp, i, batch_id)]
            shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
            inputs.append(f"source {source.name!r} files {shown or '(none)'} under {source.path}")
        else:
            now = checkpoint_offsets(spec, batch_id).get(source.name)
            before = checkpoint_offsets(spec, batch_id - 1).get(source.name) \
                if batch_id > 0 and checkpoint.offsets_exist(cp, batch_id - 1) else None
            inputs.append(f"source {source.name!r} offsets {before} -> {now}")
    return BatchDataError(
        f"pipeline {spec.pipeline_name}: batch {batch_id} failed on a value in its input "
        f"({'; '.join(inputs)}): {first_line(exc)}",
        way_out="fix or remove the rows in that input, or compute the failing expression in [transform] sql "
                "(its ANSI-throwing expressions are guarded: ematix_dagster/spark/plans/safe_sql.py lists the ones "
                "that cannot be)")


__all__ = ["data_error", "is_data_error"]
