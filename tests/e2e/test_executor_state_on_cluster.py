"""Window state off the driver: ``[run] window_state = "executors"`` on a real Spark standalone cluster.

Two runs of one executors-mode pipeline on one checkpoint, in one driver process
(``tests/e2e/executor_state_driver.py``) against the session's cluster (a master and two workers,
``tests/spark_cluster.py``): the first opens 100,000 groups in one tumbling window, the second, over
newer files, 1,900,000 more, so 2,000,000 are open. Every row's event time lies in the first 55
minutes of a one-hour window and the lateness is a minute, so the watermark never reaches the
window's end: nothing closes, every group stays in Spark's state. After each run the driver
measures itself (Python RSS now and at its peak, the JVM's heap used after ``System.gc()``) and the
state files in the checkpoint, and reports the query's last progress.

What must hold, 20 times the groups later:

* the driver's memory (Python RSS plus JVM heap used) stays within 20% of the small run's, and so
  does the Python process's peak RSS (no batch collects the groups to the driver, not even for a
  moment). The driver mode would hold about 83 bytes a group on the driver: +160 MB at 2,000,000;
* the executors' state grows at least 10 times: the RocksDB files under the checkpoint's ``state/``
  (the changelog of every state store version), beside the progress's ``numRowsTotal`` (exactly the
  groups) and ``memoryUsedBytes`` (reported, not asserted: RocksDB flushes its memtables to SST
  files past their size, so this one grows less than the state does).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipeline_toml import windowed_pipeline_toml
from tests.spark_cluster import SparkCluster, run_driver_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent.parent
SMALL, LARGE = 100_000, 2_000_000
FILES = 2  # one micro-batch of two files: a read task for each worker's core
T0_US = int(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp()) * 1_000_000
SPREAD_MS = 300_000  # each run's event times within five minutes; the second run's 50 minutes later
WINDOW_MS = 3_600_000
LATENESS_MS = 60_000
DRIVER_TOLERANCE = 0.20
STATE_GROWTH = 10
RUN_TIMEOUT_S = 900  # a hang guard for both runs: on a loaded two-core CI machine one batch of 1.9M groups took 120 s
MB = 1 << 20


def write_input(directory: Path, first: int, last: int, offset_ms: int) -> None:
    """Rows for keys ``k`` in [first, last), one each, with ``v`` and an event time ``offset_ms`` and up to
    five minutes into the window."""
    directory.mkdir(parents=True)
    for f in range(FILES):
        k = np.arange(first + f, last, FILES, dtype=np.int64)
        ts = T0_US + (offset_ms + k % SPREAD_MS) * 1_000
        table = pa.table({"k": k, "v": k % 1_000, "ts": pa.array(ts, pa.timestamp("us", tz="UTC"))})
        pq.write_table(table, directory / f"part-{first}-{f}.parquet")


def pipeline_toml(root: Path, name: str) -> Path:
    """Count and sum per ``k`` in one-hour tumbling windows, window state on the executors, no
    ``max_groups_per_window`` (optional in this mode); every file in the first batch."""
    path = root / "pipeline.toml"
    path.write_text(windowed_pipeline_toml(
        name, root, columns="k BIGINT, v BIGINT", max_files_per_trigger=None, duration_ms=WINDOW_MS,
        lateness_ms=LATENESS_MS, max_groups_per_window=None, window_state="executors", trigger="available_now",
        aggregations=[{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"}]))
    return path


def run_driver(cluster: SparkCluster, root: Path, name: str) -> list[dict[str, Any]]:
    """The pipeline run to the end of its input twice by a driver process of its own, the staged files
    moved into the source between the runs; what it measured after each."""
    toml = pipeline_toml(root, name)
    out = run_driver_process(cluster, [sys.executable, "-m", "tests.e2e.executor_state_driver", str(toml),
                                       str(root / "staged"), str(root / "in")], root, RUN_TIMEOUT_S,
                             PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 2, out[-3000:]
    return [json.loads(line.removeprefix("RESULT ")) for line in lines]


def driver_bytes(measured: dict[str, Any]) -> int:
    return measured["python_rss"] + measured["jvm_heap_used"]


def check_run(cluster: SparkCluster, measured: dict[str, Any], name: str, rows: int, groups: int) -> None:
    """The run read its ``rows``, closed no window and left ``groups`` rows of state on two executors."""
    assert measured["master"] == cluster.master_url
    assert measured["rows_in"] == rows
    assert measured["windows_emitted"] == 0, "the watermark never reaches the window's end"
    assert [op["numRowsTotal"] for op in measured["state_operators"]] == [groups], measured["state_operators"]
    assert measured["windows_left_open"] == groups
    apps = [a for a in cluster.applications() if a.get("name") == f"ematix-{name}"]
    assert len(apps) == 1, f"the master saw {len(apps)} applications ematix-{name}: {cluster.state()}"
    executors = [d for d in cluster.executor_dirs() if d.parent.name == apps[0]["id"]]
    assert len(executors) == 2, f"one executor on each worker: {executors}"


def test_window_state_grows_on_the_executors_not_on_the_driver(spark_cluster_fixture: SparkCluster,
                                                                tmp_path: Path) -> None:
    cluster = spark_cluster_fixture
    started = time.monotonic()
    name = "state-off-driver"
    write_input(tmp_path / "in", 0, SMALL, 0)
    write_input(tmp_path / "staged", SMALL, LARGE, 50 * 60_000)  # newer rows: the watermark moves, still open
    small, large = run_driver(cluster, tmp_path, name)
    check_run(cluster, small, name, SMALL, SMALL)
    check_run(cluster, large, name, LARGE - SMALL, LARGE)
    runs = {SMALL: small, LARGE: large}

    def memory_used(run: dict[str, Any]) -> int:
        return sum(op["memoryUsedBytes"] for op in run["state_operators"])

    driver_ratio = driver_bytes(large) / driver_bytes(small)
    peak_ratio = large["python_peak_rss"] / small["python_peak_rss"]
    state_ratio = large["state_file_bytes"] / small["state_file_bytes"]
    print(f"\nexecutors-mode state on a two-worker cluster, {SMALL:,} -> {LARGE:,} open groups "
          f"({time.monotonic() - started:.1f} s; runs {small['run_s']:.1f} s and {large['run_s']:.1f} s)")
    for groups, run in runs.items():
        print(f"  {groups:>9,} groups: driver {driver_bytes(run) / MB:.1f} MB (Python RSS {run['python_rss'] / MB:.1f} "
              f"MB, peak {run['python_peak_rss'] / MB:.1f} MB; JVM heap used {run['jvm_heap_used'] / MB:.1f} MB); "
              f"executors: checkpoint state files {run['state_file_bytes'] / MB:.2f} MB, memoryUsedBytes "
              f"{memory_used(run) / MB:.1f} MB, numRowsTotal {run['state_operators'][0]['numRowsTotal']:,}; "
              f"batches {run['batch_seconds']} s")
    print(f"  ratios: driver {driver_ratio:.3f}, Python peak RSS {peak_ratio:.3f}, state files {state_ratio:.1f}x, "
          f"memoryUsedBytes {memory_used(large) / max(memory_used(small), 1):.1f}x")

    assert abs(driver_ratio - 1) <= DRIVER_TOLERANCE, f"the driver's memory moved by {driver_ratio - 1:+.0%}"
    assert abs(peak_ratio - 1) <= DRIVER_TOLERANCE, f"the driver's peak Python RSS moved by {peak_ratio - 1:+.0%}"
    assert state_ratio >= STATE_GROWTH, (small["state_file_bytes"], large["state_file_bytes"],
                                         "the executors' state files grew less than 10x")
