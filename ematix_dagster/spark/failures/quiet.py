"""Spark's own report of a failure the engine explains: kept off the terminal, written to a file.

A batch that fails with an error the engine classifies (a cap, a store that is down, a bad value:
an :class:`~ematix_dagster.errors.EmatixError`) still made Spark log the failed query at ERROR,
with the JVM stack and two copies of the Python traceback, before the CLI's one clear ``error
(terminal): ...`` line: a user read a wall of Java first. :class:`QuietFailures` turns off the
loggers that print it (Spark's streaming execution in the JVM, py4j in Python) as the batch fails,
writes what they would have printed to a file, and names that file on the error
(``EmatixError.stack_file``; ``ematix-dagster run --verbose`` prints everything instead). An error
no rule classifies is printed in full, as before: that is where the stack is needed.
"""

from __future__ import annotations

import logging
import os
import tempfile
import traceback
from typing import Any

from pyspark.sql import SparkSession

from ematix_dagster.errors import EmatixError, UnexpectedError
from ematix_dagster.spark.failures.classify import classify
from state_store.pg_url import redact

#: the JVM loggers (and their children) that log a failed streaming query with its whole stack
SPARK_LOGGERS = ("org.apache.spark.sql.execution.streaming",)
#: py4j's Python logger, which reports errors of the callback server that runs ``foreachBatch``
PY4J_LOGGER = "py4j"


class QuietFailures:
    """One run's quieting: on while a classified failure ends the query, restored after it."""

    def __init__(self, pipeline: str, enabled: bool = True) -> None:
        self.pipeline = pipeline
        self.enabled = enabled
        self._restore: list[tuple[str, Any]] = []  # (JVM logger, its own level before, or None)
        self._py4j_level: int | None = None
        self._spark: SparkSession | None = None

    def batch_failed(self, spark: SparkSession, exc: BaseException) -> None:
        """Quiet the loggers before Spark reports ``exc``, when the engine explains it."""
        if not self.enabled or self._spark is not None or isinstance(classify(exc, self.pipeline), UnexpectedError):
            return
        log4j = _log4j(spark)
        configuration = log4j.LogManager.getContext(False).getConfiguration()
        for name in SPARK_LOGGERS:
            own = configuration.getLoggerConfig(name)
            self._restore.append((name, own.getLevel() if own.getName() == name else None))
            log4j.core.config.Configurator.setLevel(name, log4j.Level.OFF)
        py4j = logging.getLogger(PY4J_LOGGER)
        self._py4j_level = py4j.level
        py4j.setLevel(logging.CRITICAL + 1)
        self._spark = spark

    def named(self, error: BaseException, query_failure: BaseException) -> BaseException:
        """``error`` (the batch's) with the file holding what Spark would have printed of
        ``query_failure`` (the query's end), when the loggers were quieted for it."""
        if self._spark is None or not isinstance(error, EmatixError):
            return error
        fd, path = tempfile.mkstemp(prefix=f"ematix-{self.pipeline}-", suffix=".log")
        with os.fdopen(fd, "w") as out:  # no password from a database URL, whatever wrote the text
            out.write(redact("".join(traceback.format_exception(error))))
            out.write(f"\nThe streaming query's failure, as Spark reports it:\n{redact(_jvm_text(query_failure))}\n")
        error.stack_file = path
        return error

    def restore(self) -> None:
        """The loggers as they were (the session may run other queries in this process)."""
        if self._spark is None:
            return
        log4j = _log4j(self._spark)
        for name, level in self._restore:
            log4j.core.config.Configurator.setLevel(name, level)
        logging.getLogger(PY4J_LOGGER).setLevel(self._py4j_level or logging.NOTSET)
        self._restore, self._spark = [], None


def _log4j(spark: SparkSession) -> Any:
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a running session
    return jvm.org.apache.logging.log4j


def _jvm_text(exc: BaseException) -> str:
    """The exception's message and its JVM stack (PySpark keeps it without a public accessor)."""
    stack = getattr(exc, "_stackTrace", None)
    return f"{exc}\n{stack}" if stack else "".join(traceback.format_exception(exc))
