"""Heartbeat-only batches (``processing_time``, no new input) cost no Spark job, and change nothing else.

Such a batch holds only the 1-row/s heartbeat: no data source's offset moved since the previous
batch. The engine still sees it (the watermark may move by idleness or processing time), but the
batch's plan and job are skipped. Spark's status tracker counts the jobs the query ran (they run
in the query's job group): a heartbeat-only batch adds none, a batch with a new file adds some,
and the results equal those of counting the rows by hand.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq

from ematix_dagster.spark.runner import PipelineRunner
from tests.dagster_support import small_spec

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SCHEMA = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))])
IDLE_BATCHES = 3


def rows(*items: tuple[int, float]) -> list[dict]:
    return [{"user_id": u, "amount": 1.0, "ts": T0 + timedelta(seconds=s)} for u, s in items]


FILE_A = rows((1, 5), (2, 12), (1, 20), (3, 47))  # window [0 s, 60 s): user 1 twice, 2 and 3 once
FILE_B = rows((2, 130), (3, 140))  # moves the watermark past 60 s: the first window is emitted


def test_heartbeat_only_batches_run_no_spark_job(spark, tmp_path, batch_files):
    files = batch_files("in")
    spec = small_spec(tmp_path, "heartbeats", trigger="processing_time", trigger_interval_ms=250)
    runner = PipelineRunner(spec, spark=spark, progress=lambda line: None)
    tracker = spark.sparkContext.statusTracker()
    files.write(FILE_A, SCHEMA)
    seen: list[tuple[int, int]] = []  # (rows in, the query's jobs so far) per batch
    rows_in = idle_since_b = 0
    for report in runner.events():
        seen.append((report.rows_in, len(tracker.getJobIdsForGroup(str(runner.query.runId)))))
        rows_in += report.rows_in
        if len(seen) == 1 + IDLE_BATCHES:
            files.write(FILE_B, SCHEMA)
        if rows_in == len(FILE_A) + len(FILE_B) and report.rows_in == 0:
            idle_since_b += 1
            if idle_since_b == IDLE_BATCHES:
                runner.request_stop()
    data = [i for i, (r, _) in enumerate(seen) if r]
    idle = [i for i, (r, _) in enumerate(seen) if not r and i > 0]
    assert len(data) == 2 and len(idle) >= 2 * IDLE_BATCHES - 1, seen
    assert all(seen[i][1] > seen[i - 1][1] for i in data if i > 0), seen  # a batch with a file runs jobs
    assert all(seen[i][1] == seen[i - 1][1] for i in idle), seen  # a heartbeat-only one runs none
    out = pq.read_table(tmp_path / "out").to_pylist()
    emitted = sorted((r["user_id"], r["clicks"]) for r in out if r["window_start"] == T0)
    assert emitted == [(1, 2), (2, 1), (3, 1)]
