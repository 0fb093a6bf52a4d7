"""``classify`` on a failure Spark raises for real: a Kafka source without Spark's Kafka connector."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import tomli_w

from ematix_dagster.errors import SourceConnectorMissing
from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spec import load_pipeline_str


def test_a_kafka_source_without_the_connector_is_terminal_and_says_how_to_provide_it(spark, tmp_path, monkeypatch):
    """No spark-sql-kafka jar here (nothing is downloaded): the run stops before its query starts, terminal,
    naming the jars, where they go, and the file with Spark's report."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec = load_pipeline_str(tomli_w.dumps({
        "pipeline_name": "kafka_missing",
        "sources": [{"name": "orders", "kind": "kafka", "bootstrap_servers": "127.0.0.1:9", "topic": "orders"}],
        "transform": {"window": {"kind": "tumbling", "duration_ms": 60_000, "group_by": [], "max_groups_per_window": 1,
                                 "aggregations": [{"agg": "count", "as": "n"}]}},
        "target": {"kind": "parquet", "path": str(tmp_path / "out")},
        "state_store": {"kind": "sqlite", "path": str(tmp_path / "state.db")},
        "run": {"checkpoint_location": str(tmp_path / "cp")}}))
    with pytest.raises(SourceConnectorMissing) as err:
        PipelineRunner(spec, spark=spark, progress=lambda _: None).run()
    message = str(err.value)
    assert err.value.terminal and message.startswith("pipeline kafka_missing: Spark has no Kafka connector")
    assert f"spark-sql-kafka-0-10_2.13-{spark.version}.jar" in message and "kafka-clients" in message
    assert "nothing is downloaded at run time" in message and "spark.jars" in message
    assert err.value.stack_file is not None and Path(err.value.stack_file).parent == tmp_path
    report = Path(err.value.stack_file).read_text()
    assert "KAFKA_DATA_SOURCE_NOT_ENABLED" in report and "\tat org.apache.spark" in report, report[-2000:]
