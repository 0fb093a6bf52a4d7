"""The command line: exit codes, messages, and a real run stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ematix_dagster.cli import main
from ematix_dagster.spark.sources.readers import kafka_options
from ematix_dagster.spec import load_pipeline, load_pipeline_str
from tests.spec.toml_samples import DELETE, ROW_TOML, mutated_toml

ROOT = Path(__file__).resolve().parent.parent


def _demo_copy(tmp_path: Path, text: str | None = None) -> Path:
    """The demo pipeline reading an (empty) input directory of its own."""
    (tmp_path / "clicks").mkdir(exist_ok=True)
    text = text or (ROOT / "pipelines" / "demo_clicks.toml").read_text()
    path = tmp_path / "pipeline.toml"
    path.write_text(text.replace('path = "demo/clicks"', f'path = "{tmp_path / "clicks"}"'))
    return path


def test_validate_ok(spark, tmp_path, capsys):
    assert main(["validate", str(_demo_copy(tmp_path))]) == 0
    assert "ok: pipeline demo-clicks" in capsys.readouterr().out


def test_missing_input_directory_exits_2(spark, tmp_path, capsys):
    text = (ROOT / "pipelines" / "demo_clicks.toml").read_text().replace('"demo/clicks"', f'"{tmp_path}/nope"')
    path = tmp_path / "p.toml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "sources[0].path" in err and "does not exist" in err


def test_validate_config_error_exits_2(tmp_path, capsys):
    bad = (ROOT / "pipelines" / "demo_clicks.toml").read_text().replace('kind = "tumbling"', 'kind = "hopping"')
    path = tmp_path / "bad.toml"
    path.write_text(bad)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "transform.window.hop_ms" in err and "is required for hopping windows" in err and "fix:" in err


TUMBLING = 'kind = "tumbling"'
CONSOLE = '[target]\nkind = "console"'
# (id, replacements in the demo pipeline, the key named, words in the message)
EMISSION_REFUSALS = [
    ("trigger-on-sliding", {TUMBLING: 'kind = "sliding"\nmax_events_per_group = 100\nemit_trigger = "every_batch"'},
     "transform.window.emit_trigger", ("sliding windows", "watermark only")),
    ("count-zero", {TUMBLING: f"{TUMBLING}\nemit_trigger = {{ count = 0 }}"}, "transform.window.emit_trigger.count",
     ("0 must be a positive integer",)),
    ("interval-negative", {TUMBLING: f"{TUMBLING}\nemit_trigger = {{ interval_ms = -5 }}"},
     "transform.window.emit_trigger.interval_ms", ("-5 must be a positive integer",)),
    ("unknown-trigger", {TUMBLING: f'{TUMBLING}\nemit_trigger = "sometimes"'}, "transform.window.emit_trigger",
     ("unknown trigger 'sometimes'", "{ count = N }")),
    ("retractions-on-postgres", {CONSOLE: '[target]\nkind = "postgres"\nurl = "postgresql://ematix@127.0.0.1/ematix"\n'
                                          'table = "public.clicks"\nretractions = true'},
     "target.retractions", ("postgres target keeps one row per key", "parquet and console")),
]


@pytest.mark.parametrize(("changes", "key", "words"), [pytest.param(c, k, w, id=i) for i, c, k, w in EMISSION_REFUSALS])
def test_validate_refuses_emission_settings_exits_2(tmp_path, capsys, changes, key, words):
    """docs/contract/emission.md's refusals, before Spark starts."""
    text = (ROOT / "pipelines" / "demo_clicks.toml").read_text()
    for old, new in changes.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{key}: " in err and "fix:" in err and "Traceback" not in err, err
    assert all(w in err for w in words), err


