"""Helpers for the Dagster tests: small specs and hand-built states in a real SQLite store, and a real
``dagster dev`` (process group, GraphQL client, the example clicks pipeline's input and ground truth)."""

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
from typing import Any, Callable, Mapping

import dagster as dg

from ematix_dagster.fingerprint import fingerprint, fingerprint_doc
from ematix_dagster.spec import Aggregation, PipelineSpec, Run, Source, StateStoreConfig, Target, Window
from ematix_dagster.stores import make_store
from state_store.codec import STATE_VERSION
from state_store.contract import BatchCommit, PipelineRecord, SourceProgress, make_holder
from tests.state_store.legacy_rows import write_rows


def small_spec(tmp_path: Path, name: str = "tiny-clicks", *, target: Target | None = None,
               trigger: str = "available_now", store: StateStoreConfig | None = None,
               trigger_interval_ms: int = 1_000) -> PipelineSpec:
    """A one-source tumbling pipeline whose every path lives under ``tmp_path``; a test that counts heartbeat
    batches shortens ``trigger_interval_ms`` (it waits that long for each)."""
    (tmp_path / "in").mkdir(parents=True, exist_ok=True)
    return PipelineSpec(
        pipeline_name=name,
        sources=(Source(name="clicks", kind="files", format="parquet", path=str(tmp_path / "in"),
                        schema="user_id BIGINT, amount DOUBLE, ts TIMESTAMP", event_time_column="ts",
                        max_files_per_trigger=1),),
        shape=Window(kind="tumbling", duration_ms=60_000, group_by=("user_id",), max_groups_per_window=1_000,
                           aggregations=(Aggregation(agg="count", as_="clicks"),)),
        target=target or Target(kind="parquet", path=str(tmp_path / "out")),
        state_store=store or StateStoreConfig(kind="sqlite", path=str(tmp_path / "state.db")),
        run=Run(trigger=trigger, trigger_interval_ms=trigger_interval_ms,
                checkpoint_location=str(tmp_path / "checkpoint")),
    ).validate()


def commit_state(spec: PipelineSpec, *, batch_id: int = 3, watermark_us: int | None = None,
                 counters: dict[str, int] | None = None, rows: list[tuple[int, int, bytes, bytes]] | None = None,
                 state_version: int = STATE_VERSION) -> None:
    """Write one committed batch for ``spec`` straight into its store (no Spark), with ``rows`` as the
    state rows of a store written at schema 7 (``tests.state_store.legacy_rows``)."""
    doc = fingerprint_doc(spec)
    record = PipelineRecord(
        pipeline=spec.pipeline_name, state_version=state_version, query_id="query-0", last_batch_id=batch_id,
        fingerprint=fingerprint(doc), fingerprint_doc=doc, watermark=watermark_us,
        sources={"clicks": SourceProgress(max_event_ts=watermark_us, last_arrival=watermark_us)},
        counters=dict(counters or {}), offsets={"clicks": '{"logOffset": %d}' % batch_id})
    store = make_store(spec.state_store)
    store.open()
    try:
        store.acquire_lease(spec.pipeline_name, make_holder("test setup"))
        store.commit(BatchCommit(record=record))
        if rows:
            write_rows(store, spec.pipeline_name, rows)
        store.release_lease(spec.pipeline_name)
    finally:
        store.close()


CHECK_NAMES = ("checkpoint_consistency", "idempotent_target", "late_row_ratio", "watermark_lag")


