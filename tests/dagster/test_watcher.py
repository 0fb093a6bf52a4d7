"""The step's watcher: it stops the pipeline when the run leaves STARTED or the run worker is gone.

A real Dagster instance (ephemeral) holds the run; the orphan case uses real processes: a parent
that starts the watching process and exits, so the watcher sees itself re-parented.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest

from ematix_dagster.dagster.watcher import RunWatcher, lease_of_finished_run

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def started_run(instance: dg.DagsterInstance, run_id: str = "run-1") -> dg.DagsterRun:
    return instance.add_run(dg.DagsterRun(job_name="clicks_job", run_id=run_id, status=dg.DagsterRunStatus.STARTED))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_started_run_keeps_going_a_failed_one_stops(instance):
    run = started_run(instance)
    watcher = RunWatcher(instance, run.run_id, stop=lambda: None)
    assert watcher.check() is None
    instance.report_run_failed(instance.get_run_by_id(run.run_id))
    assert watcher.check() == "run run-1 is FAILURE in the Dagster instance, no longer STARTED"
    assert RunWatcher(instance, "no-such-run", stop=lambda: None).check() == \
        "run no-such-run no longer exists in the Dagster instance"


def test_a_lease_is_taken_over_only_from_a_dagster_run_that_has_ended(instance):
    take_over = lease_of_finished_run(instance)
    live, ended, canceling = (started_run(instance, run_id) for run_id in ("live", "ended", "canceling"))
    instance.report_run_failed(instance.get_run_by_id(ended.run_id))
    instance.report_run_canceling(instance.get_run_by_id(canceling.run_id))

    def holder(label: str) -> str:
        return f"host=h pid=42 run={label} since=2026-11-29T04:00:00Z"

    assert take_over(holder("dagster:ended"))  # an orphan's lease
    assert not take_over(holder("dagster:live"))  # the run goes on: its lease stays
    assert not take_over(holder("dagster:unknown"))  # another deployment's run, or a deleted one
    assert not take_over(holder("dagster:canceling"))  # its step is stopping on its own
    assert not take_over(holder("cli")) and not take_over(None)  # only Dagster's own runs are judged here


def test_canceling_waits_for_dagsters_own_interrupt_then_stops(instance):
    run = started_run(instance)
    clock = Clock()
    watcher = RunWatcher(instance, run.run_id, stop=lambda: None, canceling_grace_seconds=30, clock=clock)
    instance.report_run_canceling(instance.get_run_by_id(run.run_id))
    assert watcher.check() is None  # a terminate is on its way: let it read as a terminate
    clock.now = 29.0
    assert watcher.check() is None
    clock.now = 31.0
    assert "has been CANCELING for 31 s" in watcher.check()


def test_the_thread_stops_once_and_says_why(instance):
    run = started_run(instance)
    stops, reports = [], []
    watcher = RunWatcher(instance, run.run_id, stop=lambda: stops.append(time.monotonic()), report=reports.append,
                         interval_seconds=0.05).start()
    try:
        time.sleep(0.3)
        assert stops == []
        instance.report_run_failed(instance.get_run_by_id(run.run_id))
        deadline = time.monotonic() + 10
        while not stops and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        watcher.close()
    assert len(stops) == 1
    assert reports == ["stopping at the next batch boundary: run run-1 is FAILURE in the Dagster instance, "
                       "no longer STARTED"]
    assert watcher.reason == "run run-1 is FAILURE in the Dagster instance, no longer STARTED"


ORPHAN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import dagster as dg
    from ematix_dagster.dagster.watcher import RunWatcher, lease_of_finished_run

    out = Path(sys.argv[1])
    instance = dg.DagsterInstance.ephemeral()
    instance.add_run(dg.DagsterRun(job_name="j", run_id="r", status=dg.DagsterRunStatus.STARTED))
    done = []
    watcher = RunWatcher(instance, "r", stop=lambda: done.append(1), report=lambda text: out.write_text(text),
                         interval_seconds=0.1).start()
    (out.parent / "ready").write_text("1")
    deadline = time.monotonic() + 60
    while not done and time.monotonic() < deadline:
        time.sleep(0.05)
    watcher.close()
""")

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    ready = Path(sys.argv[2]).parent / "ready"
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(child.pid, flush=True)
    # exits without waiting: the child is re-parented, as a step process is when its run worker dies
""")


@pytest.mark.slow  # two whole processes: a parent that exits and its orphaned child, which imports Dagster
def test_an_orphaned_process_notices_that_its_parent_is_gone(tmp_path):
    out = tmp_path / "reason.txt"
    parent = subprocess.run([sys.executable, "-c", PARENT, ORPHAN, str(out)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert parent.returncode == 0, parent.stderr
    child_pid = int(parent.stdout.strip())
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert out.exists(), f"the orphan (pid {child_pid}) did not notice that its parent is gone"
    text = out.read_text()
    assert text.startswith("stopping at the next batch boundary: its run worker (pid ")
    assert "is gone: this step process was re-parented to pid" in text


def test_an_orphaned_step_ends_its_process_and_returns_nothing_to_dagster(instance):
    run = started_run(instance)
    exits: list[int] = []
    watcher = RunWatcher(instance, run.run_id, stop=lambda: None, exit_process=exits.append)
    with pytest.raises(SystemExit):  # reached only because this exit_process returned
        watcher.end_process()
    assert exits == [0]
