"""The shared session's settings (``ematix_dagster/spark/spark_session.py``) that a user sees."""

from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException


def test_sql_that_does_not_analyse_prints_nothing_before_the_error(spark, capfd):
    """PySpark logs an analysis error with a query context as a JSON line holding the JVM stack
    before raising it; the engine reports the error itself (``ematix-dagster validate``), so the
    terminal shows nothing else. capfd sees the process's own stderr, wherever the logger's
    handler was bound when PySpark made it."""
    spark.createDataFrame([(1,)], "user_id BIGINT").createOrReplaceTempView("session_test_rows")
    with pytest.raises(AnalysisException, match="DATATYPE_MISMATCH"):
        spark.sql("SELECT user_id + INTERVAL 1 HOUR FROM session_test_rows")
    captured = capfd.readouterr()
    assert "DATATYPE_MISMATCH" not in captured.err and "Traceback" not in captured.err, captured.err
