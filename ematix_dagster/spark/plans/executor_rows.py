"""The streaming rows Spark's stateful aggregation receives (``[run] window_state = "executors"``).

The driver mode classifies a batch's rows in ``spark.batch.batch_job`` (pre-SQL rules, the guarded
``[transform] sql``, the rejections); executors mode must hand Spark's aggregation exactly the rows
that classification leaves valid, or its windows and the counters recomputed from the batch's input
(``spark.batch.executor_input``) would disagree. So the same run's columns
(:class:`~ematix_dagster.spark.batch.batch_columns.BatchColumns`) are applied here to each source's
stream, with one change: the batch time the future rule reads is ``current_timestamp()``, which Spark
replaces in a streaming plan with the batch's ``batchTimestampMs`` (the value the driver reads from
the offsets log). Every rule is row-wise, so classifying each source's stream apart gives the rows the
driver's classification of the union gives.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ematix_dagster.columns import BATCH_TIME, CORRUPT, EVENT_TS, REASON, SOURCE_ROW, SQL_ERROR, TS
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spark.plans.window_plan import BatchPlan, apply_sql

#: the column metadata Spark's ``withWatermark`` marks the event-time column with
WATERMARK_DELAY = "spark.watermarkDelayMs"


def aggregation_rows(spark: SparkSession, plan: BatchPlan, stream: DataFrame) -> DataFrame:
    """A source's streaming rows (with the engine's columns) that update a window in the driver mode,
    with the SQL's output columns and the source's watermark: what ``executor_aggregation`` takes per
    source. ``spark``: the session ``stream`` belongs to (the SQL's view is registered there).

    The watermark is set on the rows the pre-SQL rules leave valid, before the SQL, so a source's
    newest event time is the driver's (docs/contract/time-and-watermarks.md: rows the SQL filters out
    or fails on still move it); Spark carries it through a SQL that passes ``_event_ts`` unchanged.
    """
    spec, columns = plan.spec, plan.columns
    rows = stream.withColumn(BATCH_TIME, F.unix_micros(F.current_timestamp()))
    rows = (rows.select("*", *columns.classified).filter(columns.valid).drop(TS, REASON)
            .withWatermark(EVENT_TS, f"{spec.window.lateness_ms} milliseconds")
            # Spark's optimizer pushes every later filter that does not read _event_ts (the SQL's WHERE,
            # its failures, the rejections) below the watermark; a filter it cannot see through (not
            # deterministic, always true) keeps them above it
            .filter(F.spark_partition_id() >= F.lit(0)))
    if spec.transform_sql:
        rows = apply_sql(spark, spec, rows.drop(CORRUPT, BATCH_TIME), plan.sql_columns)
        if WATERMARK_DELAY not in rows.schema[EVENT_TS].metadata:
            raise PipelineConfigError("transform.sql", f"does not pass {EVENT_TS} through unchanged, and with "
                                      'window_state = "executors" Spark\'s watermark is set on it before the SQL',
                                      f"select {EVENT_TS} as it is (SELECT *, ... keeps it), or use "
                                      'window_state = "driver"')
    if columns.reason is not None:  # the rejections (without a SQL: the pre-SQL rules again, all passed)
        rows = rows.filter(columns.reason.isNull())
    return rows.drop(BATCH_TIME, CORRUPT, SQL_ERROR, SOURCE_ROW)
