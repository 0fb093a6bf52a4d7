"""State-store leases across processes (SQLite, PostgreSQL): a lease held by another process, a killed holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ematix_dagster.errors import LeaseHeld
from state_store.contract import BatchCommit, StateStore, make_holder
from tests.state_store.contract_stores import ROOT, record

# ---- leases across processes -----------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys
    from state_store import create_store, make_holder
    kind, target, schema, pipeline = sys.argv[1:5]
    store = create_store(kind, path=target if kind == "sqlite" else None,
                         url=target if kind == "postgres" else None, schema=schema or None)
    store.open()
    holder = make_holder("child-run")
    store.acquire_lease(pipeline, holder)
    print(holder, flush=True)
    if sys.stdin.readline().strip() == "release":
        store.release_lease(pipeline)
        store.close()
        print("released", flush=True)
""")


@pytest.fixture
def child_lease(kind, tmp_path, request):
    if kind == "sqlite":
        target, schema = str(tmp_path / "state" / "state.db"), ""
    else:
        target, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
    procs: list[subprocess.Popen] = []

    def start(pipeline: str) -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, kind, target, schema, pipeline], cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        procs.append(proc)
        line = proc.stdout.readline().strip()
        assert line.startswith("host="), proc.stderr.read()
        return proc, line

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _wait_free(store: StateStore, pipeline: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while store.lease_holder(pipeline) is not None:
        assert time.monotonic() < deadline, f"the lease of {pipeline} was not freed"
        time.sleep(0.1)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])  # an in-memory store lives in one process
def test_lease_held_by_another_process(make_store, child_lease):
    store = make_store()
    proc, holder = child_lease("cross")
    assert f"pid={proc.pid}" in holder and "run=child-run" in holder
    assert store.lease_holder("cross") == holder
    with pytest.raises(LeaseHeld) as err:
        store.acquire_lease("cross", make_holder("parent"))
    assert holder in str(err.value)
    with pytest.raises(LeaseHeld, match=f"pid={proc.pid}"):
        store.reset("cross")
    with pytest.raises(LeaseHeld, match=f"pid={proc.pid}"):
        store.commit(BatchCommit(record("cross", 0)))
    proc.stdin.write("release\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "released"
    assert proc.wait(timeout=30) == 0
    assert store.lease_holder("cross") is None
    store.acquire_lease("cross", make_holder("parent"))
    assert "run=parent" in store.lease_holder("cross")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_killed_holder_frees_the_lease(make_store, child_lease):
    store = make_store()
    proc, holder = child_lease("crashy")
    assert store.lease_holder("crashy") == holder
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_free(store, "crashy")
    store.acquire_lease("crashy", make_holder("after-crash"))
    store.commit(BatchCommit(record("crashy", 0)))
    assert store.load("crashy").record.last_batch_id == 0
