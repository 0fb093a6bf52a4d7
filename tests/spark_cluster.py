"""A real Spark standalone cluster for tests: one master and N workers (two by default), separate JVMs,
on 127.0.0.1.

All come from the installed PySpark (``$SPARK_HOME/bin/spark-class``, SPARK_HOME being the
``pyspark`` package directory), each in a process group of its own so that stopping the cluster
also stops the executors a worker launched. Logs go to ``<base>/logs`` (``master.log``,
``worker-1.log``, ...), the workers' application directories (``app-*/<executor id>/stderr``, executor
ids unique within an application) to ``<base>/work``.

    with spark_cluster(tmp_path) as cluster:
        env = {"EMATIX_SPARK_MASTER": cluster.master_url}
        ...
        assert cluster.applications()

or use the ``spark_cluster_fixture`` fixture: one cluster of two workers for the whole session, which
``tests/e2e/conftest.py`` offers to the e2e tests (each application has its own ``app-*`` directory).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

HOST = "127.0.0.1"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_CHARS = 4000


def spark_home() -> Path:
    """The pyspark package directory: it holds ``bin/spark-class`` and ``jars/``."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise RuntimeError(f"{home}/bin/spark-class is missing: this PySpark cannot start a standalone cluster")
    return home


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return text[-chars:] if text else "<empty>"


@dataclass
class SparkCluster:
    master_url: str  # spark://127.0.0.1:<port>
    webui_url: str  # http://127.0.0.1:<port>, the master's web UI (JSON at /json/)
    worker_webui_urls: list[str]
    base: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        return self.base / "logs"

    @property
    def work_dir(self) -> Path:
        return self.base / "work"

    def state(self, timeout: float = 3.0) -> dict:
        """The master's status document (``/json/``): workers, active and completed applications."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=timeout) as resp:
            return json.load(resp)

    def applications(self) -> list[dict]:
        """Every application the master has seen, running or completed."""
        state = self.state()
        return list(state.get("activeapps", [])) + list(state.get("completedapps", []))

    def executor_dirs(self) -> list[Path]:
        """``work/app-*/<executor id>`` directories the workers made for executors they launched."""
        return sorted(p for p in self.work_dir.glob("app-*/*") if p.is_dir())

    def logs(self) -> str:
        """The tail of every JVM's log, for failure messages."""
        parts = [f"--- {p.name} ---\n{_tail(p)}" for p in sorted(self.log_dir.glob("*.log"))]
        return "\n".join(parts)

    def alive_workers(self) -> int:
        state = self.state()
        alive = sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")
        return min(alive, int(state.get("aliveworkers", alive)))


def run_driver_process(cluster: SparkCluster, argv: list[str], cwd: Path, timeout_s: float,
                       **env: str) -> str:
    """Run ``argv`` (a driver: the CLI, or a script running a pipeline) against ``cluster`` in a
    process group of its own and return its output; a run past ``timeout_s`` or one that fails
    fails the test with its output's tail and the cluster's logs. ``env`` adds to the driver's."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "EMATIX_SPARK_MASTER": cluster.master_url,
                   "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                   "SPARK_LOCAL_IP": HOST, **env}
    for name in ("EMATIX_FAULT_POINTS", "EMATIX_FAULT_PAUSE", "SPARK_HOME", "PYSPARK_SUBMIT_ARGS"):
        environment.pop(name, None)
    proc = subprocess.Popen(argv, cwd=cwd, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{argv[-1]}: the run did not finish within {timeout_s} s\n{out[-3000:]}\n{cluster.logs()}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's JVM, should it outlive its process
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-4000:]}\n{cluster.logs()}"
    return out


def _start(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> subprocess.Popen:
    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps the descriptor
    try:
        return subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: killpg stops it and its children
    finally:
        log.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (the worker's executors included), SIGKILL whatever is left."""
    pgid = proc.pid  # start_new_session: the group id is the leader's pid
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5.0)):
        if not _group_alive(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, or its zombie keeps the group alive
            if not _group_alive(pgid):
                break
            time.sleep(0.2)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


@contextmanager
def spark_cluster(base: Path, workers: int = 2, worker_cores: int = 1, worker_memory: str = "1g",
                  timeout: float = START_TIMEOUT_S) -> Iterator[SparkCluster]:
    """Start a master and ``workers`` workers (``worker_cores`` cores and ``worker_memory`` for
    executors each), wait until every worker is ALIVE, stop them all at the end."""
    if workers < 1:
        raise ValueError(f"a cluster needs at least one worker, not {workers}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RuntimeError("no java on PATH and no JAVA_HOME: a Spark standalone cluster needs Java 17")
    home = spark_home()
    base.mkdir(parents=True, exist_ok=True)
    for d in ("logs", "work", "conf"):
        (base / d).mkdir(exist_ok=True)
    port, webui = free_port(), free_port()
    worker_webuis = [free_port() for _ in range(workers)]
    cluster = SparkCluster(master_url=f"spark://{HOST}:{port}", webui_url=f"http://{HOST}:{webui}",
                           worker_webui_urls=[f"http://{HOST}:{p}" for p in worker_webuis], base=base)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": HOST,
        "SPARK_CONF_DIR": str(base / "conf"),  # empty: no stray spark-defaults.conf / spark-env.sh
        "SPARK_LOG_DIR": str(cluster.log_dir),
        "SPARK_WORKER_DIR": str(cluster.work_dir),
        "SPARK_DAEMON_MEMORY": "256m",  # the master and worker daemons themselves; executors get --memory
        "SPARK_NO_DAEMONIZE": "1",
    }
    spark_class = str(home / "bin" / "spark-class")
    with ExitStack() as stack:
        master = _start("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
                                   "--port", str(port), "--webui-port", str(webui)], env, cluster.log_dir)
        cluster.procs["master"] = master
        stack.callback(_stop, master)
        for i, worker_webui in enumerate(worker_webuis, start=1):
            name = f"worker-{i}"
            worker = _start(name, [spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url,
                                   "--host", HOST, "--cores", str(worker_cores), "--memory", worker_memory,
                                   "--webui-port", str(worker_webui), "--work-dir", str(cluster.work_dir)],
                            env, cluster.log_dir)
            cluster.procs[name] = worker
            stack.callback(_stop, worker)  # callbacks run last-in first-out: the workers stop first

        deadline = time.monotonic() + timeout
        last_error: object = "no answer yet"
        while True:
            for name, proc in cluster.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"the Spark {name} exited with status {proc.returncode} while starting "
                                       f"the cluster\n{cluster.logs()}")
            try:
                alive = cluster.alive_workers()
                if alive >= workers:
                    break
                last_error = f"the master answers but {alive} of {workers} workers are ALIVE"
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last_error = exc
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Spark standalone cluster did not come up within {timeout:.0f} s "
                                   f"(master {cluster.master_url}, web UI {cluster.webui_url}/json/: {last_error})\n"
                                   f"{cluster.logs()}")
            time.sleep(0.5)
        yield cluster


@pytest.fixture(scope="session")
def spark_cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A master and two workers of one core and 1 GB each, shared by the session's tests."""
    with spark_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster
