"""Crash recovery with real process kills: no event lost, none counted twice.

Each pipeline runs as ``ematix-dagster run`` in its own process group. Fault points
(``EMATIX_FAULT_POINTS``) SIGKILL the whole group, driver and JVM, right after the target write
(``target_write``), inside the store transaction (``store_commit``) and after the store commit but
before Spark records the batch (``after_store_commit``). The three fixed-window series are a Latin
square: every point meets batch 0, a middle batch and the end-of-input flush exactly once over
them, and so do the two session series; the sliding series meets each once more. Each series is
one pipeline restarted with a plain ``run`` (never ``reset``) after every kill until it exits 0.
The series cover tumbling, hopping, session and sliding windows, drop and reopen (late rows in the
input), SQLite and PostgreSQL stores, effectively-once PostgreSQL and parquet targets and
exactly-once (``same_transaction``) PostgreSQL. The test checks that every fault fired, that no
process of a killed group survives, and that the final target equals the pandas oracle
(``tests/oracle.py``, the session and sliding oracles of ``tests/streaming/session_oracle.py`` and
``tests/streaming/sliding_oracle.py``) fed with the batches Spark actually formed (its ``offsets/N``
and ``sources/0/N``). A parquet target is read as docs/contract/emission.md tells readers to: per key the row
with the largest ``(batch_id, _emit_seq)``, keys whose latest row is a ``retract`` dropped.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import psycopg
import pytest

from ematix_dagster.spec import load_pipeline
from tests import oracle
from tests.e2e.lateness_helpers import Feed, at, oracle_params, read_batch_dirs, row
from tests.pipeline_toml import parquet_target, postgres_store, postgres_target, sqlite_store, windowed_pipeline_toml

ROOT = Path(__file__).resolve().parent.parent.parent
BATCHES = 5  # input files, one micro-batch each: batches 0..4, then the end-of-input flush
MIDDLE = 2
RUN_TIMEOUT_S = 240

# the window of each series: keyword arguments of windowed_pipeline_toml
TUMBLING_DROP: dict[str, Any] = {"window_kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 5_000}
HOPPING_REOPEN: dict[str, Any] = {"window_kind": "hopping", "duration_ms": 120_000, "hop_ms": 60_000,
                                  "late_data": "reopen", "allowed_lateness_ms": 120_000}
HOPPING_DROP: dict[str, Any] = {"window_kind": "hopping", "duration_ms": 120_000, "hop_ms": 60_000,
                                "lateness_ms": 10_000}
# sessions: a key's rows are 30 s apart, more than the gap (a session each); the late rows join
# emitted sessions (corrections); aggregates as the session oracle computes them
SESSION_REOPEN: dict[str, Any] = {
    "window_kind": "session", "duration_ms": None, "gap_ms": 20_000, "max_session_duration_ms": 600_000,
    "late_data": "reopen", "allowed_lateness_ms": 180_000,
    "aggregations": [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"},
                     {"agg": "count_distinct", "column": "v", "as": "pages", "mode": "exact",
                      "max_distinct_values_per_group": 100}]}

# sliding windows (D = 60 s): the late rows reach retained windows (corrections) and create windows
# behind the watermark; aggregates as the sliding oracle computes them
SLIDING_REOPEN: dict[str, Any] = {
    "window_kind": "sliding", "duration_ms": 60_000, "max_events_per_group": 1000,
    "late_data": "reopen", "allowed_lateness_ms": 180_000, "aggregations": SESSION_REOPEN["aggregations"]}


# -- running the CLI -------------------------------------------------------------------------------


def group_alive(pgid: int) -> list[int]:
    """The live (non-zombie) processes of a process group."""
    alive = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return alive


def wait_group_gone(pgid: int, timeout: float = 10.0) -> list[int]:
    """Wait for a process group to die out; returns the survivors (killed, so no test leaks them)."""
    deadline = time.monotonic() + timeout
    while (alive := group_alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive


def start_run(toml: Path, *options: str, command: str = "run", **env: str) -> subprocess.Popen:
    """``ematix-dagster run TOML`` (or ``command``, with ``options``) in a process group of its own
    (the group id is its pid)."""
    full = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    for name in ("EMATIX_FAULT_POINTS", "EMATIX_FAULT_PAUSE"):
        if not full.get(name):
            full.pop(name, None)
    return subprocess.Popen([sys.executable, "-m", "ematix_dagster.cli", command, str(toml), *options], cwd=ROOT, env=full,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = RUN_TIMEOUT_S) -> str:
    """Wait for a run; returns its stderr. A run past the timeout is killed and fails the test."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"a run did not finish within {timeout:.0f} s")
    return err


