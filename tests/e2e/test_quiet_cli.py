"""``ematix-dagster run`` on the terminal: a classified failure of a files, rate, Redis or Kafka source
prints its one message (at most 5 lines from Spark's first report on), naming the file that holds
Spark's report; no traceback, no JVM stack, no ERROR line (docs/contract/operations.md).

The cases run one after the other through the CLI's ``main`` in one child process whose stderr is
the pipe read here (Python's and the JVM's alike): one JVM start for all of them, as the slow tests'
time allows. A line the child writes after each case closes that case's part of stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.e2e.redis_helpers import RedisFeed, redis_source
from tests.e2e.test_redis_failures import WINDOW, feed_rows
from tests.redis_server import free_port, stream_name

ROOT = Path(__file__).resolve().parent.parent.parent
#: runs each pipeline file given, as ``ematix-dagster run FILE`` does, then closes its part of stderr
DRIVER = """
import sys
from ematix_dagster.cli import main
for path in sys.argv[1:]:
    code = main(["run", path])
    print(f"=== done {path} exit {code}", file=sys.stderr, flush=True)
"""
TRANSIENT = "error (transient (retrying may help)): "
TERMINAL = "error (terminal): "


@dataclass(frozen=True)
class Case:
    name: str
    doc: dict[str, Any]
    message: str  # how the classified line starts: terminal or not
    words: tuple[str, ...]  # in the message
    reported: str  # in the file the message names (Spark's report of the failure)


def _doc(tmp: Path, name: str, source: dict[str, Any], **extra: Any) -> dict[str, Any]:
    root = tmp / name
    doc: dict[str, Any] = {
        "pipeline_name": name, "sources": [source], "transform": {"window": WINDOW},
        "target": {"kind": "parquet", "path": str(root / "out")},
        "state_store": {"kind": "sqlite", "path": str(root / "state.db")},
        "run": {"checkpoint_location": str(root / "cp")}}
    for key, value in extra.items():
        doc[key] = {**doc.get(key, {}), **value}
    return doc


def _csv_with_a_header_in_another_order(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "part-0.csv").write_text("k,id,v,page,ts\na,1,10,p,2024-01-01 00:00:05\n")


def _kafka(tmp: Path, name: str) -> dict[str, Any]:
    return _doc(tmp, name, {"name": "orders", "kind": "kafka", "bootstrap_servers": "127.0.0.1:9", "topic": "orders",
                            "format": "json", "schema": "id BIGINT, k STRING, v BIGINT, page STRING, ts TIMESTAMP",
                            "event_time_column": "ts"})


def _made_up_offsets(cp: Path) -> None:
    """A checkpoint whose batch 0 was planned at offsets no broker gave (not committed: a run replays it)."""
    (cp / "offsets").mkdir(parents=True)
    (cp / "metadata").write_text(json.dumps({"id": "00000000-0000-4000-8000-000000000052"}) + "\n")
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000, "conf": {}}
    (cp / "offsets" / "0").write_text(f"v1\n{json.dumps(meta)}\n{json.dumps({'orders': {'0': 42, '1': 7}})}")


def _cases(tmp: Path, password_port: int, outage_url: str, outage_stream: str) -> list[Case]:
    down = free_port()  # nothing listens there
    _csv_with_a_header_in_another_order(tmp / "csv_in")
    kafka_offsets = _kafka(tmp, "kafka_cli_offsets")
    _made_up_offsets(Path(kafka_offsets["run"]["checkpoint_location"]))
    no_connector = ("Spark has no Kafka connector", "spark-sql-kafka-0-10_2.13-", "nothing is downloaded at run time",
                    "spark.jars")
    rate = {"name": "ticks", "kind": "rate", "rows_per_second": 50}
    by_value = "SELECT *, CAST(value % 5 AS STRING) AS k, value AS v FROM source"
    cap_of_one = {**WINDOW, "max_groups_per_window": 1}
    return [
        Case("redis_cli_down", _doc(tmp, "redis_cli_down", redis_source("clicks", f"redis://127.0.0.1:{down}/0",
                                                                         ["s"])),
             TRANSIENT, (f"Redis at redis://127.0.0.1:{down}/0 is unreachable",), "ERROR MicroBatchExecution"),
        Case("redis_cli_wrong", _doc(tmp, "redis_cli_wrong", redis_source(
            "clicks", f"redis://:${{EMATIX_TEST_WRONG_PASSWORD}}@127.0.0.1:{password_port}/0", ["s"])),
             TERMINAL, ("refused the credentials",), "RedisRefused"),
        Case("redis_cli_outage", _doc(tmp, "redis_cli_outage", redis_source(
            "clicks", outage_url, [outage_stream], event_time_column="ts", max_entries_per_trigger=6),
            run={"trigger": "processing_time", "trigger_interval_ms": 1_000}),
             TRANSIENT, ("is unreachable",), "RedisUnreachable"),
        Case("rate_cli_cap", _doc(tmp, "rate_cli_cap", rate, transform={"sql": by_value, "window": cap_of_one},
                                  run={"trigger": "processing_time", "trigger_interval_ms": 1_000}),
             TERMINAL, ("window state cap hit", "max_groups_per_window=1"), "StateCapExceeded"),
        Case("files_cli_header", _doc(tmp, "files_cli_header", {
            "name": "a", "kind": "files", "format": "csv", "path": str(tmp / "csv_in"), "event_time_column": "ts",
            "schema": "id BIGINT, k STRING, v BIGINT, page STRING, ts TIMESTAMP"}),
             TERMINAL, ("part-0.csv",), "\tat org.apache.spark"),
        Case("kafka_cli", _kafka(tmp, "kafka_cli"), TERMINAL, no_connector, "KAFKA_DATA_SOURCE_NOT_ENABLED"),
        Case("kafka_cli_offsets", kafka_offsets, TERMINAL, no_connector, "KAFKA_DATA_SOURCE_NOT_ENABLED"),
    ]


@pytest.mark.slow
def test_every_classified_failure_prints_one_message_naming_spark_s_report(own_redis, tmp_path):
    password = "pw-" + os.urandom(8).hex()
    locked = own_redis(password=password)
    outage = own_redis()
    stream = stream_name("cli_outage")
    feed_rows(RedisFeed(outage.client()), stream, 0, 18)
    cases = _cases(tmp_path, locked.port, outage.url, stream)
    paths = []
    for case in cases:
        paths.append(tmp_path / f"{case.name}.toml")
        paths[-1].write_text(tomli_w.dumps(case.doc))
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "EMATIX_TEST_WRONG_PASSWORD": password[::-1]}
    child = subprocess.Popen([sys.executable, "-c", DRIVER, *map(str, paths)], cwd=ROOT, env=env, text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    timer = threading.Timer(420, child.kill)
    timer.start()
    lines: list[str] = []
    assert child.stderr is not None
    for line in child.stderr:
        lines.append(line.rstrip("\n"))
        if line.startswith("[redis_cli_outage] batch ") and outage.proc is not None:
            outage.stop()  # Redis gone mid-run: the next trigger's read fails
    child.wait()
    timer.cancel()
    parts = _parts(lines, paths)
    assert len(parts) == len(cases), "\n".join(lines[-60:])
    for case, (code, part) in zip(cases, parts):
        _check(case, code, part, tmp_path)
    cp = Path(cases[-1].doc["run"]["checkpoint_location"])
    assert sorted(p.name for p in (cp / "offsets").iterdir()) == ["0"] and not (cp / "commits").exists(), \
        "the made-up checkpoint is left as it was"


def _parts(lines: list[str], paths: list[Path]) -> list[tuple[int, list[str]]]:
    """Each case's exit code and lines of stderr."""
    parts, current = [], []
    for line in lines:
        if line.startswith("=== done "):
            path, code = line.removeprefix("=== done ").rsplit(" exit ", 1)
            assert path == str(paths[len(parts)])
            parts.append((int(code), current))
            current = []
        else:
            current.append(line)
    return parts


def _check(case: Case, code: int, part: list[str], tmp: Path) -> None:
    text = "\n".join(part)
    assert code == 1, (case.name, text)
    assert "Traceback" not in text and "\tat " not in text and " ERROR " not in text, (case.name, text)
    first = next(i for i, line in enumerate(part) if "error (" in line or "Exception" in line)
    assert len(part) - first <= 5 and part[-1].startswith(case.message), (case.name, text)
    message = part[-1]
    assert all(w in message for w in case.words), (case.name, message)
    path = Path(message.split("with the JVM stack: ", 1)[1].split(";", 1)[0])
    assert path.parent == tmp, message
    assert case.reported in path.read_text(), (case.name, path.read_text()[-3000:])
