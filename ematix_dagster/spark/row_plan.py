"""A row pipeline's SQL, analysed by Spark before anything runs (docs/contract/row-pipelines.md).

The spec has read the SQL already (``sql.release``: every ``WATERMARK_TS()`` is an upper bound in
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
from ematix_dagster.spark.plan import VIEW, check_row_wise
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.sql.row_query import row_query


def analyse_rows(spark: SparkSession, spec: PipelineSpec, stream: DataFrame) -> T.StructType:
    """Run a row pipeline's SQL on an empty frame of ``stream``'s schema; return its output columns,
    in SELECT order (the engine's ``_release_us`` and ``_event_us`` left out). A ``PipelineConfigError``
    on ``transform.sql`` if it does not run or is not row by row."""
    assert spec.transform_sql is not None  # the spec refuses a row pipeline without SQL
    sql, _plan = row_query(spec.transform_sql)
    empty = spark.createDataFrame([], stream.schema).drop(CORRUPT)
    empty.createOrReplaceTempView(VIEW)
    try:
        out = spark.sql(sql)
    except Exception as exc:
        raise PipelineConfigError("transform.sql", f"does not run: {first_line(exc)}",
                                  f"query the view named {VIEW!r}, which holds each source's columns, _event_ts and "
                                  "_source; WATERMARK_TS() compares with a TIMESTAMP (cast a DATE or STRING)") from None
    check_row_wise(empty, out)
    return T.StructType([f for f in out.schema.fields if f.name not in (RELEASE_COLUMN, EVENT_US)])
