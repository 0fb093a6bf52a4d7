"""ematix-dagster: windowed, event-time streaming aggregations on Spark, operated from Dagster.

Importing the package starts no Spark session and opens no connection.
"""

from ematix_dagster.errors import (
    AggregationOverflow,
    EmatixError,
    PipelineConfigError,
    StateCapExceeded,
    StateNotDurableError,
    TargetError,
)
from ematix_dagster.facade import StreamingPipeline, run_streaming_pipeline, streaming_pipeline
from ematix_dagster.spec import (
    Aggregation,
    Backfill,
    BackfillSource,
    DeadLetter,
    EmitRelease,
    EmitTrigger,
    PipelineSpec,
    RowTransform,
    Run,
    Source,
    StateStoreConfig,
    Target,
    Window,
    dump_pipeline,
    load_pipeline,
    load_pipeline_str,
)

__all__ = [
    "Aggregation", "AggregationOverflow", "Backfill", "BackfillSource", "DeadLetter", "EmatixError", "EmitRelease",
    "EmitTrigger", "PipelineConfigError",
    "PipelineSpec", "RowTransform", "Run", "Source", "StateCapExceeded", "StateNotDurableError", "StateStoreConfig",
    "StreamingPipeline", "Target", "TargetError", "Window", "dump_pipeline", "load_pipeline", "load_pipeline_str",
    "run_streaming_pipeline", "streaming_pipeline",
]
