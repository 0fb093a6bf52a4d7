"""A pipeline on a real Spark standalone cluster: master and two workers in JVMs of their own.

``ematix-dagster run`` runs in a subprocess with ``EMATIX_SPARK_MASTER=spark://127.0.0.1:<port>``:
the driver (and its window state, committed to PostgreSQL in the same transaction as the target
rows) is that process, the per-batch reading and partial aggregation run in the executors
the workers launched. The input is six CSV files (one micro-batch each, with late rows from batch 2 on);
the target must equal the pandas oracle (``tests/oracle.py``) fed with the batches Spark formed,
read straight from the checkpoint's ``offsets/N`` and ``sources/0/N``. No engine code is imported:
the pipeline is TOML text and the target is read with plain SQL.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from pathlib import Path

import pandas as pd
import psycopg
import pytest

from tests import oracle
from tests.conftest import BatchFiles
from tests.pipeline_toml import postgres_store, postgres_target, windowed_pipeline_toml
from tests.spark_cluster import SparkCluster, run_driver_process

ROOT = Path(__file__).resolve().parent.parent.parent
FILES = 6
ROWS_PER_FILE = 500
KEYS = 5
T0_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
STEP_MS = 45_000  # file b holds events in [T0 + b*STEP, T0 + b*STEP + 60 s)
LATE_PER_FILE = 5  # from file 2 on: rows two minutes behind, late for every window they fall in
RUN_TIMEOUT_S = 300  # a hang guard, not a speed check: CI machines differ by 4x
NAME = "cluster-tumbling"


def write_input(directory: Path) -> list[pd.DataFrame]:
    """Six CSV files with strictly increasing mtimes (the file source orders by mtime); the oracle's rows per file."""
    out = BatchFiles(directory, fmt="csv")  # part-00000.csv, ... with increasing mtimes
    rnd = random.Random(10)
    per_file = []
    next_id = 0
    for b in range(FILES):
        rows = []
        for _ in range(ROWS_PER_FILE):
            rows.append((next_id, f"k{rnd.randrange(KEYS)}", rnd.randrange(-50, 1000), f"p{rnd.randrange(12)}",
                         T0_MS + b * STEP_MS + rnd.randrange(60_000)))
            next_id += 1
        if b >= 2:
            for _ in range(LATE_PER_FILE):
                rows.append((next_id, f"k{rnd.randrange(KEYS)}", 7, "late", T0_MS + (b - 2) * STEP_MS - 60_000
                             + rnd.randrange(30_000)))
                next_id += 1
        text = "id,k,v,page,ts\n" + "".join(f"{i},{k},{v},{p},{ts}\n" for i, k, v, p, ts in rows)
        out.write(text)
        per_file.append(pd.DataFrame({
            "id": [r[0] for r in rows], "k": [r[1] for r in rows], "v": [r[2] for r in rows],
            "page": [r[3] for r in rows], "_event_ts": [r[4] * 1_000 for r in rows], "_source": "a",
        }, dtype=object))
    return per_file


def pipeline_toml(tmp: Path, dsn: str, schema: str) -> Path:
    """CSV files with epoch-millisecond times into an exactly-once Postgres target, state in Postgres."""
    path = tmp / "pipeline.toml"
    path.write_text(windowed_pipeline_toml(
        NAME, tmp, fmt="csv", ts_type="BIGINT", event_time_unit="ms", lateness_ms=5_000,
        target=postgres_target(dsn, f"{schema}.cluster_out", same_transaction=True),
        state_store=postgres_store(dsn, schema), trigger="available_now", end_of_input="flush"))
    return path


