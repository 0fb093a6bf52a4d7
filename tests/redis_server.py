"""Redis servers for tests: the machine's, or one a test starts (and may stop) on a free port.

Tests that only read and write streams share the machine's server (``127.0.0.1:6379`` when it
answers PING) and keep apart by unique stream names (:func:`stream_name`). A test that stops Redis
or sets a password starts its own :class:`OwnRedis` and never touches the machine's.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import redis

MACHINE_URL = "redis://127.0.0.1:6379/0"
SERVER_BINARY = "/usr/bin/redis-server"


def answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.ConnectionError, redis.TimeoutError):
        return False


def stream_name(label: str) -> str:
    return f"ematix-test-{label}-{uuid.uuid4().hex[:10]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnRedis:
    """A ``redis-server`` of the test's own (no persistence) that it may stop and start again on
    the same port; ``password`` sets ``requirepass``."""

    def __init__(self, password: str | None = None) -> None:
        binary = shutil.which("redis-server") or SERVER_BINARY
        self.binary = binary
        self.port = free_port()
        self.password = password
        self.directory = Path(tempfile.mkdtemp(prefix="ematix-redis-"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)

    def start(self) -> OwnRedis:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.directory)]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not answers(self.url):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self, keep_data: bool = False) -> None:
        """Stop the server; ``keep_data`` saves its streams first, for the next :meth:`start` to load."""
        if self.proc is not None:
            if keep_data:
                self.client().save()
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
