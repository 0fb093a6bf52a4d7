"""``QuietFailures`` on the shared session: Spark's streaming loggers off for a failure the engine explains,
back as they were afterwards; untouched for one it does not; the report file without passwords."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.spark.failures.quiet import SPARK_LOGGERS, QuietFailures


def _level(spark, name: str) -> str:
    jvm = spark.sparkContext._jvm
    return str(jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel())


def test_an_explained_failure_quiets_the_loggers_until_restored(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the report goes (TMPDIR, read once)
    logger = f"{SPARK_LOGGERS[0]}.runtime.MicroBatchExecution"
    before, py4j = _level(spark, logger), logging.getLogger("py4j").level
    quiet = QuietFailures("p")
    quiet.batch_failed(spark, StateCapExceeded("cap hit"))
    assert _level(spark, logger) == "OFF" and logging.getLogger("py4j").level > logging.CRITICAL
    error = StateCapExceeded("cap hit, the store at postgresql://app:Zq9-hunter2@db/x")
    assert quiet.named(error, RuntimeError("the query failed")) is error
    assert error.stack_file is not None and Path(error.stack_file).parent == tmp_path
    text = Path(error.stack_file).read_text()
    assert "StateCapExceeded: cap hit" in text and "the query failed" in text and "hunter2" not in text
    quiet.restore()
    assert (_level(spark, logger), logging.getLogger("py4j").level) == (before, py4j)


def test_an_unexplained_failure_leaves_everything_printed(spark):
    logger = f"{SPARK_LOGGERS[0]}.runtime.MicroBatchExecution"
    before = _level(spark, logger)
    quiet = QuietFailures("p")
    quiet.batch_failed(spark, KeyError("k"))
    assert _level(spark, logger) == before
    error = StateCapExceeded("cap hit")
    assert quiet.named(error, RuntimeError("x")).stack_file is None
    disabled = QuietFailures("p", enabled=False)
    disabled.batch_failed(spark, StateCapExceeded("cap hit"))
    assert _level(spark, logger) == before
