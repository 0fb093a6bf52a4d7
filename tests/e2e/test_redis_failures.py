"""redis_stream failures: a trimmed stream, Redis gone mid-run, a password kept out of sight.

Tests that stop Redis or set a password use a server of their own (tests/redis_server.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import tomli_w

from ematix_dagster.errors import SourceAccessDenied, SourceTrimmed, SourceUnavailable
from ematix_dagster.operations import summary as state_summary
from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spec import load_pipeline_str
from tests import oracle
from tests.e2e.lateness_helpers import at, compare_dead_letters, compare_output, oracle_params, row, run
from tests.e2e.redis_helpers import RedisFeed, redis_source
from tests.redis_server import free_port, stream_name

ROOT = Path(__file__).resolve().parent.parent.parent
WINDOW = {"kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 5_000, "group_by": ["k"],
          "max_groups_per_window": 100, "aggregations": [{"agg": "count", "as": "n"},
                                                         {"agg": "sum", "column": "v", "as": "total"}]}


def durable_spec(tmp: Path, name: str, source: dict, **run: str):
    doc = {"pipeline_name": name, "sources": [source], "transform": {"window": WINDOW},
           "target": {"kind": "parquet", "path": str(tmp / "out")},
           "dead_letter": {"kind": "parquet", "path": str(tmp / "dlq")},
           "state_store": {"kind": "sqlite", "path": str(tmp / "state.db")},
           "run": {"checkpoint_location": str(tmp / "cp"), **run}}
    return load_pipeline_str(tomli_w.dumps(doc))


def reported_in_file(error: BaseException, failure: str) -> str:
    """Spark's report of the failure, in the file the error names (kept off the terminal)."""
    path = getattr(error, "stack_file", None)
    assert path is not None, "the error names the file that holds Spark's report"
    text = Path(path).read_text()
    assert f"{failure}: " in text and "Traceback" in text and "\tat org.apache.spark" in text, text[-2000:]
    return text


def feed_rows(feed: RedisFeed, stream: str, first: int, count: int) -> None:
    for i in range(first, first + count):
        feed.json_row("clicks", stream, row(i, f"k{i % 2}", i, at(0, 4 * i)))


def test_trimmed_stream_is_terminal_unless_skipped(spark, redis_url, tmp_path):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    stream = stream_name("trim")
    feed = RedisFeed(client)
    feed_rows(feed, stream, 0, 10)
    spec = durable_spec(tmp_path, "redis_trim", redis_source("clicks", redis_url, [stream], event_time_column="ts"))
    assert run(spec, spark)[0].rows_in == 10
    state = state_summary(spec)
    offsets = (Path(spec.run.checkpoint_location) / "offsets" / str(state["last_batch_id"])).read_text()
    committed = json.loads(offsets.splitlines()[2])[stream]["id"]  # v1, the batch's metadata, then the source's
    assert state["positions"]["clicks"] == {"kind": "redis_stream", "last_entry_ids": {stream: committed}}
    assert committed == feed.rows[("clicks", stream)][-1][0], "the last entry written, read and committed"
    feed_rows(feed, stream, 10, 6)
    client.xtrim(stream, maxlen=2, approximate=False)  # 4 of the 6 new entries go before the pipeline read them
    with pytest.raises(SourceTrimmed) as err:
        run(spec, spark)
    assert err.value.terminal and "4 entries it has not read were trimmed" in str(err.value)
    assert 'on_trimmed = "skip"' in str(err.value)
    skipping = dataclasses.replace(spec, sources=(dataclasses.replace(spec.sources[0], on_trimmed="skip"),))
    assert run(skipping, spark)[0].rows_in == 2
    assert state_summary(skipping)["trimmed_entries_skipped"] == {"clicks": 4}


@pytest.mark.slow  # an outage: a Redis server of its own, stopped mid-run and started again
def test_redis_stopped_mid_run_is_transient_then_exact(spark, own_redis, tmp_path):
    server = own_redis()
    stream = stream_name("outage")
    feed = RedisFeed(server.client())
    feed_rows(feed, stream, 0, 30)
    spec = durable_spec(tmp_path, "redis_outage", redis_source("clicks", server.url, [stream], event_time_column="ts",
                                                               max_entries_per_trigger=6), end_of_input="flush")
    done: list[int] = []

    def stop_after_two(report) -> None:
        done.append(report.batch_id)
        if len(done) == 2:
            server.stop(keep_data=True)

    runner = PipelineRunner(spec, spark=spark, batch_progress=stop_after_two)
    with pytest.raises(SourceUnavailable) as err:
        runner.run()
    assert not err.value.terminal and "is unreachable" in str(err.value)
    assert f"127.0.0.1:{server.port}" in str(err.value)
    assert "ERROR" in reported_in_file(err.value, "RedisUnreachable")
    server.start()
    run(spec, spark)
    batches = feed.batches(spec.run.checkpoint_location, ["clicks"])
    expected = oracle.run(batches, oracle_params(spec))
    compare_output(spec, expected)
    compare_dead_letters(spec, expected)


