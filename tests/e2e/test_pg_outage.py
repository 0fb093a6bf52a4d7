"""A PostgreSQL outage inside a batch: the run fails transient, naming the database, and resumes exactly.

The state store and the target both live in a PostgreSQL cluster this module owns
(``tests/pg_cluster.py``). ``EMATIX_FAULT_PAUSE`` stops ``ematix-dagster run`` inside a batch
(batch 0, or a middle batch); the test stops the cluster and lets the run go on. The run must exit
1 with one transient error line (its last) that names the database (host:port/db) and the failed
commit, never the password; a second ``run`` while the cluster stays down must fail the same way, quickly.
Once the cluster is back, a plain ``run`` (no ``reset``) finishes and the target equals the pandas
oracle fed with the batches Spark formed.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from ematix_dagster.spec import load_pipeline
from tests.e2e.test_crash_recovery import (
    HOPPING_REOPEN,
    MIDDLE,
    TUMBLING_DROP,
    actual_target,
    expected_target,
    feed,
    finish,
    pipeline_toml,
    start_run,
    wait_group_gone,
)
from tests.pg_cluster import PgCluster, pg_cluster  # noqa: F401 - the module-scoped fixture
from tests.pipeline_toml import postgres_store, postgres_target

DOWN_S = 15.0  # the cluster stays down at least this long
QUICK_S = 10.0  # a run against a database that is down must fail within this (no connect retry loop)
PAUSE_TIMEOUT_S = 180.0
SECRET = "outage-secret-" + uuid.uuid4().hex[:8]  # trust auth ignores it; it must never be printed


def _wait_paused(proc, marker: Path) -> None:
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"the run exited {proc.returncode} before pausing at {marker.stem}: "
                        f"{proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"the run never paused at {marker.stem}")
        time.sleep(0.1)


def _assert_transient(proc, err: str, cluster: PgCluster, what: str) -> str:
    """Exit 1 with the CLI's one ``error (transient ...)`` line, last, naming host:port/db; no password.

    Spark's own log (its ERROR record of the failed query quotes the Python exception) may
    precede it; the CLI's report must be one classified line, not an uncaught traceback.
    """
    assert proc.returncode == 1, f"{what}: exit {proc.returncode}: {err[-3000:]}"
    assert wait_group_gone(proc.pid) == [], f"{what}: a process of the run (driver or JVM) survived"
    assert SECRET not in err, f"{what}: the password was printed"
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error (", "error:"))]  # the CLI's report lines
    assert len(errors) == 1 and lines[-1] == errors[0], f"{what}: not one final error line: {err[-3000:]}"
    line = errors[0]
    assert line.startswith("error (transient"), f"{what}: not transient: {line}"
    assert cluster.where in line, f"{what}: the database ({cluster.where}) is not named: {line}"
    return line


CASES = [
    # (a) batch 0, paused inside the store transaction; the target rows are in that transaction too
    pytest.param(TUMBLING_DROP, True, 0, "store_commit:0", id="batch0-store_commit-exactly-once"),
    # (b) a middle batch, paused after the target write, before the store commit
    pytest.param(HOPPING_REOPEN, False, MIDDLE, f"target_write:{MIDDLE}", id="middle-target_write-effectively-once"),
]


@pytest.mark.slow
@pytest.mark.parametrize("window,same_transaction,batch_id,pause", CASES)
def test_outage_inside_a_batch_fails_transient_and_resumes_exactly(window, same_transaction, batch_id, pause, tmp_path,
                                                                    batch_files, pg_cluster: PgCluster, monkeypatch,  # noqa: F811
                                                                    record_property):
    schema = f"outage_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    fed = feed(batch_files)
    store = postgres_store("${EMATIX_OUTAGE_URL}", schema)
    target = postgres_target("${EMATIX_OUTAGE_URL}", f"{schema}.outage", same_transaction=same_transaction)
    toml = pipeline_toml(tmp_path, "outage", window, target, store)
    env = {"EMATIX_OUTAGE_URL": pg_cluster.dsn(password=SECRET)}
    monkeypatch.setenv("EMATIX_OUTAGE_URL", env["EMATIX_OUTAGE_URL"])  # for load_pipeline below
    fault_dir = tmp_path / "faults"
    marker = fault_dir / pause.replace(":", "-")
    cp = tmp_path / "cp"
    runs = []
    try:
        runs.append(proc := start_run(toml, EMATIX_FAULT_PAUSE=pause, EMATIX_FAULT_DIR=str(fault_dir), **env))
        _wait_paused(proc, marker.with_suffix(".paused"))
        pg_cluster.stop("fast")
        down_at = time.monotonic()
        marker.with_suffix(".resume").touch()
        line = _assert_transient(proc, finish(proc, timeout=120), pg_cluster, "the paused run")
        # The batch's failed commit is the error; closing the store afterwards (releasing the lease
        # on a dead connection) must not replace it.
        assert "commit" in line.lower() and "lease" not in line.lower(), f"not the commit's error: {line}"
        assert (cp / "offsets" / str(batch_id)).exists() and not (cp / "commits" / str(batch_id)).exists(), \
            f"batch {batch_id} must be planned by Spark and not committed"

        started = time.monotonic()
        runs.append(again := start_run(toml, **env))
        err = finish(again, timeout=120)
        took = time.monotonic() - started
        record_property("seconds_to_fail_while_down", round(took, 1))
        _assert_transient(again, err, pg_cluster, "a run while the database is down")
        assert took < QUICK_S, f"a run against a database that is down took {took:.1f} s to fail"

        time.sleep(max(0.0, down_at + DOWN_S - time.monotonic()))
        pg_cluster.start()
        runs.append(last := start_run(toml, **env))
        err = finish(last)
        assert last.returncode == 0, err[-3000:]
        assert wait_group_gone(last.pid) == []
        assert SECRET not in err
    finally:
        for run in runs:  # a failed assertion may leave a run paused or running: end its group
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.communicate()
        if not pg_cluster.running:
            pg_cluster.start()

    spec = load_pipeline(toml)
    assert actual_target(pg_cluster.dsn(), spec.target.table) == expected_target(fed, spec)
