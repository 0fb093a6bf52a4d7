"""The example code location under a real ``dagster dev``, driven through Dagster's GraphQL API.

The test starts ``dagster dev`` on 127.0.0.1 (a free port, a temporary DAGSTER_HOME, its own
process group), finds every example asset, sensor, job and schedule by name, launches the
``processing_time`` clicks pipeline over bounded input plus a closing event, waits for per-batch
materializations, terminates the run (it must reach CANCELED within 60 s), launches it again and
checks that the Postgres target equals a pandas ground truth: nothing lost, nothing counted twice.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import psutil
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
TABLE = "public.user_clicks_1min"
LOCATION = "pipelines.definitions"
SCHEMA = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("page", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC"))])
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=timezone.utc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_inputs(directory: Path) -> pd.DataFrame:
    """Six files of clicks over three minutes, then one event 10 minutes ahead that closes them."""
    directory.mkdir(parents=True)
    frames = []
    for f in range(7):
        if f < 6:
            rows = [{"user_id": i % 3, "amount": float((i * 7 + f) % 11) - 1.0, "page": f"/p{(i + f) % 4}",
                     "ts": T0 + timedelta(seconds=30 * f + 3 * i)} for i in range(8)]
        else:
            rows = [{"user_id": 99, "amount": 1.0, "page": "/close", "ts": T0 + timedelta(minutes=13)}]
        tmp, final = directory / f".f{f}.tmp", directory / f"part-{f:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp)
        os.replace(tmp, final)
        os.utime(final, (1_700_000_000 + f, 1_700_000_000 + f))
        frames.append(pd.DataFrame(rows))
    return pd.concat(frames, ignore_index=True)


def _ground_truth(events: pd.DataFrame) -> dict[tuple, tuple]:
    """Per (minute, user): clicks, amount sum, distinct pages over rows with amount >= 0.

    The closing event's own window never closes, so it is not expected in the target.
    """
    kept = events[(events["amount"] >= 0) & (events["user_id"] != 99)].copy()
    kept["start"] = kept["ts"].dt.floor("1min")
    out = {}
    for (start, user), g in kept.groupby(["start", "user_id"]):
        out[(start.to_pydatetime(), int(user))] = (len(g), round(float(g["amount"].sum()), 6), g["page"].nunique())
    return out


def _target(dsn: str) -> dict[tuple, tuple]:
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (TABLE,)).fetchone()[0]
        if exists is None:
            return {}
        rows = conn.execute(f"SELECT window_start, user_id, clicks, amount_sum, unique_pages FROM {TABLE}").fetchall()
    return {(ws, int(u)): (int(c), round(float(s), 6), int(p)) for ws, u, c, s, p in rows}


class Dagit:
    """A ``dagster dev`` process group and a GraphQL client for it."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.port = _free_port()
        self.log = open(cwd / "dagster-dev.log", "w")
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-w", str(cwd / "workspace.yaml"),
             "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        from dagster_graphql import DagsterGraphQLClient

        self.client = DagsterGraphQLClient("127.0.0.1", port_number=self.port, timeout=30)

    def query(self, text: str, variables: dict | None = None) -> dict:
        return self.client._execute(text, variables or {})

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "dagster dev exited; see dagster-dev.log"
            try:
                data = self.query("{ workspaceOrError { ... on Workspace { locationEntries { name "
                                  "locationOrLoadError { __typename } } } } }")
                entries = data["workspaceOrError"]["locationEntries"]
                if entries and entries[0]["locationOrLoadError"]["__typename"] == "RepositoryLocation":
                    return
                if entries and entries[0]["locationOrLoadError"]["__typename"] == "PythonError":
                    pytest.fail(f"the code location failed to load: {data}")
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(1)
        pytest.fail("dagster dev did not come up")

    def stop(self) -> None:
        members = [p for p in psutil.process_iter() if _pgid(p.pid) == self.proc.pid]
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # dagster dev ignores SIGTERM here (DESIGN.md §4)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        psutil.wait_procs(members, timeout=30)
        self.log.close()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _run_status(dagit: Dagit, run_id: str) -> str:
    return dagit.client.get_run_status(run_id).value


def _materializations(dagit: Dagit, run_id: str) -> list[dict]:
    data = dagit.query("""query($runId: ID!) { runOrError(runId: $runId) { ... on Run {
        eventConnection(afterCursor: null) { events { __typename ... on MaterializationEvent {
            metadataEntries { label ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue } }
        } } } } } }""", {"runId": run_id})
    events = data["runOrError"]["eventConnection"]["events"]
    return [e for e in events if e["__typename"] == "MaterializationEvent"]


def _wait(predicate, timeout: float, what: str, step: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    pytest.fail(f"timed out waiting for {what}")


def _terminate(dagit: Dagit, run_id: str) -> float:
    started = time.monotonic()
    dagit.client.terminate_run(run_id)
    _wait(lambda: _run_status(dagit, run_id) == "CANCELED", 60, "the run to reach CANCELED", step=0.5)
    return time.monotonic() - started


def test_dagster_dev_launch_terminate_relaunch(tmp_path, pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    events = _write_inputs(tmp_path / ".ematix" / "data" / "clicks")
    expected = _ground_truth(events)
    (tmp_path / "workspace.yaml").write_text(
        f"load_from:\n  - python_module:\n      module_name: {LOCATION}\n      working_directory: {tmp_path}\n")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "EMATIX_PG_URL": pg_dsn, "PYTHONPATH": str(ROOT),
           "EMATIX_STATE_PATH": str(tmp_path / ".ematix" / "state.db")}
    dagit = Dagit(tmp_path, env)
    try:
        dagit.wait_ready()
        repo = dagit.query("""{ repositoriesOrError { ... on RepositoryConnection { nodes {
            name location { name } jobs { name } sensors { name } schedules { name }
            assetNodes { assetKey { path } } } } } }""")["repositoriesOrError"]["nodes"][0]
        assert repo["location"]["name"] == LOCATION
        jobs = {j["name"] for j in repo["jobs"]}
        sensors = {s["name"] for s in repo["sensors"]}
        schedules = {s["name"] for s in repo["schedules"]}
        assets = {"/".join(a["assetKey"]["path"]) for a in repo["assetNodes"]}
        assert {"public/user_clicks_1min", "ematix/clicks-hopping-5min", "ematix/revenue-per-channel"} <= assets, assets
        assert {"clicks_per_minute_job", "clicks_hopping_5min_job", "revenue_per_channel_job",
                "ematix_state_migration_job", "ematix_validate_job", "ematix_checks_job"} <= jobs, jobs
        assert {"clicks_per_minute_keep_alive", "revenue_per_channel_keep_alive", "ematix_run_failure_sensor"} <= sensors, sensors
        assert {"clicks_hopping_5min_schedule", "ematix_state_migration_job_schedule",
                             "ematix_checks_job_schedule"} <= schedules, schedules

        run_config = {"ops": {"public__user_clicks_1min": {"config": {"throttle_seconds": 0}}}}
        first = dagit.client.submit_job_execution("clicks_per_minute_job", repository_location_name=LOCATION,
                                                  run_config=run_config)
        _wait(lambda: len(_materializations(dagit, first)) >= 2, 240, "per-batch materializations")
        labels = {e["label"] for e in _materializations(dagit, first)[0]["metadataEntries"]}
        assert {"batch_id", "rows_in", "windows_emitted", "watermark_lag_seconds"} <= labels, labels
        assert _terminate(dagit, first) < 60

        second = dagit.client.submit_job_execution("clicks_per_minute_job", repository_location_name=LOCATION,
                                                   run_config=run_config)
        _wait(lambda: _target(pg_dsn) == expected or None, 240, "the target to hold every closed window")
        _terminate(dagit, second)
        assert _target(pg_dsn) == expected
    finally:
        dagit.stop()
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if _pgid(p.pid) == dagit.proc.pid and p.status() != psutil.STATUS_ZOMBIE]
    assert leftovers == [], "run workers or JVMs outlived dagster dev"