def run_until_done(toml: Path, fault_dir: Path, kills: str, max_runs: int = 6) -> int:
    """Run the pipeline, restarting after each kill until it exits 0; returns how many runs were killed."""
    killed = 0
    for _ in range(max_runs):
        proc = start_run(toml, EMATIX_FAULT_POINTS=kills, EMATIX_FAULT_DIR=str(fault_dir))
        err = finish(proc)
        if proc.returncode == -signal.SIGKILL:
            killed += 1
            assert wait_group_gone(proc.pid) == [], "a process of the killed group (driver or JVM) survived"
            continue
        assert proc.returncode == 0, err[-3000:]
        assert wait_group_gone(proc.pid) == [], "a process of the finished run survived"
        return killed
    pytest.fail(f"the pipeline never finished in {max_runs} runs")


# -- pipelines, input, oracle, target ----------------------------------------------------------------


def pipeline_toml(tmp: Path, name: str, window: dict[str, Any], target: dict[str, Any], store: dict[str, Any]) -> Path:
    """A pipeline over ``tmp/in`` (one parquet file per batch) into ``target``."""
    text = windowed_pipeline_toml(
        name, tmp, **{"distinct_mode": None, **window}, max_groups_per_window=1000,
        target=target, state_store=store, trigger="available_now", end_of_input="flush")
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


def feed(batch_files) -> Feed:
    """Batch b holds six rows in minute b and, from batch 2 on, rows two and three minutes back: late
    for some or all of their windows (dropped under drop, corrections under reopen; for sessions
    the row 35 s into a minute moves the start of k1's session at 40 s: a retraction)."""
    files = batch_files("in")
    fed = Feed()
    for b in range(BATCHES):
        rows = [row(10 * b + i, f"k{i % 3}", i + b, at(b, 10 * i), page=f"p{(i * b) % 5}") for i in range(6)]
        if b >= 2:
            rows.append(row(900 + b, "k1", 100, at(b - 2, 35), page="late"))
        if b >= 3:
            rows.append(row(950 + b, "k2", 1000, at(b - 3, 20), page="later"))
        fed.parquet("a", files, rows)
    return fed


def expected_sessions(fed: Feed, spec) -> dict[tuple, tuple]:
    """The session oracle's final target (retracted keys gone), the end-of-input flush included."""
    from tests.streaming.session_oracle import ALIASES, Oracle, Params

    w = spec.window
    sessions = Oracle(Params(gap=w.gap_ms * 1000, cap=w.max_session_duration_ms * 1000, lateness=w.lateness_ms * 1000,
                             policy="reopen", allowed=w.allowed_lateness_ms * 1000))
    corrections = retractions = 0
    for batch in fed.batches(spec.run.checkpoint_location, ["a"]):
        retracts, out = sessions.batch([((r["k"],), int(r["_event_ts"]), int(r["v"])) for r in batch.rows.to_dict("records")])
        corrections += sum(1 for kind, *_ in out if kind == "correction")
        retractions += len(retracts)
    assert corrections > 0 and retractions > 0, "the late rows must correct emitted sessions and move starts"
    sessions.batch([], watermark=10 ** 18)  # the flush: W past every session's end
    pick = [ALIASES.index(a) for a in ("n", "sum_v", "distinct_v")]
    return {(start, key[0]): tuple(values[i] for i in pick) for (start, key), (_, values) in sessions.target.items()}


def expected_sliding(fed: Feed, spec) -> dict[tuple, tuple]:
    """The sliding oracle's last emission per (window start, k), the end-of-input flush included."""
    from tests.streaming.sliding_oracle import ALIASES, Oracle, Params

    w = spec.window
    windows = Oracle(Params(duration_ms=w.duration_ms, policy="reopen", allowed_ms=w.allowed_lateness_ms))
    final: dict[tuple, tuple] = {}
    pick = [ALIASES.index(a) for a in ("n", "sum_v", "distinct_v")]
    kinds: list[str] = []
    for batch in fed.batches(spec.run.checkpoint_location, ["a"]):
        out = windows.batch([((r["k"],), int(r["_event_ts"]), int(r["v"])) for r in batch.rows.to_dict("records")])
        kinds += [kind for kind, *_ in out]
        for _, start, _, key, values in out:
            final[(start, key[0])] = tuple(values[i] for i in pick)
    for _, start, _, key, values in windows.flush():
        final[(start, key[0])] = tuple(values[i] for i in pick)
    assert "correction" in kinds and windows.stats["created_behind"] > 0, "late rows must change emitted windows"
    return final


