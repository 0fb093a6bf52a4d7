"""``QuietFailures`` on the shared session: Spark's streaming loggers off for a failure the engine explains,
back as they were afterwards; untouched for one it does not; the report file without passwords."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pytest

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.spark.failures.quiet import ROUTED, SPARK_LOGGERS, QuietFailures


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


def test_a_query_s_failure_reports_go_to_the_run_s_file(spark, tmp_path, monkeypatch, capsys):
    """Routed while the query runs: a failure report of Spark's stream thread or of a task lands in the
    run's file (named on a classified error); without one, the file comes back on the terminal."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    jvm = spark.sparkContext._jvm
    stream = jvm.org.apache.logging.log4j.LogManager.getLogger(f"{ROUTED[0][0]}.runtime.MicroBatchExecution")
    tasks = jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.spark.scheduler.TaskSetManager")
    quiet = QuietFailures("p")
    quiet.route(spark)
    assert quiet.path is not None and Path(quiet.path).parent == tmp_path
    stream.error("Query p terminated with error: postgresql://app:Zq9-hunter2@db/x")
    tasks.warn("Lost task 0.0 in stage 4.0")
    error = StateCapExceeded("cap hit")
    assert quiet.named(error, RuntimeError("the query failed")).stack_file == quiet.path
    quiet.restore()
    text = Path(error.stack_file).read_text()
    assert "ERROR MicroBatchExecution: Query p terminated" in text and "WARN TaskSetManager: Lost task" in text
    assert "hunter2" not in text and "StateCapExceeded: cap hit" in text
    assert capsys.readouterr().err == ""
    config = jvm.org.apache.logging.log4j.LogManager.getContext(False).getConfiguration()
    left = [(n, config.getLoggerConfig(n).getName(), config.getLoggerConfig(n).isAdditive()) for n, _ in ROUTED]
    assert all(additive or not logger for _, logger, additive in left), left

    again = QuietFailures("p")
    again.route(spark)
    tasks.warn("Lost task 1.0 in stage 5.0")
    path = again.path
    again.restore()
    assert "WARN TaskSetManager: Lost task 1.0" in capsys.readouterr().err, "no failure named it: back on the terminal"
    assert path is not None and not Path(path).exists()


def test_a_spark_error_in_a_batch_is_classified_and_names_spark_s_report(spark, tmp_path, monkeypatch):
    """A task that fails inside a batch (as a source's read does when Redis goes mid-run): the error is
    classified and names the run's file, which holds the task's failure as Spark logged it."""
    from prometheus_client import CollectorRegistry

    from ematix_dagster.errors import SparkQueryFailed
    from ematix_dagster.metrics import StreamingMetrics
    from ematix_dagster.spark.runner import PipelineRunner
    from ematix_dagster.spec import load_pipeline_str
    from tests.conftest import BatchFiles
    from tests.e2e.lateness_helpers import at, row
    from tests.pipeline_toml import windowed_pipeline_toml

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    BatchFiles(tmp_path / "in").write([row(i, "k", i, at(0, i)) for i in range(3)])
    sql = "SELECT id, k, v, page, _event_ts, _source FROM source WHERE assert_true(v < 0, 'injected') IS NULL"
    spec = load_pipeline_str(windowed_pipeline_toml("quiet_task", tmp_path, aggregations=[{"agg": "count", "as": "n"}],
                                                    extra={"transform": {"sql": sql}}))
    runner = PipelineRunner(spec, spark=spark, metrics=StreamingMetrics(CollectorRegistry()), progress=lambda _: None)
    with pytest.raises(SparkQueryFailed) as err:
        runner.run()
    assert err.value.stack_file is not None and Path(err.value.stack_file).parent == tmp_path
    report = Path(err.value.stack_file).read_text()
    assert "injected" in report and "TaskSetManager" in report, report[:3000]



def test_two_runs_in_one_jvm_share_the_routing(spark, tmp_path, monkeypatch, capsys):
    """The first run to end leaves the other routed and quiet; the last one puts every logger back."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    jvm = spark.sparkContext._jvm
    logger = f"{SPARK_LOGGERS[0]}.runtime.MicroBatchExecution"
    stream = jvm.org.apache.logging.log4j.LogManager.getLogger(logger)
    config = jvm.org.apache.logging.log4j.LogManager.getContext(False).getConfiguration()
    before = [(n, config.getLoggerConfig(n).getName(), config.getLoggerConfig(n).isAdditive()) for n, _ in ROUTED]
    first, second = QuietFailures("a"), QuietFailures("b")
    first.route(spark)
    second.route(spark)
    first.restore()
    assert capsys.readouterr().err == "", "nothing was reported while a ran"
    stream.error("Query b terminated with error: b's own report")
    error = StateCapExceeded("cap hit")
    assert second.named(error, RuntimeError("b failed")).stack_file == second.path
    second.restore()
    assert "ERROR MicroBatchExecution: Query b terminated" in Path(error.stack_file).read_text()
    after = [(n, config.getLoggerConfig(n).getName(), config.getLoggerConfig(n).isAdditive()) for n, _ in ROUTED]
    assert after == before

    level, py4j = _level(spark, logger), logging.getLogger("py4j").level
    first, second = QuietFailures("a"), QuietFailures("b")
    first.batch_failed(spark, StateCapExceeded("cap hit"))
    second.batch_failed(spark, StateCapExceeded("cap hit"))
    first.restore()
    assert _level(spark, logger) == "OFF" and logging.getLogger("py4j").level > logging.CRITICAL, "b still failing"
    second.restore()
    assert (_level(spark, logger), logging.getLogger("py4j").level) == (level, py4j)
