"""State-store leases across processes (SQLite, PostgreSQL): a lease held by another process, a killed holder,
a holder fenced by a take-over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ematix_dagster.errors import LeaseHeld, LeaseLost
from state_store.contract import BatchCommit, StateStore, make_holder
from tests.state_store.contract_stores import ROOT, record

# ---- leases across processes -----------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys, time
    from state_store import create_store, make_holder
    from state_store.contract import BatchCommit
    from state_store.errors import LeaseLost
    from tests.state_store.contract_stores import record
    kind, target, schema, pipeline = sys.argv[1:5]
    store = create_store(kind, path=target if kind == "sqlite" else None,
                         url=target if kind == "postgres" else None, schema=schema or None)
    store.open()
    holder = make_holder("child-run")
    store.acquire_lease(pipeline, holder)
    print(holder, flush=True)

    def commit(n):
        try:
            store.commit(BatchCommit(record(pipeline, n)))
        except LeaseLost as exc:
            print(f"lost {n} {exc}", flush=True)
            return False
        return True

    for line in sys.stdin:
        command, *args = line.split()
        if command == "commit":  # one batch
            if commit(int(args[0])):
                print(f"committed {args[0]}", flush=True)
        elif command == "commit-until-lost":  # as a run does, then it stops (and its lock goes)
            n = int(args[0])
            while commit(n):
                n += 1
                time.sleep(0.05)
            break
        elif command == "release":
            store.release_lease(pipeline)
            store.close()
            print("released", flush=True)
            break
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


def _tell(proc: subprocess.Popen, command: str) -> str:
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_take_over_fences_the_holder_in_another_process(make_store, child_lease):
    store = make_store()
    proc, holder = child_lease("taken")
    assert _tell(proc, "commit 0") == "committed 0"
    proc.stdin.write("commit-until-lost 1\n")
    proc.stdin.flush()
    asked: list[str | None] = []
    new = make_holder("replacement")
    store.acquire_lease("taken", new, take_over=lambda h: not asked.append(h), take_over_wait_s=30)
    assert asked == [holder]
    lost = proc.stdout.readline().strip()  # the child's commit after the fence was refused, and it stopped
    assert proc.wait(timeout=30) == 0
    refused = int(lost.split()[1])
    assert lost.startswith(f"lost {refused} pipeline 'taken': the lease in ") and new in lost
    assert f"(epoch 2, this run held epoch 1); batch {refused} was not committed: this run stops" in lost
    assert store.lease_holder("taken") == new and store.lease_epoch("taken") == 2
    assert store.load("taken").record.last_batch_id == refused - 1
    store.commit(BatchCommit(record("taken", refused)))
    assert store.load("taken").record.last_batch_id == refused


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_declined_or_timed_out_take_over_across_processes(make_store, child_lease):
    store = make_store()
    proc, holder = child_lease("stuck")
    with pytest.raises(LeaseHeld) as declined:
        store.acquire_lease("stuck", make_holder("replacement"), take_over=lambda h: False)
    assert type(declined.value) is LeaseHeld and holder in str(declined.value)
    assert _tell(proc, "commit 0") == "committed 0"  # declined: nothing fenced
    with pytest.raises(LeaseHeld, match=r"fenced at epoch 2 but which did not let go within 0\.3 s") as timed_out:
        store.acquire_lease("stuck", make_holder("replacement"), take_over=lambda h: True, take_over_wait_s=0.3)
    assert not isinstance(timed_out.value, LeaseLost) and holder in str(timed_out.value)
    assert store.lease_epoch("stuck") is None
    lost = _tell(proc, "commit 1")  # the fence holds although the taker gave up
    assert lost.startswith("lost 1 ") and "run=replacement" in lost and "batch 1 was not committed" in lost
    os.kill(proc.pid, signal.SIGKILL)  # the fenced run dies without releasing
    proc.wait()
    _wait_free(store, "stuck")
    store.acquire_lease("stuck", make_holder("after"))
    assert store.lease_epoch("stuck") == 3
    store.commit(BatchCommit(record("stuck", 1)))
    assert store.load("stuck").record.last_batch_id == 1
