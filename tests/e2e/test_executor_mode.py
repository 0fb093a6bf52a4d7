"""A pipeline with ``[run] window_state = "executors"`` run through ``PipelineRunner`` and operated with the CLI
(docs/contract/window-state.md): its target, dead letters and stored counters against a pandas ground truth
(Spark's late rule: a row of batch n counts iff its window ends after the watermark in effect during batch
n - 1), then ``state``, ``state --detail``, ``check``, a second run over no new input, and a start in the
other mode refused with the way out.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ematix_dagster.cli import main
from ematix_dagster.errors import FingerprintChanged
from ematix_dagster.spec import StateStoreConfig, dump_pipeline
from tests.e2e.lateness_helpers import read_batch_dirs, run
from tests.spark.test_executor_input import TUMBLING, S, fixed_late, pipeline, watermarks

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
    assert {k: state["counters"].get(k, 0) for k in counters} == counters
    assert state["counters"]["windows_emitted"] == len(counted)
    open_keys = {(e.us - e.us % (60 * S), e.k) for e in TUMBLING if e.reason is None} - set(counted)
    open_keys -= {(e.us - e.us % (60 * S), e.k) for e in TUMBLING if e.reason is None
                  and fixed_late(e, 60, watermarks(TUMBLING, LATENESS_S, BATCHES + 1)[max(e.batch - 1, 0)])}
    assert main(["state", str(toml), "--detail"]) == 0
    detail = json.loads(capsys.readouterr().out)["spark_state"]
    starts = sorted({start for start, _ in open_keys})
    assert detail["rows"] == len(open_keys) and detail["open_windows"] == len(starts)
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
