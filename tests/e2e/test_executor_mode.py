"""A pipeline with ``[run] window_state = "executors"`` run through ``PipelineRunner`` and operated with the CLI
(docs/contract/window-state.md): its target, dead letters and stored counters against a pandas ground truth
(Spark's late rule: a row of batch n counts iff its window ends after the watermark in effect during batch
n - 1), then ``state``, ``state --detail``, ``check``, a second run over no new input, and a start in the
other mode refused with the way out.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

from ematix_dagster.cli import main
from ematix_dagster.errors import FingerprintChanged
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.batch.batch_report import BatchReport
from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spec import StateStoreConfig, dump_pipeline
from tests.conftest import BatchFiles
from tests.e2e.lateness_helpers import files_source, make_spec, read_batch_dirs, run, us
from tests.spark.test_executor_input import DDL, SCHEMA, T0, TUMBLING, S, fixed_late, pipeline, watermarks

pytestmark = pytest.mark.slow  # one executors-mode run, a second over no input, Spark's state read once

BATCHES = 4
LATENESS_S = 10


def truth() -> tuple[dict[tuple[int, str], int], dict[str, int], list[tuple[str, str]]]:
    """(count per written window and key, the stored counters expected, the dead letters (source, reason))."""
    marks = watermarks(TUMBLING, LATENESS_S, BATCHES + 1)  # the run's trailing no-data batch closes the last ones
    counted: dict[tuple[int, str], int] = {}
    late = 0
    for e in TUMBLING:
        if e.reason is not None:
            continue
        if fixed_late(e, 60, marks[max(e.batch - 1, 0)]):
            late += 1
            continue
        start = e.us - e.us % (60 * S)
        if start + 60 * S <= marks[-1] * 1000:  # written once the final watermark reaches its end
            counted[(start, e.k)] = counted.get((start, e.k), 0) + 1
    counters = {"late_rows_dropped": late, "filtered_rows:where": sum(e.reason == "filtered" for e in TUMBLING)}
    for name in ("a", "b"):
        mine = [e for e in TUMBLING if e.source == name]
        counters[f"rows_consumed:{name}"] = len(mine)
        counters[f"invalid_event_time_rows:{name}"] = sum(e.reason == "invalid_event_time" for e in mine)
        counters[f"future_rows:{name}"] = sum(e.reason == "future" for e in mine)
    letters = sorted((e.source, e.reason) for e in TUMBLING if e.reason not in (None, "filtered"))
    for reason in {r for _, r in letters}:
        counters[f"dead_letter_rows:{reason}"] = sum(r == reason for _, r in letters)
    return counted, counters, letters


def test_an_executors_pipeline_is_exact_and_operated_like_a_driver_one(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = pipeline(tmp_path, TUMBLING, {"kind": "tumbling", "duration_ms": 60_000, "lateness_ms": LATENESS_S * 1000},
                    ("a", "b"))
    spec = replace(spec, run=replace(spec.run, window_state="executors"),
                   state_store=StateStoreConfig(kind="sqlite", path=str(tmp_path / "state.db")))
    toml = tmp_path / "pipeline.toml"
    toml.write_text(dump_pipeline(spec))
    counted, counters, letters = truth()
    assert counters["late_rows_dropped"] == 2 and len(letters) == 4

    summary, _ = run(spec, spark)
    rows = [row for batch in read_batch_dirs(spec.target.path).values() for row in batch]
    assert {(row["window_start"], row["k"]): row["n"] for row in rows} == counted
    assert len(rows) == len(counted), "every window written once"
    dead = [row for batch in read_batch_dirs(spec.dead_letter.path).values() for row in batch]
    assert sorted((row["_source"], row["_reason"]) for row in dead) == letters
    assert summary.rows_in == len(TUMBLING)

    assert main(["validate", str(toml)]) == 0
    warned = capsys.readouterr().err
    assert "transform.window.late_data Spark judges a batch's rows" in warned
    assert main(["state", str(toml)]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["window_state"] == "executors"
    assert state["output_watermark"] == state["watermark"] is not None  # nothing is held back in executor mode
    assert {k: state["counters"].get(k, 0) for k in counters} == counters
    assert state["counters"]["windows_emitted"] == len(counted)
    open_keys = {(e.us - e.us % (60 * S), e.k) for e in TUMBLING if e.reason is None} - set(counted)
    open_keys -= {(e.us - e.us % (60 * S), e.k) for e in TUMBLING if e.reason is None
                  and fixed_late(e, 60, watermarks(TUMBLING, LATENESS_S, BATCHES + 1)[max(e.batch - 1, 0)])}
    assert main(["state", str(toml), "--detail"]) == 0
    detail = json.loads(capsys.readouterr().out)["spark_state"]
    starts = sorted({start for start, _ in open_keys})
    assert detail["rows"] == len(open_keys) and detail["open_windows"] == len(starts)
    # the store's size of Spark's state is the progress of the batch before the last: at least what is left
    assert state["groups"] >= len(open_keys) > 0 and state["bytes"] > 0
    assert list(detail["windows"].values()) == [sum(s == start for s, _ in open_keys) for start in starts]
    assert main(["check", str(toml)]) == 0
    assert "ok: checkpoint and state store agree" in capsys.readouterr().out

    again, _ = run(spec, spark)  # no new input: nothing is read or written twice
    assert again.rows_in == 0
    assert len([row for batch in read_batch_dirs(spec.target.path).values() for row in batch]) == len(rows)

    driver = replace(spec, run=replace(spec.run, window_state="driver"),
                     shape=replace(spec.window, max_groups_per_window=1000))
    with pytest.raises(FingerprintChanged) as refused:
        run(driver, spark)
    message = str(refused.value)
    assert "run.window_state: 'executors' -> 'driver'" in message
    assert "ematix-dagster reset PIPELINE.toml --yes" in message
    assert "Spark's state in the checkpoint" in message


def test_a_processing_time_run_writes_a_window_once_newer_rows_close_it(spark: SparkSession, tmp_path: Path) -> None:
    """The trigger a Dagster keep-alive run uses: the window is written, once, by a batch after the rows
    that move the watermark past its end; the run stops at a batch boundary when asked."""
    files = BatchFiles(tmp_path / "a")
    spec = make_spec(tmp_path, "ptime", [files_source("a", tmp_path / "a", schema=DDL)],
                     {"kind": "tumbling", "duration_ms": 60_000, "group_by": ["k"],
                      "aggregations": [{"agg": "count", "as": "n"}]})
    spec = replace(spec, run=replace(spec.run, window_state="executors", trigger="processing_time",
                                     trigger_interval_ms=300))
    runner = PipelineRunner(spec, spark=spark, metrics=StreamingMetrics(CollectorRegistry()),
                            progress=lambda _: None)
    reports: list[BatchReport] = []
    consumer = threading.Thread(target=lambda: reports.extend(runner.events()), daemon=True)
    consumer.start()
    row = {"id": 0, "k": "u", "v": 1, "page": "p"}
    files.write([{**row, "ts": T0 + dt.timedelta(seconds=s)} for s in (5, 30)], SCHEMA)
    files.write([{**row, "ts": T0 + dt.timedelta(seconds=130)}], SCHEMA)  # W = 130 s: [0, 60) closes
    deadline = time.monotonic() + 90
    while sum(r.counts.windows_emitted for r in list(reports)) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    runner.request_stop()
    consumer.join(timeout=60)
    assert not consumer.is_alive()
    rows = [r for batch in read_batch_dirs(spec.target.path).values() for r in batch]
    assert [(r["window_start"], r["k"], r["n"]) for r in rows] == [(us(T0), "u", 2)]
    assert sum(r.rows_in for r in reports) == 3
