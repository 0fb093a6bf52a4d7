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

from ematix_dagster.columns import BATCH_TIME, CORRUPT, REASON, SOURCE_ROW, SQL_ERROR, TS
from ematix_dagster.spark.plans.window_plan import BatchPlan, apply_sql


def aggregation_rows(spark: SparkSession, plan: BatchPlan, stream: DataFrame) -> DataFrame:
    """A source's streaming rows (with the engine's columns) that update a window in the driver mode,
    with the SQL's output columns: what ``executor_aggregation`` takes per source. ``spark``: the
    session ``stream`` belongs to (the SQL's view is registered there)."""
    spec, columns = plan.spec, plan.columns
    rows = stream.withColumn(BATCH_TIME, F.unix_micros(F.current_timestamp()))
    if spec.transform_sql:
        valid = rows.select("*", *columns.classified).filter(columns.valid).drop(TS, REASON, CORRUPT, BATCH_TIME)
        rows = apply_sql(spark, spec, valid, plan.sql_columns)
    if columns.reason is not None:  # without a SQL: the pre-SQL rules too
        rows = rows.filter(columns.reason.isNull())
    return rows.drop(BATCH_TIME, CORRUPT, SQL_ERROR, SOURCE_ROW)
