"""A row pipeline's SQL, analysed by Spark before anything runs (docs/contract/row-pipelines.md).

The spec has read the SQL already (``sql.release_plan``: every ``WATERMARK_TS()`` is an upper bound in
the top-level WHERE); what only Spark can tell is whether the query runs over the sources'
columns, stays row by row, and gives a release time Spark can compute (``UNIX_MICROS`` of a
TIMESTAMP). Spark does not know ``WATERMARK_TS()``, so the query is analysed in the form the
engine runs (``sql.row_query``): a query that calls it as its release plan's SQL, without the
WHERE, with ``_release_us`` appended; every query with ``_event_us`` appended.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from ematix_dagster.columns import CORRUPT, EVENT_US, RELEASE_COLUMN
from ematix_dagster.errors import PipelineConfigError, first_line
from ematix_dagster.spark.plans.window_plan import VIEW, check_row_wise
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.sql.release_plan import release_plan
from ematix_dagster.sql.row_query import row_query


def analyse_rows(spark: SparkSession, spec: PipelineSpec, stream: DataFrame) -> T.StructType:
    """Run a row pipeline's SQL on an empty frame of ``stream``'s schema; return its output columns,
    in SELECT order. A ``PipelineConfigError`` on ``transform.sql`` if it does not run or is not row
    by row.

    The SQL is checked row by row in its release form first (an aggregate then reads "not
    row-wise", not as a column the engine's ``_event_us`` cannot find), then run as the engine
    runs it, with ``_event_us`` appended.
    """
    assert spec.transform_sql is not None  # the spec refuses a row pipeline without SQL
    plan = release_plan(spec.transform_sql)
    empty = spark.createDataFrame([], stream.schema).drop(CORRUPT)
    empty.createOrReplaceTempView(VIEW)
    check_row_wise(empty, _run(spark, spec.transform_sql if plan is None else plan.sql))
    out = _run(spark, row_query(spec.transform_sql)[0])
    return T.StructType([f for f in out.schema.fields if f.name not in (RELEASE_COLUMN, EVENT_US)])


def _run(spark: SparkSession, sql: str) -> DataFrame:
    try:
        return spark.sql(sql)
    except Exception as exc:
        raise PipelineConfigError("transform.sql", f"does not run: {first_line(exc)}",
                                  f"query the view named {VIEW!r}, which holds each source's columns, _event_ts and "
                                  "_source; WATERMARK_TS() compares with a TIMESTAMP (cast a DATE or STRING)") from None
