"""One rule for what a failure means to an operator: every error is an EmatixError.

The CLI prints ``error (terminal)`` or ``error (transient)`` from it and Dagster decides from it
whether to retry, so an exception from Spark, the database driver or the operating system must
not reach them raw: a raw exception would be taken as transient, and a pipeline that fails the
same way every time would be retried forever.

It lives with Spark because what it tells apart is mostly Spark's: an input file Spark cannot read
(:mod:`.read_errors`), a failed query (PySpark's and py4j's errors); every caller (the runner, the
CLI, the Dagster asset) runs a Spark query.
"""

from __future__ import annotations

import errno
import re

from ematix_dagster.errors import (
    AggregationOverflow,
    EmatixError,
    SourceAccessDenied,
    SourceConnectorMissing,
    SourceTrimmed,
    SourceUnavailable,
    SparkQueryFailed,
    StateCapExceeded,
    TargetError,
    UnexpectedError,
    first_line,
)
from ematix_dagster.spark.failures.read_errors import classify_read_error

#: OS errors that go away by themselves (a full disk being cleaned, a network blip).
_TRANSIENT_ERRNOS = {errno.ENOSPC, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED,
                     errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPIPE}


def classify(exc: BaseException, pipeline: str) -> EmatixError:
    """``exc`` itself when it is an EmatixError, else the EmatixError that says what it means."""
    if isinstance(exc, EmatixError):
        return exc
    read_error = classify_read_error(exc)
    if read_error is not None:
        return read_error
    text = _clean(first_line(exc))
    if _is_spark(exc):
        return query_failure(exc, pipeline)
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return TargetError(f"pipeline {pipeline}: {type(exc).__name__}: {text} (retrying may help once the "
                           "cause is gone)")
    return UnexpectedError(f"pipeline {pipeline}: unexpected {type(exc).__name__}: {text} (no rule classifies "
                           "this failure, so it is treated as terminal; the traceback shows where it happened)")


#: how a redis_stream reader's failure reads in Spark's report of it (a Python traceback's last line), and
#: the failures Spark's stateful aggregation raises itself (``spark.plans.executor_plan``: ``raise_error``)
_NAMED_FAILURE = re.compile(r"\b(RedisUnreachable|RedisRefused|StreamTrimmed|AggregationOverflow|StateCapExceeded): "
                            r"([^\n]+?)(?: SQLSTATE: \w+)?$", re.M)
_NAMED_ERRORS: dict[str, type[EmatixError]] = {
    "RedisUnreachable": SourceUnavailable, "RedisRefused": SourceAccessDenied, "StreamTrimmed": SourceTrimmed,
    "AggregationOverflow": AggregationOverflow, "StateCapExceeded": StateCapExceeded}


#: Spark's error classes for a data source it cannot find (Kafka's has a class of its own)
_NO_CONNECTOR = re.compile(r"\[(?:KAFKA_DATA_SOURCE_NOT_ENABLED|DATA_SOURCE_NOT_FOUND)\][^\n]*\bkafka\b", re.I)


def _missing_kafka_connector(pipeline: str) -> SourceConnectorMissing:
    """The way to the Kafka connector, for this installation's Spark: its jars on the classpath, never
    fetched at run time (``spark.jars.packages`` would download them from Maven)."""
    import os

    import pyspark

    version = pyspark.__version__
    jars = os.path.join(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__), "jars")
    return SourceConnectorMissing(
        f"pipeline {pipeline}: Spark has no Kafka connector: a kafka source needs spark-sql-kafka-0-10_2.13-{version}"
        f".jar and the jars it depends on (spark-token-provider-kafka-0-10_2.13-{version}, kafka-clients, "
        f"commons-pool2) on Spark's classpath, and nothing is downloaded at run time. Copy them into {jars}, or name "
        "their local paths in spark.jars (spark-defaults.conf)")


def query_failure(exc: BaseException, pipeline: str) -> EmatixError:
    """A failed streaming query: a source's own failure when Spark's report carries one (Redis gone:
    transient; refused credentials, a trimmed stream, no Kafka connector: terminal), a cap or an
    overflow Spark's stateful aggregation raised (terminal), else :class:`SparkQueryFailed` (transient)."""
    if _NO_CONNECTOR.search(str(exc)):
        return _missing_kafka_connector(pipeline)
    found = _NAMED_FAILURE.search(str(exc))
    if found is not None:
        return _NAMED_ERRORS[found.group(1)](f"pipeline {pipeline}: {_clean(found.group(2).strip())}")
    return SparkQueryFailed(f"pipeline {pipeline}: the streaming query failed: {_clean(first_line(exc))}")


def _is_spark(exc: BaseException) -> bool:
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return isinstance(exc, (PySparkException, Py4JError))


def _clean(text: str) -> str:
    """No password from a database URL in a message, whatever produced it."""
    from state_store.pg_url import redact

    return redact(text)
