"""The engine calls, one per pipeline shape: where a shape joins the one batch step.

``spark.batch.batch_step.BatchStep`` runs every batch the same way and hands the shape-specific part to an
engine call. A windowed pipeline's is :class:`~ematix_dagster.spark.batch.window_call.WindowCall`
(partials from Spark, window state on the driver), or, with ``[run] window_state = "executors"``,
:class:`~ematix_dagster.spark.batch.executor_call.ExecutorCall` (Spark's stateful aggregation keeps
it); a row pipeline's :class:`~ematix_dagster.spark.batch.row_call.RowCall`. A new shape adds its call
here and nowhere else in the runner.
"""

from __future__ import annotations

from ematix_dagster.spark.batch.executor_call import ExecutorCall
from ematix_dagster.spark.batch.row_call import RowCall
from ematix_dagster.spark.batch.window_call import WindowCall
from ematix_dagster.spec import PipelineSpec

AnyCall = WindowCall | RowCall | ExecutorCall


def engine_call(spec: PipelineSpec) -> type[WindowCall] | type[RowCall] | type[ExecutorCall]:
    """The engine call of ``spec``'s shape."""
    if spec.is_row_pipeline:
        return RowCall
    return ExecutorCall if spec.run.window_state == "executors" else WindowCall
