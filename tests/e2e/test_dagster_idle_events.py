"""A processing_time pipeline asset with idle stretches, materialized by Dagster on real Spark.

Two files arrive with idle stretches around them (heartbeat-only batches, about one a second);
the run is then stopped the way Dagster stops a step on Terminate: SIGINT to the process, which
Dagster raises as ``DagsterExecutionInterruptedError`` in the step. The run's event log must hold
one event per batch with data and nothing for the heartbeat-only batches (no event, no log line),
and the terminate must read as a clean stop: no retry request, no step failure, lease released.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import datetime, timedelta, timezone

import dagster as dg
import pyarrow as pa

from ematix_dagster.dagster import (
    EmatixSparkResource,
    MetricsResource,
    StateStoreResource,
    asset_run_config,
    streaming_pipeline_asset,
)
from tests.dagster_support import small_spec

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SCHEMA = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))])
IDLE_BATCHES = 3  # heartbeat-only batches (the heartbeat ticks once a second) to wait for after each file
SUMMARY_SECONDS = 10.0


def rows(*items: tuple[int, float]) -> list[dict]:
    return [{"user_id": u, "amount": 1.0, "ts": T0 + timedelta(seconds=s)} for u, s in items]


FILE_A = rows((1, 5), (2, 12), (1, 20), (3, 47))  # window [0 s, 60 s), stays open
FILE_B = rows((2, 130), (3, 140))  # moves the watermark past 60 s: the first window is emitted


def committed(checkpoint) -> int:
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.exists() else 0


def test_heartbeat_only_batches_add_nothing_to_the_event_log(spark, tmp_path, batch_files):
    files = batch_files("in")
    spec = small_spec(tmp_path, "idle-events", trigger="processing_time", trigger_interval_ms=250)
    asset = streaming_pipeline_asset(spec)
    store = StateStoreResource(kind="sqlite", path=str(tmp_path / "state.db"))
    resources = {"spark": EmatixSparkResource(), "state_store": store, "metrics": MetricsResource(enabled=False)}
    run_config = asset_run_config(asset, throttle_seconds=0, summary_seconds=SUMMARY_SECONDS)
    checkpoint = tmp_path / "checkpoint"
    files.write(FILE_A, SCHEMA)  # batch 0

    running = threading.Event()
    driver_error: list[BaseException] = []
    signals: list[int] = []

    def drive() -> None:
        """Wait for idle stretches, add file B, wait again, then terminate (Dagster's way: SIGINT)."""
        try:
            deadline = time.monotonic() + 300
            while committed(checkpoint) < 1 + IDLE_BATCHES:
                assert time.monotonic() < deadline, "the stream did not get going"
                time.sleep(0.2)
            files.write(FILE_B, SCHEMA)
            target = committed(checkpoint) + 1 + IDLE_BATCHES
            while committed(checkpoint) < target:
                assert time.monotonic() < deadline, "the stream stalled"
                time.sleep(0.2)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            driver_error.append(exc)
        if running.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    # A stray SIGINT outside Dagster's handlers must not stop pytest itself.
    previous = signal.signal(signal.SIGINT, lambda signo, frame: signals.append(signo))
    started = time.monotonic()
    driver = threading.Thread(target=drive, daemon=True)
    try:
        with dg.DagsterInstance.ephemeral() as instance:
            running.set()
            driver.start()
            result = dg.materialize([asset], instance=instance, resources=resources, run_config=run_config,
                                    raise_on_error=False)
            running.clear()
            logs = instance.all_logs(result.run_id)
    finally:
        running.clear()
        signal.signal(signal.SIGINT, previous)
        driver.join(timeout=30)
    elapsed = time.monotonic() - started
    assert not driver_error, driver_error
    assert signals == [], "the interrupt did not reach the step"
    assert result.success

    types = [e.dagster_event.event_type_value for e in logs if e.dagster_event is not None]
    messages = [e.user_message for e in logs if e.dagster_event is None]  # context.log lines
    assert "STEP_UP_FOR_RETRY" not in types and "STEP_FAILURE" not in types, types
    assert not any("requested a retry" in (e.message or "") for e in logs)

    # one event per batch with data (throttle 0), then the final result; none for heartbeat-only batches
    observations = [e.dagster_event.event_specific_data.asset_observation for e in logs
                    if e.dagster_event is not None and e.dagster_event.event_type_value == "ASSET_OBSERVATION"]
    materializations = result.asset_materializations_for_node(asset.op.name)
    assert [o.metadata["batch_id"].value for o in observations] == [0]
    per_batch, final = materializations[:-1], materializations[-1].metadata
    assert len(per_batch) == 1 and per_batch[0].metadata["windows_emitted"].value == 3
    assert per_batch[0].metadata["rows_in"].value == len(FILE_B)
    run_batches = final["run_batches"].value
    assert run_batches >= 2 * (1 + IDLE_BATCHES)
    assert final["run_idle_batches"].value == run_batches - 2
    assert final["run_rows_in"].value == len(FILE_A) + len(FILE_B)
    assert final["stopped"].value == "terminated"

    # no log line per batch: the heartbeat-only batches appear only as counts in the summary lines
    assert not any("rows in 0" in m for m in messages), messages
    summaries = [m for m in messages if m.startswith("[idle-events] last ")]
    assert len(summaries) <= elapsed / SUMMARY_SECONDS + 1
    assert all("heartbeat-only" in m for m in summaries)
    other = [m for m in messages if m not in summaries]
    assert len(other) <= 8, other  # starting, guarantee, terminate: a fixed handful, whatever the batch count
    stop_lines = [m for m in other if "terminate requested" in m]
    assert len(stop_lines) == 1 and "stopped at a batch boundary after batch" in stop_lines[0]
    assert stop_lines[0].endswith("lease released")

    assert store.lease_holder(spec) is None
