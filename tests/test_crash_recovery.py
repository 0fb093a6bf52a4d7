"""Crash recovery with real process kills: no event lost, none counted twice.

Each pipeline runs as ``ematix-dagster run`` in its own process group. Fault points
(``EMATIX_FAULT_POINTS``) SIGKILL the whole group, driver and JVM, at three places of three
different batches: right after the target write, inside the store transaction, and after the
store commit but before Spark records the batch. The test restarts the run until it finishes,
checks that no process of a killed group survives, and compares the final Postgres target with
the pandas oracle fed with the batches Spark actually formed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import psycopg
import pytest

from tests import oracle
from tests.test_lateness_e2e import Feed, at, oracle_params, row
from ematix_dagster.spec import load_pipeline

ROOT = Path(__file__).resolve().parent.parent
KILLS = "target_write:1,store_commit:3,after_store_commit:5"


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return alive


def _run_until_done(toml: Path, fault_dir: Path) -> int:
    """Run the pipeline CLI, restarting after each kill; returns how many runs were killed."""
    env = {**os.environ, "EMATIX_FAULT_POINTS": KILLS, "EMATIX_FAULT_DIR": str(fault_dir), "PYTHONUNBUFFERED": "1"}
    kills = 0
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-m", "ematix_dagster.cli", "run", str(toml)], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("a run did not finish within 300 s")
        if proc.returncode == -signal.SIGKILL:
            kills += 1
            deadline = time.monotonic() + 10
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _group_alive(proc.pid) == [], "a process of the killed group (driver or JVM) survived"
            continue
        assert proc.returncode == 0, err[-3000:]
        return kills
    pytest.fail("the pipeline never finished")


def _pipeline(tmp: Path, name: str, dsn: str, schema: str, window: str, same_transaction: bool) -> Path:
    text = f"""
pipeline_name = "{name}"
[[sources]]
name = "a"
kind = "files"
format = "parquet"
path = "{tmp / 'in'}"
schema = "id BIGINT, k STRING, v BIGINT, page STRING, ts TIMESTAMP"
event_time_column = "ts"
max_files_per_trigger = 1
[transform.window]
{window}
group_by = ["k"]
max_groups_per_window = 1000
[[transform.window.aggregations]]
agg = "count"
as = "n"
[[transform.window.aggregations]]
agg = "sum"
column = "v"
as = "total"
[[transform.window.aggregations]]
agg = "count_distinct"
column = "page"
as = "pages"
[target]
kind = "postgres"
url = "{dsn}"
table = "{schema}.{name.replace('-', '_')}"
create_table = true
same_transaction = {'true' if same_transaction else 'false'}
[state_store]
kind = "postgres"
url = "{dsn}"
schema = "{schema}"
[run]
checkpoint_location = "{tmp / 'cp'}"
end_of_input = "flush"
"""
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


def _feed(tmp: Path, batch_files, late: bool) -> Feed:
    files = batch_files("in")
    feed = Feed()
    for b in range(8):
        rows = [row(10 * b + i, f"k{i % 3}", i + b, at(b, 10 * i), page=f"p{(i * b) % 5}") for i in range(6)]
        if late and b >= 2:
            rows.append(row(900 + b, "k1", 100, at(b - 1, 40), page="late"))  # one window back: reopened
        feed.parquet("a", files, rows)
    return feed


def _expected(feed: Feed, spec) -> dict[tuple, tuple]:
    params = oracle_params(spec)
    params = oracle.Params(**{**params.__dict__, "aggregations": (("count", None, "n"), ("sum", "v", "total"),
                                                                  ("count_distinct", "page", "pages"))})
    result = oracle.run(feed.batches(spec.run.checkpoint_location, ["a"]), params)
    final: dict[tuple, tuple] = {}
    for batch_id in sorted(result.emitted):
        for r in result.emitted[batch_id]:
            final[(r["window_start"], r["k"])] = (r["n"], r["total"], r["pages"])
    return final


def _actual(dsn: str, table: str) -> dict[tuple, tuple]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT window_start, k, n, total, pages FROM {table}").fetchall()
    return {(int(pd.Timestamp(ws).value // 1000), k): (n, total, pages) for ws, k, n, total, pages in rows}


@pytest.mark.parametrize("case", [
    pytest.param(("tumbling-drop", 'kind = "tumbling"\nduration_ms = 60_000\nlateness_ms = 5_000', False, True),
                 id="tumbling-drop-effectively-once"),
    pytest.param(("hopping-reopen", 'kind = "hopping"\nduration_ms = 120_000\nhop_ms = 60_000\n'
                  'late_data = "reopen"\nallowed_lateness_ms = 120_000', True, True), id="hopping-reopen-exactly-once"),
])
def test_kills_lose_and_duplicate_nothing(case, tmp_path, batch_files, pg_dsn, pg_schema):
    name, window, late, same_transaction = case
    feed = _feed(tmp_path, batch_files, late)
    toml = _pipeline(tmp_path, name, pg_dsn, pg_schema, window, same_transaction)
    kills = _run_until_done(toml, tmp_path / "faults")
    assert kills == 3
    assert sorted(p.name for p in (tmp_path / "faults").iterdir()) == [
        "after_store_commit-5.fired", "store_commit-3.fired", "target_write-1.fired"]
    spec = load_pipeline(toml)
    expected = _expected(feed, spec)
    assert expected, "the oracle emitted nothing: the data does not exercise the pipeline"
    assert _actual(pg_dsn, spec.target.table) == expected
