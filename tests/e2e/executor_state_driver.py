"""A driver process for tests/e2e/test_executor_state_on_cluster.py: runs one pipeline twice, measuring itself.

    python -m tests.e2e.executor_state_driver PIPELINE.toml STAGED_DIR SOURCE_DIR

runs the pipeline to the end of its input (``PipelineRunner(spec).run()``, the master from
``EMATIX_SPARK_MASTER``), then moves the files of ``STAGED_DIR`` into the source's ``SOURCE_DIR`` and
runs it again on the same checkpoint, so the open groups grow between the two runs in one driver.
After each run it prints one JSON line after ``RESULT `` with what this driver holds then (its Python
RSS now and at its peak, the JVM's heap used after ``System.gc()``), what the query's last progress
says of Spark's state on the executors (``stateOperators``), and the time each batch took.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spec import load_pipeline


def proc_status_kb(field: str) -> int:
    """A ``/proc/self/status`` field in kB (``VmRSS``: resident now, ``VmHWM``: its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def jvm_heap_used_after_gc(spark: Any) -> int:
    """Bytes the driver JVM's heap holds after a full collection (asked twice: one may be partial)."""
    runtime = spark._jvm.java.lang.Runtime.getRuntime()
    for _ in range(2):
        spark._jvm.java.lang.System.gc()
        time.sleep(0.2)
    return int(runtime.totalMemory()) - int(runtime.freeMemory())


def run_and_measure(path: str) -> dict[str, Any]:
    started = time.monotonic()
    spec = load_pipeline(path)
    runner = PipelineRunner(spec)
    summary = runner.run()
    run_s = time.monotonic() - started
    assert runner.query is not None
    progress = runner.query.lastProgress or {}
    operators = [{k: op.get(k) for k in ("operatorName", "numRowsTotal", "memoryUsedBytes", "numShufflePartitions",
                                         "customMetrics")} for op in progress.get("stateOperators", [])]
    gc.collect()
    return {
        "run_s": run_s,
        "batches": summary.batches,
        "rows_in": summary.rows_in,
        "windows_emitted": summary.windows_emitted,
        "windows_left_open": summary.windows_left_open,
        "python_rss": proc_status_kb("VmRSS") * 1024,
        "python_peak_rss": proc_status_kb("VmHWM") * 1024,
        "jvm_heap_used": jvm_heap_used_after_gc(runner.spark),
        "master": runner.spark.sparkContext.master,
        "state_operators": operators,
        # the state stores' changelogs and snapshots the executors uploaded to the checkpoint
        "state_file_bytes": sum(f.stat().st_size for f in (Path(spec.run.checkpoint_location) / "state").rglob("*")
                                if f.is_file()),
        "batch_seconds": [round(r.seconds, 2) for r in summary.reports],
        "progress_ms": [p.get("durationMs") for p in runner.query.recentProgress],
    }


def main(path: str, staged: str, source: str) -> None:
    print("RESULT " + json.dumps(run_and_measure(path)), flush=True)
    for file in sorted(Path(staged).iterdir()):  # newer files: the next run's batch
        os.replace(file, Path(source) / file.name)
    print("RESULT " + json.dumps(run_and_measure(path)), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