def checkpoint_batches(cp: Path, per_file: list[pd.DataFrame]) -> list[oracle.Batch]:
    """The micro-batches Spark formed: files from ``sources/0/N``, batch time from ``offsets/N``."""
    by_name = {f"part-{b:05d}.csv": df for b, df in enumerate(per_file)}
    ids = sorted(int(p.name) for p in (cp / "offsets").iterdir() if p.name.isdigit())
    assert ids == list(range(len(ids))), f"offsets/ holds batches {ids}"
    batches = []
    for batch_id in ids:
        meta = json.loads((cp / "offsets" / str(batch_id)).read_text().splitlines()[1])
        log = cp / "sources" / "0" / str(batch_id)
        entries = [json.loads(line) for line in log.read_text().splitlines()[1:] if line.strip()] if log.exists() else []
        frames = [by_name[Path(e["path"]).name] for e in entries]
        rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=per_file[0].columns, dtype=object)
        batches.append(oracle.Batch(rows, meta["batchTimestampMs"] * 1_000))
    assert sum(len(b.rows) for b in batches) == sum(len(df) for df in per_file), "every file read exactly once"
    return batches


def expected_target(batches: list[oracle.Batch]) -> tuple[dict[tuple, tuple], oracle.OracleResult]:
    params = oracle.Params(sources=("a",), duration_ms=60_000, lateness_ms=5_000, group_by=("k",),
                           aggregations=(("count", None, "n"), ("sum", "v", "total"), ("count_distinct", "page", "pages")),
                           end_of_input="flush")
    result = oracle.run(batches, params)
    final: dict[tuple, tuple] = {}
    for batch_id in sorted(result.emitted):
        for r in result.emitted[batch_id]:
            final[(r["window_start"], r["k"])] = (r["n"], r["total"], r["pages"])
    return final, result


def actual_target(dsn: str, table: str) -> dict[tuple, tuple]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT window_start, k, n, total, pages FROM {table}").fetchall()
    got = {(pd.Timestamp(ws).value // 1_000, k): (n, total, pages) for ws, k, n, total, pages in rows}
    assert len(got) == len(rows), "one target row per (window start, k)"
    return got


def cli() -> list[str]:
    script = Path(sys.executable).parent / "ematix-dagster"  # the venv's console script
    return [str(script)] if script.exists() else [sys.executable, "-m", "ematix_dagster.cli"]


@pytest.mark.slow
def test_pipeline_on_standalone_cluster(spark_cluster_fixture: SparkCluster, tmp_path, pg_dsn, pg_schema):
    cluster = spark_cluster_fixture
    per_file = write_input(tmp_path / "in")
    toml = pipeline_toml(tmp_path, pg_dsn, pg_schema)
    started = time.monotonic()
    out = run_driver_process(cluster, [*cli(), "run", str(toml)], tmp_path, RUN_TIMEOUT_S)
    rows_in = FILES * ROWS_PER_FILE + (FILES - 2) * LATE_PER_FILE
    assert re.search(rf"\[{NAME}\] done: \d+ batches, {rows_in} rows in", out), out[-2000:]
    run_s = time.monotonic() - started

    # The work ran on the cluster: the master knows the application, and the workers launched
    # executors for it that ran tasks.
    apps = [a for a in cluster.applications() if a.get("name") == f"ematix-{NAME}"]
    assert apps, f"the master never saw application ematix-{NAME}: {cluster.state()}"
    app_dirs = [d for d in cluster.executor_dirs() if d.parent.name == apps[0]["id"]]
    assert app_dirs, f"the workers launched no executor for {apps[0]['id']}: {list(cluster.work_dir.rglob('*'))}"
    stderr = "".join((d / "stderr").read_text(errors="replace") for d in app_dirs if (d / "stderr").exists())
    assert "Finished task" in stderr, f"no executor ran a task:\n{stderr[-3000:]}"

    # The target equals the oracle's last emission per (window, key).
    batches = checkpoint_batches(tmp_path / "cp", per_file)
    assert len(batches) == FILES, "one micro-batch per file"
    want, result = expected_target(batches)
    assert result.counters["late_rows"] > 0, "some late rows must be dropped"
    assert result.windows_left_open == 0
    assert len(want) > 10
    got = actual_target(pg_dsn, f"{pg_schema}.cluster_out")
    assert got == want
    # Independently of the oracle: every on-time row is counted once.
    assert sum(n for n, _, _ in got.values()) == rows_in - result.counters["late_rows"]
    print(f"cluster run: {run_s:.1f} s, {len(got)} target rows, {result.counters['late_rows']} late rows dropped")
