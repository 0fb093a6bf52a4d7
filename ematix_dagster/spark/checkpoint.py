"""Reading Spark's checkpoint directory.

Inside ``foreachBatch`` the current batch's timestamp and offsets are only in
``<checkpoint>/offsets/<batch_id>`` (``query.lastProgress`` describes the previous batch):
line 1 is the version, line 2 the batch metadata (``batchTimestampMs``, conf), then one JSON
offset per source in source order (DESIGN.md §3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BatchOffsets:
    batch_id: int
    batch_timestamp_ms: int
    offsets: tuple[str, ...]


def local_path(location: str) -> Path:
    return Path(location[len("file://"):] if location.startswith("file://") else location)


def read_offsets(location: str, batch_id: int) -> BatchOffsets:
    path = local_path(location) / "offsets" / str(batch_id)
    lines = path.read_text().splitlines()
    meta = json.loads(lines[1])
    return BatchOffsets(batch_id, int(meta["batchTimestampMs"]), tuple(lines[2:]))


def has_progress(location: str) -> bool:
    """True when the checkpoint has recorded at least one batch."""
    offsets = local_path(location) / "offsets"
    return offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir())


def committed_batches(location: str) -> list[int]:
    commits = local_path(location) / "commits"
    if not commits.is_dir():
        return []
    return sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())


def source_log(location: str, source_index: int, batch_id: int) -> list[str]:
    """Files a file source read in one batch (its ``sources/<i>/<batch_id>`` log)."""
    path = local_path(location) / "sources" / str(source_index) / str(batch_id)
    if not path.exists():
        return []
    return [json.loads(line)["path"] for line in path.read_text().splitlines()[1:] if line.strip()]


def query_id(location: str) -> str | None:
    """The streaming query's id, stable across restarts from the same checkpoint."""
    path = local_path(location) / "metadata"
    if not path.is_file():
        return None
    return json.loads(path.read_text().splitlines()[0]).get("id")


def offsets_exist(location: str, batch_id: int) -> bool:
    return (local_path(location) / "offsets" / str(batch_id)).is_file()