def expected_target(fed: Feed, spec) -> dict[tuple, tuple]:
    """The oracle's last emission per (window start, k): what an upsert target must hold."""
    if spec.window.kind == "session":
        return expected_sessions(fed, spec)
    if spec.window.kind == "sliding":
        return expected_sliding(fed, spec)
    batches = fed.batches(spec.run.checkpoint_location, ["a"])
    assert len(batches) == BATCHES, "one micro-batch per file"
    result = oracle.run(batches, oracle_params(spec))
    kept = oracle.run(batches, dataclasses.replace(oracle_params(spec), end_of_input="keep"))
    assert result.windows_left_open == 0 and kept.windows_left_open > 0, "the flush must emit open windows"
    if spec.window.late_data == "reopen":
        assert result.counters["corrections"] > 0, "the late rows must reopen emitted windows"
    else:
        assert result.counters["late_rows"] > 0, "some late rows must be dropped"
    final: dict[tuple, tuple] = {}
    for batch_id in sorted(result.emitted):
        for r in result.emitted[batch_id]:
            final[(r["window_start"], r["k"])] = (r["n"], r["total"], r["pages"])
    assert final, "the oracle emitted nothing: the data does not exercise the pipeline"
    return final


def actual_target(dsn: str, table: str) -> dict[tuple, tuple]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT window_start, k, n, total, pages FROM {table}").fetchall()
    got = {(int(pd.Timestamp(ws).value // 1000), k): (n, total, pages) for ws, k, n, total, pages in rows}
    assert len(got) == len(rows), "one target row per (window start, k)"
    return got


def parquet_view(path: str) -> dict[tuple, tuple]:
    """What a reader of a parquet target sees (docs/contract/targets-and-guarantees.md): the latest
    row per key by ``(batch_id, _emit_seq)``, retracts dropped. A batch directory's files (its
    ``part-0``, then the end-of-input flush's) number their rows 0, 1, ... together."""
    latest: dict[tuple, tuple] = {}
    for batch_id, rows in read_batch_dirs(path).items():
        assert [r["_emit_seq"] for r in rows] == list(range(len(rows))), "a batch numbers its rows 0, 1, ..."
        for r in rows:
            key = (r["window_start"], r["k"])
            if key not in latest or (batch_id, r["_emit_seq"]) > latest[key][0]:
                latest[key] = ((batch_id, r["_emit_seq"]), r)
    return {key: (r["n"], r["total"], r["pages"]) for key, (_, r) in latest.items() if r["_emit_kind"] != "retract"}


# -- the matrix -------------------------------------------------------------------------------------

# (window, store, target, kills): each point meets batch 0, MIDDLE and the flush once over the
# fixed-window series, and once over the session series. Targets: "parquet", "postgres"
# (effectively-once) or "postgres-exactly-once" (same_transaction).
SERIES = [
    pytest.param(TUMBLING_DROP, "sqlite", "postgres",
                 f"target_write:0,store_commit:{MIDDLE},after_store_commit:flush",
                 id="tumbling-drop-sqlite-effectively-once"),
    pytest.param(HOPPING_REOPEN, "postgres", "postgres-exactly-once",
                 f"store_commit:0,after_store_commit:{MIDDLE},target_write:flush",
                 id="hopping-reopen-postgres-exactly-once"),
    pytest.param(HOPPING_DROP, "postgres", "postgres",
                 f"after_store_commit:0,target_write:{MIDDLE},store_commit:flush",
                 id="hopping-drop-postgres-effectively-once"),
    pytest.param(SESSION_REOPEN, "postgres", "postgres-exactly-once",
                 f"after_store_commit:0,store_commit:{MIDDLE},target_write:flush",
                 id="session-reopen-postgres-exactly-once"),
    pytest.param(SESSION_REOPEN, "sqlite", "parquet",
                 f"store_commit:0,target_write:{MIDDLE},after_store_commit:flush",
                 id="session-reopen-sqlite-parquet"),
    pytest.param(SLIDING_REOPEN, "postgres", "postgres-exactly-once",
                 f"target_write:0,after_store_commit:{MIDDLE},store_commit:flush",
                 id="sliding-reopen-postgres-exactly-once"),
]


@pytest.mark.slow
@pytest.mark.parametrize("window,store_kind,target_kind,kills", SERIES)
def test_kills_lose_and_duplicate_nothing(window, store_kind, target_kind, kills, tmp_path, batch_files, pg_dsn,
                                          pg_schema):
    fed = feed(batch_files)
    store = sqlite_store(tmp_path / "state.db") if store_kind == "sqlite" else postgres_store(pg_dsn, pg_schema)
    if target_kind == "parquet":
        target = parquet_target(tmp_path / "out")
    else:
        target = postgres_target(pg_dsn, f"{pg_schema}.crash", same_transaction=target_kind == "postgres-exactly-once")
    toml = pipeline_toml(tmp_path, "crash", window, target, store)
    fault_dir = tmp_path / "faults"

    assert run_until_done(toml, fault_dir, kills) == 3
    fired = sorted(p.name for p in fault_dir.iterdir())
    assert fired == sorted(f"{p.replace(':', '-')}.fired" for p in kills.split(",")), "every fault point was reached"

    spec = load_pipeline(toml)
    if target_kind == "parquet":
        assert parquet_view(spec.target.path) == expected_target(fed, spec)
    else:
        assert actual_target(pg_dsn, spec.target.table) == expected_target(fed, spec)
