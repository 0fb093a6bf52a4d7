"""A real Airflow 3 for the tests: its own metadata database in the local PostgreSQL, ``airflow db migrate``,
then the API server, scheduler, dag-processor and triggerer on loopback, each in a process group of its own,
and a REST v2 client."""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import psycopg
from psycopg import sql

from tests.dagster_support import free_port, wait_for

COMPONENTS = {
    "api-server": ["api-server", "--host", "127.0.0.1", "--port", "{port}"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
}


class AirflowServer:
    """Airflow with ``bundles`` (name -> DAG folder) in a fresh database ``airflow_test_<random>``."""

    def __init__(self, home: Path, pg_dsn: str, bundles: dict[str, Path], extra_env: dict[str, str] | None = None) -> None:
        self.home = home
        self.port = free_port()
        self.database = f"airflow_test_{secrets.token_hex(4)}"
        self.admin_dsn = pg_dsn
        base = pg_dsn.rsplit("/", 1)[0]
        conn = f"{base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{self.database}"
        (home / "passwords.json").write_text(json.dumps({"admin": "admin"}))
        bundle_list = [{"name": name, "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                        "kwargs": {"path": str(path), "refresh_interval": 5}} for name, path in bundles.items()]
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(next(iter(bundles.values()))),
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundle_list),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": conn,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": conn,
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(48),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{self.port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            # a task whose supervisor died is failed (and retried) within seconds, not minutes
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "15",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "3",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            **(extra_env or {}),
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "AirflowServer":
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        self.cli("db", "migrate", timeout=240)
        for name, args in COMPONENTS.items():
            log = open(self.home / f"{name}.log", "w")
            self.procs[name] = subprocess.Popen(
                [str(Path(sys.executable).parent / "airflow"), *[a.format(port=self.port) for a in args]],
                cwd=self.home, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_for(self._healthy, 180, "the Airflow components to report healthy")
        token = self.client.post("/auth/token", json={"username": "admin", "password": "admin"})
        token.raise_for_status()
        self.client.headers["Authorization"] = f"Bearer {token.json()['access_token']}"
        return self

    def _healthy(self) -> bool:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"airflow {name} exited; see {self.home / (name + '.log')}"
        try:
            health = self.client.get("/api/v2/monitor/health").json()
        except (httpx.HTTPError, ValueError):
            return False
        return all(health.get(part, {}).get("status") == "healthy" for part in ("metadatabase", "scheduler",
                                                                               "triggerer", "dag_processor"))

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.client.close()
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.database)))

    def cli(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run([str(Path(sys.executable).parent / "airflow"), *args], cwd=self.home, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"airflow {' '.join(args)} exited {done.returncode}: {done.stdout}{done.stderr}"
        return done.stdout

    # -- REST ---------------------------------------------------------------------------------

    def get(self, path: str, **params: Any) -> Any:
        response = self.client.get(f"/api/v2{path}", params=params)
        response.raise_for_status()
        return response.json()

    def dag_ids(self) -> set[str]:
        return {d["dag_id"] for d in self.get("/dags", limit=100)["dags"]}

    def trigger(self, dag_id: str) -> str:
        response = self.client.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}})
        response.raise_for_status()
        return response.json()["dag_run_id"]

    def runs(self, dag_id: str) -> list[dict]:
        return self.get(f"/dags/{dag_id}/dagRuns", limit=100)["dag_runs"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def task(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value")["value"]

    def log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        response = self.client.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                                   params={"full_content": "true"}, headers={"Accept": "application/json"})
        response.raise_for_status()
        content = response.json().get("content", [])
        return "\n".join(json.dumps(c) if not isinstance(c, str) else c for c in content)

    def wait_run(self, dag_id: str, run_id: str, timeout: float) -> str:
        return self.wait_for(lambda: (s := self.run_state(dag_id, run_id)) in ("success", "failed") and s,
                             timeout, f"DAG run {dag_id}/{run_id} to finish")

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str, step: float = 1.0) -> Any:
        """``dagster_support.wait_for``, its failure naming where the Airflow logs are."""
        return wait_for(predicate, timeout, f"{what} (after {timeout:.0f} s; logs in {self.home})", step)
