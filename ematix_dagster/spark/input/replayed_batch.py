"""A micro-batch's input read again from the files its checkpoint lists.

When Spark's own stateful aggregation consumes the stream (``[run] window_state = "executors"``), its
``foreachBatch`` sees only the windows it writes; the batch's rows, which the dead letters and the
exact counters are computed from, are read again here, as the driver mode's ``InputFiles`` reads the
batches of its managed sources: the files source ``i`` read in batch N are its file log's entries
between the offsets of batches N-1 and N (:func:`.checkpoint.batch_files`), read with the stream's
schema and options (:func:`.input_files.read_files`). The checkpoint numbers its sources in the
order the query's plan holds them; the executors-mode query unions them in the spec's order.

Only files sources can be read again this way: a Kafka, rate or Redis stream source's offsets name
positions the engine has no reader for outside Spark's stream, so they are refused.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, SparkSession

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spark.input.checkpoint import batch_files
from ematix_dagster.spark.input.input_files import read_files
from ematix_dagster.spark.sources.readers import read_schema, with_engine_columns
from ematix_dagster.spec import PipelineSpec


def replayed_batch(spark: SparkSession, spec: PipelineSpec, batch_id: int) -> DataFrame:
    """The rows of every source in batch ``batch_id`` (with the engine's columns, unioned by name as
    the stream unions them): the same rows, whichever run reads them, since a file log entry and
    the files' bytes do not change."""
    frames = [_source_batch(spark, spec, i, batch_id) for i in range(len(spec.sources))]
    return reduce(lambda union, frame: union.unionByName(frame, allowMissingColumns=True), frames)


def _source_batch(spark: SparkSession, spec: PipelineSpec, index: int, batch_id: int) -> DataFrame:
    source = spec.sources[index]
    key = f"sources[{index}]"
    if source.kind != "files":
        raise PipelineConfigError(key, f'a {source.kind} source cannot be read again from the checkpoint\'s '
                                  'offsets, which window_state = "executors" needs for its dead letters and '
                                  "counters", 'use a files source, or window_state = "driver"')
    urls = batch_files(spec.run.checkpoint_location, index, batch_id)
    if urls:
        return read_files(spark, spec, index, urls)
    return with_engine_columns(spark.createDataFrame([], read_schema(source, key)), spec, index)
