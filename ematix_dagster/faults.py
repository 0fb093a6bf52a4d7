"""Fault points for crash tests: no-ops unless ``EMATIX_FAULT_POINTS`` names them.

``EMATIX_FAULT_POINTS="target_write:2,after_store_commit:4"`` kills the whole process group
(driver and JVM) with SIGKILL when batch 2 has written its target, and again when batch 4 has
committed its state. Each point fires once: a marker file in ``EMATIX_FAULT_DIR`` (required with
the points) remembers that it fired, so the restarted run gets past it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def point(name: str, batch_id: int) -> None:
    wanted = os.environ.get("EMATIX_FAULT_POINTS")
    if not wanted or f"{name}:{batch_id}" not in wanted.split(","):
        return
    marker = Path(os.environ["EMATIX_FAULT_DIR"]) / f"{name}-{batch_id}.fired"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"pid {os.getpid()}\n")
    os.killpg(os.getpgrp(), signal.SIGKILL)
