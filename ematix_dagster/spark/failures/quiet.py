"""Spark's own report of a failure the engine explains: kept off the terminal, written to a file.

A batch that fails with an error the engine classifies (a cap, a store that is down, a bad value:
an :class:`~ematix_dagster.errors.EmatixError`) still made Spark log the failed query at ERROR,
with the JVM stack and two copies of the Python traceback, before the CLI's one clear ``error
(terminal): ...`` line: a user read a wall of Java first. :class:`QuietFailures` turns off the
loggers that print it (Spark's streaming execution in the JVM, py4j in Python) as the batch fails,
writes what they would have printed to a file, and names that file on the error
(``EmatixError.stack_file``; ``ematix-dagster run --verbose`` prints everything instead). An error
no rule classifies is printed in full, as before: that is where the stack is needed.

A failure Spark meets before any batch of ours runs (a source's reader: Redis unreachable, refused
credentials, a trimmed stream) is logged on Spark's stream thread as the query ends, before Python
hears of it. So for the query's lifetime (:meth:`QuietFailures.route`) the loggers that report a
failed query, task or job (:data:`ROUTED`) write their failure reports to the run's file instead of
the terminal; other lines stay on the terminal. A run that ends without a classified failure copies
whatever the file holds back to the terminal, so nothing Spark reported is lost.

Runs in one process share one JVM and so its loggers: the first run to route (or quiet) them sets
them up and the last one to end puts them back, each run adding and removing only its own file. A
run that ends therefore leaves another still routed; while two overlap, a failure report reaches
both their files (a logger cannot tell which query a task's report is about).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from ematix_dagster.errors import EmatixError, UnexpectedError
from ematix_dagster.spark.failures.classify import classify
from state_store.pg_url import redact

#: the JVM loggers (and their children) that log a failed streaming query with its whole stack
SPARK_LOGGERS = ("org.apache.spark.sql.execution.streaming",)
#: py4j's Python logger, which reports errors of the callback server that runs ``foreachBatch``
PY4J_LOGGER = "py4j"
#: loggers whose failure reports go to the run's file while its query runs, with the lowest level
#: that is a failure report: a failed query (the stream thread), a task's error and a lost task
ROUTED = (("org.apache.spark.sql.execution.streaming", "ERROR"),
          ("org.apache.spark.sql.execution.python", "ERROR"),
          ("org.apache.spark.executor.Executor", "ERROR"),
          ("org.apache.spark.scheduler.TaskSetManager", "WARN"))
#: Spark's own console pattern (log4j2-defaults.properties)
PATTERN = "%d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex"


class _SharedLogging:
    """The JVM's logger settings every run of this process shares (one JVM behind every session):
    changed by the first run that needs them, put back by the last, so a run that ends leaves a
    run still going routed and quiet. Each run adds and removes only its own file appender."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.routes: dict[str, Any] = {}  # appender name -> the run's FileAppender, while routed
        self.added: list[str] = []  # the logger configurations added for the routing
        self.changed: list[tuple[str, bool, list[str]]] = []  # those changed: (name, additive, appenders)
        self.quieted = 0  # runs whose failed batch turned Spark's streaming loggers off
        self.quiet_session: SparkSession | None = None
        self.levels: list[tuple[str, Any]] = []  # (JVM logger, its own level before, or None)
        self.py4j_level = logging.NOTSET

    def route(self, spark: SparkSession, name: str, path: str) -> None:
        """Add the run's file (appender ``name``) to the loggers of :data:`ROUTED`, routing them first."""
        with self.lock:
            log4j = _log4j(spark)
            context = log4j.LogManager.getContext(False)
            config = context.getConfiguration()
            layout = log4j.PatternLayout.newBuilder().withPattern(PATTERN).build()
            appender = (log4j.FileAppender.newBuilder().setName(name)
                        .withFileName(path).withAppend(True).setLayout(layout).build())
            appender.start()
            config.addAppender(appender)
            if not self.routes:
                self._route(log4j, config)
            for logger, _ in ROUTED:
                config.getLoggerConfig(logger).addAppender(appender, None, None)
            context.updateLoggers()
            self.routes[name] = appender

    def _route(self, log4j: _Log4j, config: Any) -> None:
        """The loggers of :data:`ROUTED` off the terminal from their failure level on (their other lines
        stay on it), kept as they were to put back."""
        terminal = list(config.getRootLogger().getAppenders().values())
        deny = log4j.FilterResult
        for name, level in ROUTED:
            logger = config.getLoggerConfig(name)
            if logger.getName() == name:  # configured already (a level set): routed as it is, put back after
                self.changed.append((name, logger.isAdditive(), list(logger.getAppenders().keySet())))
                logger.setAdditive(False)
            else:
                logger = log4j.LoggerConfig(name, None, False)
                config.addLogger(name, logger)
                self.added.append(name)
            below = log4j.ThresholdFilter.createFilter(log4j.Level.getLevel(level), deny.DENY, deny.NEUTRAL)
            for console in terminal:
                if console.getName() not in logger.getAppenders():
                    logger.addAppender(console, None, below)

    def unroute(self, spark: SparkSession, name: str) -> None:
        """Remove the run's file; the last run's puts the loggers back as they were."""
        with self.lock:
            appender = self.routes.pop(name, None)
            if appender is None:
                return
            log4j = _log4j(spark)
            context = log4j.LogManager.getContext(False)
            config = context.getConfiguration()
            for logger, _ in ROUTED:
                own = config.getLoggerConfig(logger)
                if own.getName() == logger:
                    own.removeAppender(name)
            if not self.routes:
                for logger in self.added:
                    config.removeLogger(logger)
                for logger, additive, appenders in self.changed:
                    own = config.getLoggerConfig(logger)
                    for added in set(own.getAppenders().keySet()) - set(appenders):
                        own.removeAppender(added)
                    own.setAdditive(additive)
                self.added, self.changed = [], []
            context.updateLoggers()
            config.removeAppender(name)
            appender.stop()

    def quiet(self, spark: SparkSession) -> None:
        """Spark's streaming loggers and py4j's off until the last quieted run is restored."""
        with self.lock:
            self.quieted += 1
            if self.quieted > 1:
                return
            log4j = _log4j(spark)
            configuration = log4j.LogManager.getContext(False).getConfiguration()
            for name in SPARK_LOGGERS:
                own = configuration.getLoggerConfig(name)
                self.levels.append((name, own.getLevel() if own.getName() == name else None))
                log4j.Configurator.setLevel(name, log4j.Level.OFF)
            py4j = logging.getLogger(PY4J_LOGGER)
            self.py4j_level = py4j.level
            py4j.setLevel(logging.CRITICAL + 1)
            self.quiet_session = spark

    def unquiet(self) -> None:
        with self.lock:
            self.quieted -= 1
            if self.quieted or self.quiet_session is None:
                return
            log4j = _log4j(self.quiet_session)
            for name, level in self.levels:
                log4j.Configurator.setLevel(name, level)
            logging.getLogger(PY4J_LOGGER).setLevel(self.py4j_level)
            self.levels, self.quiet_session = [], None