def test_redis_unreachable_at_start_is_transient(spark, tmp_path):
    port = free_port()  # nothing listens there
    spec = durable_spec(tmp_path, "redis_down", redis_source("clicks", f"redis://127.0.0.1:{port}/0", ["s"]))
    with pytest.raises(SourceUnavailable) as err:
        run(spec, spark)
    assert not err.value.terminal and f"Redis at redis://127.0.0.1:{port}/0 is unreachable" in str(err.value)
    assert "ERROR MicroBatchExecution" in reported_in_file(err.value, "RedisUnreachable")


PROBE = """
import json, sys
from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spec import load_pipeline
runner = PipelineRunner(load_pipeline(sys.argv[1]))
runner.run()
print(runner.query.lastProgress.json)
print(runner.query.status, runner.query.name)
runner.query.explain(extended=True)
"""


@pytest.mark.slow
def test_password_never_in_clear(spark, own_redis, tmp_path):
    """The password of the URL is in no option Spark logs, no checkpoint file, no progress or plan,
    no error (a wrong password fails, terminal, without showing either) and no Dagster metadata."""
    password = "pw-" + os.urandom(8).hex()
    server = own_redis(password=password)
    stream = stream_name("secret")
    feed = RedisFeed(server.client())
    feed_rows(feed, stream, 0, 8)
    url = f"redis://:${{EMATIX_TEST_REDIS_PASSWORD}}@127.0.0.1:{server.port}/0"
    spec_text = tomli_w.dumps({
        "pipeline_name": "redis_secret", "sources": [redis_source("clicks", url, [stream], event_time_column="ts")],
        "transform": {"window": WINDOW}, "target": {"kind": "parquet", "path": str(tmp_path / "out")},
        "state_store": {"kind": "sqlite", "path": str(tmp_path / "state.db")},
        "run": {"checkpoint_location": str(tmp_path / "cp")}})
    toml = tmp_path / "p.toml"
    toml.write_text(spec_text)
    env = {**os.environ, "EMATIX_TEST_REDIS_PASSWORD": password, "PYTHONUNBUFFERED": "1"}
    probe = subprocess.run([sys.executable, "-c", PROBE, str(toml)], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=240)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert json.loads(probe.stdout.splitlines()[0])["sources"], "the probe printed the query's progress"
    for text in (probe.stdout, probe.stderr):
        assert password not in text
    wrong_url = f"redis://:{password[::-1]}@127.0.0.1:{server.port}/0"  # typed in: Spark redacts the url option
    wrong = durable_spec(tmp_path / "wrong", "redis_wrong", redis_source("clicks", wrong_url, [stream],
                                                                         event_time_column="ts"))
    with pytest.raises(SourceAccessDenied) as err:
        run(wrong, spark)
    assert err.value.terminal and "refused the credentials" in str(err.value)
    assert password[::-1] not in str(err.value) and password not in str(err.value)
    report = reported_in_file(err.value, "RedisRefused")
    assert password[::-1] not in report and password not in report
    for path in (tmp_path / "cp").rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path
    from ematix_dagster.dagster import EmatixPipeline, streaming_pipeline_assets
    from ematix_dagster.dagster.lineage import source_uri

    os.environ["EMATIX_TEST_REDIS_PASSWORD"] = password
    try:
        uri = source_uri(load_pipeline_str(spec_text).sources[0])
        assets = streaming_pipeline_assets([EmatixPipeline.load(toml)])
        metadata = [spec.metadata for a in assets for spec in getattr(a, "specs", [a])]
    finally:
        del os.environ["EMATIX_TEST_REDIS_PASSWORD"]
    assert uri == f"redis://127.0.0.1:{server.port}/0/{stream}"
    assert uri in str(metadata) and password not in str(metadata), "the stream's upstream asset, no password"
