"""A streaming step that notices it is orphaned and stops itself.

A ``processing_time`` step runs until it is stopped. Dagster stops it on **Terminate** (an
interrupt in the step process). Two situations send no interrupt:

* the run worker died (``kill -9``, OOM killer): the step process (a child of the run worker
  under the multiprocess executor) is re-parented and keeps running, holding the pipeline's
  lease and writing into a run that Dagster has already marked FAILURE;
* the run left STARTED without the step being told (marked FAILURE or CANCELED by the code
  server, run monitoring or an operator).

:class:`RunWatcher` is a daemon thread that checks every ``interval_seconds`` whether the parent
process is still the one the step started under and whether the run is still STARTED in the
instance. When not, it logs why and calls ``stop`` (``PipelineRunner.request_stop``): the query
stops at a batch boundary and the runner releases the lease. A run in CANCELING is given
``canceling_grace_seconds`` for Dagster's own interrupt to arrive first, so a terminate keeps
reading as a terminate.

The run is then no longer the step's: anything the step yields (a materialization, the output,
``STEP_SUCCESS``) would land in a run that Dagster has already ended, show a green step beside a
FAILURE badge and become the asset's latest materialization. So once the query has stopped the step
ends its process (:meth:`RunWatcher.end_process`) instead of returning to Dagster: a ``Failure``
would still write ``STEP_FAILURE`` into that run. The only word the run gets is the warning that
says why the step stopped.

An orphan that has not noticed yet cannot write past the next run: that run takes the lease over
from a holder whose Dagster run has ended (:func:`lease_of_finished_run`), the store refuses the
orphan's next commit (``LeaseLost``, checked in the commit's own transaction) and the orphan ends
the same way, after one warning. The batches it committed before are reported by the next run
(:mod:`ematix_dagster.dagster.unreported`).

Under the default multiprocess executor the step's parent is the run worker. Under the
``in_process`` executor the step runs in the run worker itself, whose parent is the code server:
there a changed parent means that the code server died, the run can no longer be terminated
through it, and stopping the pipeline (the run then ends, and the keep-alive sensor starts a new
one) is the safe reaction too.
"""

import logging
import os
import re
import sys
import threading
import time
from typing import Any, Callable, NoReturn, Optional

import dagster as dg

log = logging.getLogger("ematix_dagster")

DEFAULT_WATCH_INTERVAL_SECONDS = 5.0
DEFAULT_CANCELING_GRACE_SECONDS = 30.0


class RunWatcher:
    """Calls ``stop`` once, with a reason, when the step's run worker or run is gone."""

    def __init__(self, instance: Any, run_id: str, stop: Callable[[], None], *,
                 report: Optional[Callable[[str], None]] = None,
                 interval_seconds: float = DEFAULT_WATCH_INTERVAL_SECONDS,
                 canceling_grace_seconds: float = DEFAULT_CANCELING_GRACE_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 exit_process: Callable[[int], Any] = os._exit) -> None:
        self.instance = instance
        self.run_id = run_id
        self.interval_seconds = float(interval_seconds)
        self.canceling_grace_seconds = float(canceling_grace_seconds)
        self.reason: Optional[str] = None
        self._stop = stop
        self._report = report
        self._clock = clock
        self._exit_process = exit_process
        self._parent_pid = os.getppid()
        self._canceling_since: Optional[float] = None
        self._lookup_error: Optional[str] = None
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- the check (also callable directly, e.g. from tests) -----------------------------------

    def check(self) -> Optional[str]:
        """Why the step should stop now, or None."""
        parent = os.getppid()
        if parent != self._parent_pid:
            return (f"its run worker (pid {self._parent_pid}) is gone: this step process was re-parented to "
                    f"pid {parent}")
        try:
            run = self.instance.get_run_by_id(self.run_id)
        except Exception as exc:  # noqa: BLE001 - the instance's storage may blink; look again next time
            text = f"{type(exc).__name__}: {exc}"
            if text != self._lookup_error:
                log.warning("run %s: cannot read the run's status (%s); checking again in %.0f s",
                            self.run_id, text, self.interval_seconds)
            self._lookup_error = text
            return None
        self._lookup_error = None
        if run is None:
            return f"run {self.run_id} no longer exists in the Dagster instance"
        status = run.status
        if status == dg.DagsterRunStatus.STARTED:
            self._canceling_since = None
            return None
        if status == dg.DagsterRunStatus.CANCELING:
            now = self._clock()
            if self._canceling_since is None:
                self._canceling_since = now
            if now - self._canceling_since < self.canceling_grace_seconds:
                return None  # Dagster's interrupt normally arrives within a second
            return (f"run {self.run_id} has been CANCELING for {now - self._canceling_since:.0f} s and the "
                    "termination did not reach this step")
        return f"run {self.run_id} is {status.value} in the Dagster instance, no longer STARTED"

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> "RunWatcher":
        if self.interval_seconds > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"ematix-watch-{self.run_id[:8]}", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._done.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.interval_seconds + 5)

    def end_process(self) -> NoReturn:
        """End the step process at once, writing nothing more into the run (see the module docstring).

        Call it only after the query has stopped and the lease is released (its ``finally`` blocks
        and the resources' teardown do not run); the Spark JVM exits with its Python driver.
        """
        self.close()
        log.warning("run %s: ending this step process without reporting to the run (%s)", self.run_id, self.reason)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self._exit_process(0)
        raise SystemExit(0)  # only reached when exit_process returns (tests)

    def __enter__(self) -> "RunWatcher":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        while not self._done.wait(self.interval_seconds):
            reason = self.check()
            if reason is None:
                continue
            self.reason = reason
            text = f"stopping at the next batch boundary: {reason}"
            log.warning(text)
            if self._report is not None:
                try:
                    self._report(text)
                except Exception as exc:  # noqa: BLE001 - the event log may be unreachable; stop anyway
                    log.warning("could not log to the run: %s", exc)
            try:
                self._stop()
            except Exception as exc:  # noqa: BLE001 - the step's own cleanup releases the lease regardless
                log.warning("stopping the streaming query failed: %s: %s", type(exc).__name__, exc)
            return


_DAGSTER_HOLDER = re.compile(r"\brun=dagster:(\S+)")


def lease_of_finished_run(instance: Any) -> Callable[[Optional[str]], bool]:
    """Whether a new run may take over a pipeline's lease from ``holder`` (the store's holder text):
    only from the step of a run this instance has ended. Such a step is an orphan that has not
    noticed yet; any other holder keeps its lease: a live run, the CLI, or a run this instance does
    not know (another deployment's, or one deleted, whose step stops by itself when it looks)."""

    def take_over(holder: Optional[str]) -> bool:
        match = _DAGSTER_HOLDER.search(holder or "")
        if match is None:
            return False
        run = instance.get_run_by_id(match.group(1))
        return run is not None and run.is_finished

    return take_over


__all__ = ["DEFAULT_CANCELING_GRACE_SECONDS", "DEFAULT_WATCH_INTERVAL_SECONDS", "RunWatcher", "lease_of_finished_run"]