_SHARED = _SharedLogging()


class QuietFailures:
    """One run's quieting: on while a classified failure ends the query, restored after it."""

    def __init__(self, pipeline: str, enabled: bool = True) -> None:
        self.pipeline = pipeline
        self.enabled = enabled
        self._spark: SparkSession | None = None  # the session whose loggers this run quieted
        self._routed: SparkSession | None = None  # the session whose loggers write to ``path``
        self.path: str | None = None  # the run's file of Spark's failure reports
        self._named = False

    def route(self, spark: SparkSession) -> None:
        """Send the failure reports of :data:`ROUTED` to the run's file until :meth:`restore`."""
        if not self.enabled or self._routed is not None:
            return
        fd, self.path = tempfile.mkstemp(prefix=f"ematix-{self.pipeline}-", suffix=".log")
        os.close(fd)
        _SHARED.route(spark, self._appender, self.path)
        self._routed = spark

    @property
    def _appender(self) -> str:
        return f"ematix-quiet-{self.pipeline}-{id(self)}"

    def batch_failed(self, spark: SparkSession, exc: BaseException) -> None:
        """Quiet the loggers before Spark reports ``exc``, when the engine explains it."""
        if not self.enabled or self._spark is not None or isinstance(classify(exc, self.pipeline), UnexpectedError):
            return
        _SHARED.quiet(spark)
        self._spark = spark
    def named(self, error: BaseException, query_failure: BaseException) -> BaseException:
        """``error`` (the batch's) with the file holding what Spark would have printed of
        ``query_failure`` (the query's end), when the loggers were quieted for it."""
        if (self._spark is None and self.path is None) or not isinstance(error, EmatixError) \
                or isinstance(error, UnexpectedError):
            return error
        path = self.path
        if path is None:
            fd, path = tempfile.mkstemp(prefix=f"ematix-{self.pipeline}-", suffix=".log")
            os.close(fd)
        logged = Path(path).read_text(errors="replace")
        with open(path, "w") as out:  # no password from a database URL, whatever wrote the text
            if logged:
                out.write(f"Spark's log of the failure:\n{redact(logged)}\n")
            out.write(redact("".join(traceback.format_exception(error))))
            out.write(f"\nThe streaming query's failure, as Spark reports it:\n{redact(_jvm_text(query_failure))}\n")
        error.stack_file = path
        self._named = path == self.path
        return error

    def restore(self) -> None:
        """The loggers as they were (the session may run other queries in this process); what the
        run's file holds back on the terminal unless a classified failure names it."""
        if self._spark is not None:
            _SHARED.unquiet()
            self._spark = None
        if self._routed is not None:
            _SHARED.unroute(self._routed, self._appender)
            self._routed = None
        if self.path is not None and not self._named:
            logged = Path(self.path).read_text(errors="replace")
            if logged:
                sys.stderr.write(logged)
                sys.stderr.flush()
            os.unlink(self.path)
        self.path, self._named = None, False


class _Log4j:
    """The log4j classes the routing uses, each looked up once per JVM by its full name: py4j resolves
    ``jvm.org.apache...`` one reflection call per name segment, each a class lookup that fails across
    all of Spark's jars (a run's routing took 46 ms that way)."""

    def __init__(self, jvm: Any) -> None:
        def named(name: str) -> Any:
            return getattr(jvm, f"org.apache.logging.log4j.{name}")

        self.LogManager = named("LogManager")
        self.Level = named("Level")
        self.PatternLayout = named("core.layout.PatternLayout")
        self.FileAppender = named("core.appender.FileAppender")
        self.LoggerConfig = named("core.config.LoggerConfig")
        self.Configurator = named("core.config.Configurator")
        self.ThresholdFilter = named("core.filter.ThresholdFilter")
        self.FilterResult = named("core.Filter$Result")


@functools.lru_cache(maxsize=1)  # one JVM behind every session of the process
def _log4j_classes(jvm: Any) -> _Log4j:
    return _Log4j(jvm)


def _log4j(spark: SparkSession) -> _Log4j:
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a running session
    return _log4j_classes(jvm)


def _jvm_text(exc: BaseException) -> str:
    """The exception's message and its JVM stack (PySpark keeps it without a public accessor)."""
    stack = getattr(exc, "_stackTrace", None)
    return f"{exc}\n{stack}" if stack else "".join(traceback.format_exception(exc))
