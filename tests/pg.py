"""PostgreSQL for the tests: a real local server, started when it is not running.

Tests that need PostgreSQL are never skipped: when no server can be reached or started,
:func:`ensure_postgres` raises a ``RuntimeError`` that says what was tried.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import psycopg
from psycopg import sql

HOST = "127.0.0.1"
PORT = 5432
DATABASE = "test"
START_TIMEOUT_S = 30.0

_dsn_cache: str | None = None


def _user() -> str:
    return os.environ.get("PGUSER") or "postgres"


def _dsn(dbname: str) -> str:
    return f"postgresql://{_user()}@{HOST}:{PORT}/{dbname}"


def _try_connect(dsn: str) -> Exception | None:
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable yet"
        return exc


def _server_up() -> bool:
    """True when the server accepts connections (the ``test`` database may still be missing)."""
    return _try_connect(_dsn("postgres")) is None or _try_connect(_dsn(DATABASE)) is None


def _start_server() -> str:
    cmd = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | sort -V | tail -n 1) main start"
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
    return f"`{cmd}` exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()}"


def _ensure_database() -> None:
    if _try_connect(_dsn(DATABASE)) is None:
        return
    with psycopg.connect(_dsn("postgres"), autocommit=True, connect_timeout=3) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))


def ensure_postgres() -> str:
    """A DSN (no password, trust auth) for database ``test`` on 127.0.0.1:5432."""
    global _dsn_cache
    if _dsn_cache is not None:
        return _dsn_cache
    dsn = _dsn(DATABASE)
    started = ""
    if not _server_up():
        try:
            started = _start_server()
        except Exception as exc:  # noqa: BLE001
            started = f"starting the server failed: {exc}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _server_up():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"PostgreSQL does not accept connections at {HOST}:{PORT} as user {_user()!r} "
                    f"after {START_TIMEOUT_S:.0f} s ({started}); last error: {_try_connect(dsn)}")
            time.sleep(0.3)
    _ensure_database()
    error = _try_connect(dsn)
    if error is not None:
        raise RuntimeError(f"cannot connect to {dsn}: {error}")
    _dsn_cache = dsn
    return dsn


def fresh_schema(dsn: str, prefix: str) -> str:
    """Create and return a uniquely named schema ``<prefix>_<random>``; the caller drops it."""
    clean = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in prefix.lower())[:40] or "t"
    name = f"{clean}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    return name


def drop_schema(dsn: str, name: str) -> None:
    """Drop a schema made by :func:`fresh_schema` and everything in it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