def test_validate_sql_error_exits_2(spark, tmp_path, capsys):
    text = (ROOT / "pipelines" / "demo_clicks.toml").read_text().replace(
        'sql = "SELECT user_id, amount, page, _event_ts, _source FROM source WHERE amount >= 0"',
        'sql = "SELECT user_id, count(*) AS n, max(_event_ts) AS _event_ts, first(_source) AS _source FROM source GROUP BY user_id"')
    path = _demo_copy(tmp_path, text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "transform.sql" in err and "not row-wise" in err and "Traceback" not in err


def _row_pipeline(tmp_path: Path, changes: dict | None = None) -> Path:
    """The row sample (tests/spec/toml_samples.py) reading an (empty) input directory, printing to the console."""
    (tmp_path / "clicks").mkdir(exist_ok=True)
    text = mutated_toml({"sources[0].path": str(tmp_path / "clicks"), "target": {"kind": "console"},
                         "state_store.path": str(tmp_path / "state.db"), **(changes or {})}, ROW_TOML)
    path = tmp_path / "rows.toml"
    path.write_text(text)
    return path


def _where(predicate: str) -> dict:
    return {"transform.sql": f"SELECT user_id, page, _event_ts FROM source WHERE {predicate}"}


# docs/contract/row-pipelines.md: every use of WATERMARK_TS() but an upper bound in a row pipeline's top-level WHERE is
# a load-time error
WATERMARK_TS_REFUSALS = [
    ("lower-bound", _where("WATERMARK_TS() <= _event_ts + INTERVAL 1 MINUTE"), "transform.sql", ("lower bound",)),
    ("two-time-varying-conditions", _where("_event_ts <= WATERMARK_TS() AND ts + INTERVAL 1 MINUTE <= WATERMARK_TS()"),
     "transform.sql", ("2 time-varying conditions",)),
    ("in-a-subquery", _where("user_id IN (SELECT user_id FROM source WHERE _event_ts <= WATERMARK_TS())"),
     "transform.sql", ("in a subquery",)),
    ("in-the-projection", {"transform.sql": "SELECT WATERMARK_TS() AS w, user_id FROM source"}, "transform.sql",
     ("in the SELECT list",)),
    ("in-a-join", {"transform.sql": "SELECT s.user_id FROM source s JOIN source t ON s.user_id = t.user_id "
                                    "AND t._event_ts <= WATERMARK_TS()"}, "transform.sql", ("in a JOIN",)),
    ("in-memory-store", {"state_store": {"kind": "in_memory"}}, "state_store.kind", ("in_memory",)),
]


@pytest.mark.parametrize(("changes", "key", "words"),
                         [pytest.param(c, k, w, id=i) for i, c, k, w in WATERMARK_TS_REFUSALS])
def test_validate_refuses_watermark_ts_misuse_exits_2(tmp_path, capsys, changes, key, words):
    assert main(["validate", str(_row_pipeline(tmp_path, changes))]) == 2
    err = capsys.readouterr().err
    assert f"{key}: " in err and "fix:" in err and "Traceback" not in err, err
    assert all(w in err for w in words), err


def test_validate_refuses_watermark_ts_in_a_windowed_pipeline_exits_2(tmp_path, capsys):
    text = (ROOT / "pipelines" / "demo_clicks.toml").read_text().replace("WHERE amount >= 0",
                                                                         "WHERE _event_ts <= WATERMARK_TS()")
    assert main(["validate", str(_demo_copy(tmp_path, text))]) == 2
    err = capsys.readouterr().err
    assert "transform.sql: calls WATERMARK_TS() in a windowed pipeline" in err, err


def test_validate_a_row_pipeline_with_watermark_ts(spark, tmp_path, capsys):
    assert main(["validate", str(_row_pipeline(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "ok: pipeline delayed-clicks: 1 source(s), rows of [transform] sql held back until WATERMARK_TS()" in out
    assert "at most 100_000 pending), target console" in out


def test_validate_a_row_pipeline_without_watermark_ts(spark, tmp_path, capsys):
    changes = {"transform.sql": "SELECT user_id, amount * 2 AS doubled FROM source WHERE amount >= 0",
               "transform.max_buffered_rows": DELETE}
    assert main(["validate", str(_row_pipeline(tmp_path, changes))]) == 0
    assert "rows of [transform] sql as they arrive, target console" in capsys.readouterr().out


@pytest.mark.parametrize(("sql", "words"), [
    ("SELECT page, count(*) AS n FROM source GROUP BY page", ("not row-wise", "Aggregate")),
    ("SELECT nope FROM source WHERE _event_ts <= WATERMARK_TS()", ("does not run", "nope")),
], ids=["aggregate", "unknown-column"])
def test_validate_analyses_a_row_pipelines_sql_with_spark(spark, tmp_path, capsys, sql, words):
    changes = {"transform.sql": sql} if "WATERMARK_TS" in sql else {"transform.sql": sql,
                                                                     "transform.max_buffered_rows": DELETE}
    assert main(["validate", str(_row_pipeline(tmp_path, changes))]) == 2
    err = capsys.readouterr().err
    assert "transform.sql: " in err and "Traceback" not in err and all(w in err for w in words), err


def test_missing_file_exits_2(capsys):
    assert main(["validate", "/nonexistent/pipeline.toml"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_kafka_reader_options(monkeypatch):
    """The Kafka source cannot run here (no broker, no spark-sql-kafka jar): check its options."""
    monkeypatch.setenv("KAFKA_SERVERS", "127.0.0.1:9092")
    text = (ROOT / "pipelines" / "demo_clicks.toml").read_text()
    head, rest = text.split("[transform]", 1)
    head = head.split("[[sources]]")[0] + """[[sources]]
name = "events"
kind = "kafka"
bootstrap_servers = "${KAFKA_SERVERS}"
topic = "clicks"
max_offsets_per_trigger = 5000
starting_offsets = "earliest"

"""
    spec = load_pipeline_str(head + "[transform]" + rest)
    assert kafka_options(spec.resolved().sources[0]) == {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "subscribe": "clicks",
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
        "maxOffsetsPerTrigger": "5000",
    }


@pytest.mark.slow
def test_run_processing_time_stops_on_sigterm(tmp_path):
    """A processing_time run prints progress per batch and stops cleanly at a batch boundary."""
    toml = f"""
pipeline_name = "rate-demo"
[[sources]]
name = "ticks"
kind = "rate"
rows_per_second = 20
[transform.window]
kind = "tumbling"
duration_ms = 1_000
group_by = []
max_groups_per_window = 10
[[transform.window.aggregations]]
agg = "count"
as = "n"
[target]
kind = "parquet"
path = "{tmp_path / 'out'}"
[run]
trigger = "processing_time"
trigger_interval_ms = 500
checkpoint_location = "{tmp_path / 'cp'}"
[state_store]
kind = "sqlite"
path = "{tmp_path / 'state.db'}"
"""
    path = tmp_path / "rate.toml"
    path.write_text(toml)
    load_pipeline(path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ematix_dagster.cli", "run", str(path)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    deadline = time.monotonic() + 240
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if sum("[rate-demo] batch" in ln for ln in lines) >= 4:
            break
    proc.send_signal(signal.SIGTERM)
    try:
        _, rest = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("run did not stop within 120 s of SIGTERM:\n" + "".join(lines))
    text = "".join(lines) + rest
    assert proc.returncode == 0, text
    assert "SIGTERM: stopping at the next batch boundary" in text
    assert "done:" in text
    # Windows closed on the rate source's event time reached the target.
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out")
    assert table.num_rows >= 1 and min(table.column("n").to_pylist()) >= 1


# -- a failure: the classified message once, Spark's report in a file ------------------------------


@pytest.mark.slow
def test_a_terminal_error_prints_its_message_once_and_no_traceback(tmp_path):
    """A cap hit in a real run: stderr holds the one classified line, which names a file holding Spark's
    report (the JVM stack and the Python traceback); no traceback and no Java on the terminal."""
    from tests.conftest import BatchFiles
    from tests.e2e.lateness_helpers import at, row
    from tests.pipeline_toml import windowed_pipeline_toml

    BatchFiles(tmp_path / "in").write([row(i, f"k{i}", i, at(0, i)) for i in range(3)])
    path = tmp_path / "capped.toml"
    path.write_text(windowed_pipeline_toml("capped", tmp_path, max_groups_per_window=1))
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where the report file goes
    proc = subprocess.run([sys.executable, "-m", "ematix_dagster.cli", "run", str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "\tat " not in proc.stderr and " ERROR " not in proc.stderr, proc.stderr
    assert proc.stderr.count("max_groups_per_window=1") == 1, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "error (terminal): window state cap hit" in ln]
    report = Path(line.split("the JVM stack: ", 1)[1].split(";", 1)[0])
    assert report.parent == tmp_path
    text = report.read_text()
    assert "Traceback" in text and "StateCapExceeded: window state cap hit" in text
    assert "\tat org.apache.spark.sql.execution.streaming" in text


class _FailingRunner:
    """Stands in for ``PipelineRunner``: fails as a run would, recording how it was asked to report."""

    quiet: list[bool] = []
    failure: BaseException = RuntimeError("boom")

    def __init__(self, spec, quiet_failures: bool = True) -> None:
        _FailingRunner.quiet.append(quiet_failures)

    def run(self):
        raise _FailingRunner.failure


@pytest.mark.parametrize(("failure", "verbose", "traceback_shown"), [
    ("cap", False, False), ("cap", True, True), ("unclassified", False, True)])
def test_run_prints_the_traceback_only_when_verbose_or_unclassified(tmp_path, capsys, monkeypatch, failure, verbose,
                                                                    traceback_shown):
    from ematix_dagster.errors import StateCapExceeded

    cap = StateCapExceeded("window state cap hit: max_groups_per_window=1")
    cap.stack_file = str(tmp_path / "report.log")
    _FailingRunner.quiet, _FailingRunner.failure = [], cap if failure == "cap" else KeyError("k")
    monkeypatch.setattr("ematix_dagster.spark.runner.PipelineRunner", _FailingRunner)
    assert main(["run", str(_demo_copy(tmp_path)), *(["--verbose"] if verbose else [])]) == 1
    err = capsys.readouterr().err
    assert _FailingRunner.quiet == [not verbose], "--verbose leaves Spark's own log on"
    assert ("Traceback" in err) is traceback_shown, err
    if failure == "cap":
        assert err.count("error (terminal): window state cap hit") == 1
        assert f"the JVM stack: {tmp_path / 'report.log'}" in err
    else:
        assert "error (terminal): pipeline pipeline: unexpected KeyError" in err


@pytest.mark.parametrize(("predicate", "words"), [
    ("window_end + INTERVAL 1 HOUR <= WATERMARK_TS()", None),
    ("user_id + INTERVAL 1 HOUR <= WATERMARK_TS()", "emit.sql: does not run over the emitted rows"),
])
def test_validate_analyses_the_emit_predicate(spark, tmp_path, capsys, predicate, words):
    emit = f'\n[emit]\nsql = "SELECT * FROM windows WHERE {predicate}"\nmax_buffered_rows = 1000\n'
    text = (ROOT / "pipelines" / "demo_clicks.toml").read_text() + emit
    assert main(["validate", str(_demo_copy(tmp_path, text))]) == (0 if words is None else 2)
    out = capsys.readouterr()
    assert (words is None and "([emit] sql)" in out.out) or (words in out.err and "Traceback" not in out.err), out
