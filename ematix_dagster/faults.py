"""Fault points for crash tests: no-ops unless ``EMATIX_FAULT_POINTS`` or ``EMATIX_FAULT_PAUSE`` names them.

``EMATIX_FAULT_POINTS="target_write:2,after_store_commit:flush"`` kills the whole process group
(driver and JVM) with SIGKILL when batch 2 has written its target, and again when the
end-of-input flush has committed its state. Each point fires once: a marker file in
``EMATIX_FAULT_DIR`` (required with the points) remembers that it fired, so the restarted run
gets past it.

``EMATIX_FAULT_PAUSE="store_commit:0"`` instead stops at the point until the test lets it go:
the run writes ``<dir>/store_commit-0.paused`` and waits for ``<dir>/store_commit-0.resume``, so
a test can take a database away in the middle of a batch, deterministically.

Points: ``target_write`` (the target is written, the store is not), ``store_commit`` (inside the
store transaction, before COMMIT) and ``after_store_commit`` (the store committed, Spark has not).
The batch label is the batch id, or ``flush`` for the end-of-input flush (a row pipeline's flush writes
nothing: its ``after_store_commit:flush`` is where the run ends, its held rows in the store).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def _named(variable: str, label: str) -> bool:
    wanted = os.environ.get(variable, "")
    return bool(wanted) and label in wanted.split(",")


def point(name: str, batch: int | str) -> None:
    label = f"{name}:{batch}"
    directory = Path(os.environ.get("EMATIX_FAULT_DIR", "."))
    marker = directory / f"{name}-{batch}"
    if _named("EMATIX_FAULT_PAUSE", label) and not marker.with_suffix(".resume").exists():
        directory.mkdir(parents=True, exist_ok=True)
        marker.with_suffix(".paused").write_text(f"pid {os.getpid()}\n")
        while not marker.with_suffix(".resume").exists():
            time.sleep(0.1)
    if not _named("EMATIX_FAULT_POINTS", label) or marker.with_suffix(".fired").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    marker.with_suffix(".fired").write_text(f"pid {os.getpid()}\n")
    os.killpg(os.getpgrp(), signal.SIGKILL)
