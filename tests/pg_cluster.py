"""A throwaway PostgreSQL cluster the test owns, so it can take the database away and bring it back.

``initdb`` and ``pg_ctl`` refuse to run as root, so both run through ``runuser -u postgres --``
when the tests run as root. The cluster lives in a temporary directory owned by that user,
listens on 127.0.0.1 only (its Unix socket in the same directory), on a free port from 55432
up, with trust authentication. The module-scoped fixture :func:`pg_cluster` always stops it and
removes its directory, whatever the test did to it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

BIN = Path(os.environ.get("EMATIX_PG_BIN", "/usr/lib/postgresql/15/bin"))
HOST = "127.0.0.1"
DATABASE = "test"
FIRST_PORT = 55432


def _free_port(start: int = FIRST_PORT) -> int:
    for port in range(start, start + 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port on {HOST} in {start}..{start + 199}")


class PgCluster:
    """``initdb`` once, then :meth:`start` / :meth:`stop` as often as a test likes."""

    def __init__(self) -> None:
        self.as_postgres = os.geteuid() == 0
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="ematix-pg-"))
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.running = False

    def _run(self, *args: str, timeout: float = 60) -> None:
        cmd = (["runuser", "-u", "postgres", "--"] if self.as_postgres else []) + list(args)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stdout}{proc.stderr}{log}")

    def init(self) -> None:
        self._run(str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--locale=C", "--no-sync", "--no-instructions")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nlisten_addresses = '{HOST}'\nport = {self.port}\nunix_socket_directories = '{self.root}'\n"
                       "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 16MB\n"
                       "max_connections = 40\nlogging_collector = off\n")

    def start(self) -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def dsn(self, dbname: str = DATABASE, password: str | None = None) -> str:
        secret = f":{password}" if password else ""
        return f"postgresql://postgres{secret}@{HOST}:{self.port}/{dbname}"

    @property
    def where(self) -> str:
        """How an error message names the database: host:port/db."""
        return f"{HOST}:{self.port}/{DATABASE}"

    def create_database(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.dsn("postgres"), autocommit=True, connect_timeout=3) as conn:
                    conn.execute(f'CREATE DATABASE "{DATABASE}"')
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def remove(self) -> None:
        if self.running or (self.data / "postmaster.pid").exists():
            try:
                self.stop("immediate")
            except Exception:  # noqa: BLE001 - already down: nothing to stop
                pass
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PgCluster]:
    """A running cluster with database ``test``; stopped and deleted at the end of the module."""
    cluster = PgCluster()
    try:
        cluster.init()
        cluster.start()
        cluster.create_database()
        yield cluster
    finally:
        cluster.remove()