def latest_check_evaluations(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> dict[str, Any]:
    """Check name -> its latest finished evaluation, as Dagster stores it (in a run or runless)."""
    keys = [dg.AssetCheckKey(asset_key, name) for name in CHECK_NAMES]
    out = {}
    for key, record in instance.event_log_storage.get_latest_asset_check_execution_by_key(keys).items():
        data = record.event.dagster_event.event_specific_data if record.event and record.event.dagster_event else None
        if isinstance(data, dg.AssetCheckEvaluation):
            out[key.name] = data
    return out


class HeldLease:
    """Holds a pipeline's lease from another store object (as a run outside Dagster would)."""

    def __init__(self, spec: PipelineSpec, label: str = "cli run") -> None:
        self.spec = spec
        self.store = make_store(spec.state_store)
        self.label = label

    def __enter__(self) -> "HeldLease":
        self.store.open()
        self.store.acquire_lease(self.spec.pipeline_name, make_holder(self.label))
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()


# -- a real ``dagster dev`` driven through GraphQL ---------------------------------------------------
# Shared by tests/e2e/test_dagster_graphql.py and tests/e2e/test_dagster_crash_restart.py.


ROOT = Path(__file__).resolve().parent.parent
CLICKS_TABLE = "public.user_clicks_1min"
CLICKS_PIPELINE = "clicks-per-minute"
CLICKS_JOB = "clicks_per_minute_job"
CLICKS_SENSOR = "clicks_per_minute_keep_alive"
CLICKS_OP = "public__user_clicks_1min"
CLICKS_POOL = "ematix-clicks-per-minute"
LOCATION = "pipelines.definitions"
CLICKS_T0 = datetime(2025, 3, 1, 9, 0, tzinfo=timezone.utc)
CLOSING_TS = datetime(2025, 3, 2, 0, 1, tzinfo=timezone.utc)  # the stream then has passed all of 2025-03-01


def clicks_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("page", pa.string()),
                      ("ts", pa.timestamp("us", tz="UTC"))])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_click_file(directory: Path, f: int, rows: list[dict] | None = None) -> Any:
    """Click file ``f`` (0-5: eight clicks 30 s apart per file; 6: one event a minute into the next
    day, which closes every window and completes the day for a backfill; later ones: ``rows``) written atomically with mtime order = file order;
    returns its rows."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    if rows is None and f < 6:
        rows = [{"user_id": i % 3, "amount": float((i * 7 + f) % 11) - 1.0, "page": f"/p{(i + f) % 4}",
                 "ts": CLICKS_T0 + timedelta(seconds=30 * f + 3 * i)} for i in range(8)]
    elif rows is None:
        rows = [{"user_id": 99, "amount": 1.0, "page": "/close", "ts": CLOSING_TS}]
    tmp, final = directory / f".f{f}.tmp", directory / f"part-{f:03d}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=clicks_schema()), tmp)
    os.replace(tmp, final)
    os.utime(final, (1_700_000_000 + f, 1_700_000_000 + f))
    return pd.DataFrame(rows)


def late_clicks() -> list[dict]:
    """Eight clicks of the first minute: dropped as late once the closing event has passed."""
    return [{"user_id": i % 3, "amount": 1.0, "page": "/late", "ts": CLICKS_T0 + timedelta(seconds=i)}
             for i in range(8)]


LIVE_USER = 98  # fresh clicks that bring the watermark near now (for the lag check): not in the ground truth


def live_clicks(now: datetime) -> list[dict]:
    """Four clicks of ``LIVE_USER`` in the last four seconds before ``now``."""
    return [{"user_id": LIVE_USER, "amount": 1.0, "page": "/live", "ts": now - timedelta(seconds=4 - i)}
            for i in range(4)]


def write_click_inputs(directory: Path, files: range = range(7)) -> Any:
    """Six files of clicks over three minutes, then one event the next day that closes them."""
    import pandas as pd

    return pd.concat([write_click_file(directory, f) for f in files], ignore_index=True)


def clicks_ground_truth(events: Any) -> dict[tuple, tuple]:
    """Per (minute, user): clicks, amount sum, distinct pages over rows with amount >= 0.

    The closing event's own window never closes, so it is not expected in the target.
    """
    kept = events[(events["amount"] >= 0) & (events["user_id"] != 99)].copy()
    kept["start"] = kept["ts"].dt.floor("1min")
    out = {}
    for (start, user), g in kept.groupby(["start", "user_id"]):
        out[(start.to_pydatetime(), int(user))] = (len(g), round(float(g["amount"].sum()), 6), g["page"].nunique())
    return out


def clicks_target(dsn: str) -> dict[tuple, tuple]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (CLICKS_TABLE,)).fetchone()[0]
        if exists is None:
            return {}
        rows = conn.execute(
            f"SELECT window_start, user_id, clicks, amount_sum, unique_pages FROM {CLICKS_TABLE}").fetchall()
    return {(ws, int(u)): (int(c), round(float(s), 6), int(p)) for ws, u, c, s, p in rows}


def drop_clicks_target(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {CLICKS_TABLE}")


def pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def dagster_dev_env(tmp_path: Path, pg_dsn: str, *, instance_overrides: Mapping[str, Mapping[str, Any]] = (),
                    extra_env: Mapping[str, str] = ()) -> dict[str, str]:
    """A workspace in ``tmp_path`` loading the example location, a DAGSTER_HOME holding the shipped
    ``dagster.yaml`` (with ``instance_overrides`` merged into its top-level sections), and the environment."""
    import yaml

    (tmp_path / "workspace.yaml").write_text(
        f"load_from:\n  - python_module:\n      module_name: {LOCATION}\n      working_directory: {tmp_path}\n")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    if instance_overrides:
        config = yaml.safe_load((home / "dagster.yaml").read_text())
        for section, values in dict(instance_overrides).items():
            config.setdefault(section, {}).update(values)
        (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    # the checks schedule (on by default) stays off: a tick would add runless evaluations at any moment
    return {**os.environ, "DAGSTER_HOME": str(home), "EMATIX_PG_URL": pg_dsn, "PYTHONPATH": str(ROOT),
            "EMATIX_CHECKS_SCHEDULE": "0",
            "EMATIX_STATE_PATH": str(tmp_path / ".ematix" / "state.db"), **dict(extra_env)}


class Dagit:
    """A ``dagster dev`` process group and a GraphQL client for it."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.port = free_port()
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
        import pytest

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

    def repository(self) -> dict:
        return self.query("""{ repositoriesOrError { ... on RepositoryConnection { nodes {
            name location { name } jobs { name } sensors { name } schedules { name }
            assetNodes { assetKey { path } } } } } }""")["repositoriesOrError"]["nodes"][0]

    def members(self) -> list[Any]:
        """Processes still in dagster dev's process group (zombies excluded)."""
        import psutil

        found = []
        for p in psutil.process_iter():
            try:
                if pgid(p.pid) == self.proc.pid and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except psutil.NoSuchProcess:
                pass
        return found

    def stop(self) -> None:
        import psutil

        members = self.members()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # dagster dev ignores SIGTERM here
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        psutil.wait_procs(members, timeout=30)
        self.log.close()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, step: float = 1.0) -> Any:
    import pytest

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    pytest.fail(f"timed out waiting for {what}")
