"""Reading Spark's checkpoint directory.

Inside ``foreachBatch`` the current batch's timestamp and offsets are only in
``<checkpoint>/offsets/<batch_id>`` (``query.lastProgress`` describes the previous batch):
line 1 is the version, line 2 the batch metadata (``batchTimestampMs``, conf), then one JSON
offset per source in source order (docs/contract/targets-and-guarantees.md). A file source's offset numbers its own file log,
``sources/<i>/``, from which :func:`batch_files` finds the files a batch reads.

A file that is not in Spark's format (missing lines, text that is not JSON, a batch entry of
``offsets/`` or ``commits/`` that is not a file) raises :class:`CorruptCheckpoint`
(terminal) naming the file and the way out, never a raw parsing error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ematix_dagster.errors import CorruptCheckpoint

_BATCH_NAME = re.compile(r"[0-9]+")
_VERSION_LINE = re.compile(r"v[0-9]+")


@dataclass(frozen=True)
class BatchOffsets:
    batch_id: int
    batch_timestamp_ms: int
    offsets: tuple[str, ...]
    #: ``batchWatermarkMs``: the event-time watermark (ms) in effect during the batch; Spark writes 0
    #: before any watermark (its default, also for a log line without it)
    watermark_ms: int = 0


def local_path(location: str) -> Path:
    return Path(location[len("file://"):] if location.startswith("file://") else location)


def _corrupt(location: str, path: Path, problem: str) -> NoReturn:
    raise CorruptCheckpoint(
        f"the checkpoint file {path} is not in Spark's format: {problem}",
        way_out=f"Restore the checkpoint directory {local_path(location)} from a backup, or start over with "
        "`ematix-dagster reset PIPELINE.toml --yes` (deletes the state and the checkpoint, never the target; "
        "the input is then processed again)")


def _read_lines(location: str, path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        _corrupt(location, path, "the file is missing")
    except UnicodeDecodeError as exc:
        _corrupt(location, path, f"it is not UTF-8 text ({exc.reason} at byte {exc.start})")
    except IsADirectoryError:
        _corrupt(location, path, "it is a directory")


def _json_line(location: str, path: Path, lines: list[str], index: int, what: str) -> Any:
    if len(lines) <= index:
        _corrupt(location, path, f"it has {len(lines)} line(s), so line {index + 1} ({what}) is missing")
    try:
        return json.loads(lines[index])
    except ValueError as exc:
        _corrupt(location, path, f"line {index + 1} ({what}) is not JSON ({exc}): {lines[index][:80]!r}")


def read_offsets(location: str, batch_id: int) -> BatchOffsets:
    path = local_path(location) / "offsets" / str(batch_id)
    lines = _read_lines(location, path)
    if not lines or not _VERSION_LINE.fullmatch(lines[0].strip()):
        _corrupt(location, path, f"line 1 is {lines[0][:40]!r}, not a log version such as 'v1'" if lines
                 else "it is empty")
    meta = _json_line(location, path, lines, 1, "the batch metadata")
    stamp = meta.get("batchTimestampMs") if isinstance(meta, dict) else None
    if type(stamp) is not int:
        _corrupt(location, path, f"line 2 (the batch metadata) has no integer batchTimestampMs: {lines[1][:80]!r}")
    watermark = meta.get("batchWatermarkMs", 0)
    if type(watermark) is not int:
        _corrupt(location, path, f"line 2 (the batch metadata) has a batchWatermarkMs that is no integer: {lines[1][:80]!r}")
    if len(lines) < 3:
        _corrupt(location, path, "it holds no source offsets (line 3 on: one per source)")
    return BatchOffsets(batch_id, stamp, tuple(lines[2:]), watermark)


def _batch_ids(location: str, directory: Path) -> list[int]:
    """Batch numbers of a log directory (``offsets/``, ``commits/``), ascending.

    Entries not named by a number (Spark's ``.N.crc`` checksums and ``.tmp`` files, an operator's
    ``1.bak``) are ignored, as Spark ignores them: they do not stop a pipeline. A batch entry that
    is not a file is corrupt.
    """
    if not directory.is_dir():
        return []
    ids = []
    for entry in directory.iterdir():
        if not _BATCH_NAME.fullmatch(entry.name):
            continue
        if not entry.is_file():
            _corrupt(location, entry, f"{directory.name}/{entry.name} is not a file")
        ids.append(int(entry.name))
    return sorted(ids)


def has_progress(location: str) -> bool:
    """True when the checkpoint has recorded at least one batch."""
    return bool(_batch_ids(location, local_path(location) / "offsets"))


def committed_batches(location: str) -> list[int]:
    return _batch_ids(location, local_path(location) / "commits")


def source_log(location: str, source_index: int, batch_id: int) -> list[str]:
    """Files a file source read in one batch (its ``sources/<i>/<batch_id>`` log)."""
    path = local_path(location) / "sources" / str(source_index) / str(batch_id)
    if not path.exists():
        return []
    lines = _read_lines(location, path)
    paths = []
    for index, line in enumerate(lines[1:], start=1):
        if line.strip():
            entry = _json_line(location, path, lines, index, "a file entry")
            if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
                _corrupt(location, path, f"line {index + 1} (a file entry) has no path: {line[:80]!r}")
            paths.append(entry["path"])
    return paths


def query_id(location: str) -> str | None:
    """The streaming query's id, stable across restarts from the same checkpoint."""
    path = local_path(location) / "metadata"
    if not path.is_file():
        return None
    meta = _json_line(location, path, _read_lines(location, path), 0, "the query metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("id"), str):
        _corrupt(location, path, f"line 1 (the query metadata) has no query id: {str(meta)[:80]!r}")
    return meta["id"]


def offsets_exist(location: str, batch_id: int) -> bool:
    return (local_path(location) / "offsets" / str(batch_id)).is_file()


# ---------------------------------------------------------------------------------------------
# A file source's log: the files each batch reads

def batch_files(location: str, index: int, batch_id: int) -> list[str]:
    """The files source ``index`` reads in batch ``batch_id``, as Spark's checkpoint records them.

    A file source's offset (line ``index`` of ``offsets/N``, ``{"logOffset": k}``) numbers its own
    file log, ``sources/<i>/<k>``, which moves only when new files arrive: batch N reads the log's
    entries after the previous batch's offset, up to its own (what ``FileStreamSource.getBatch``
    reads). Every tenth log entry Spark compacts the log into ``<k>.compact``, which holds all
    entries so far, each with its ``batchId``; the plain files before it are deleted later.
    """
    end = _log_offset(location, batch_id, index)
    if end is None:
        return []
    start = _log_offset(location, batch_id - 1, index) if batch_id > 0 and offsets_exist(location, batch_id - 1) \
        else None
    directory = local_path(location) / "sources" / str(index)
    compacted: dict[int, list[tuple[int, str]]] = {}
    paths: list[str] = []
    for k in range(-1 if start is None else start, end):
        k += 1
        if (directory / str(k)).exists():
            paths += source_log(location, index, k)
            continue
        covering = sorted(c for c in _compact_ids(directory) if c >= k)
        if not covering:
            raise CorruptCheckpoint(f"the checkpoint's file log {directory} has no entry {k} (neither {k} nor a "
                                    f"compacted file after it), which batch {batch_id} reads",
                                    way_out="Way out: restore the checkpoint directory from a backup, or start over "
                                    "with `ematix-dagster reset PIPELINE.toml --yes`")
        if covering[0] not in compacted:
            compacted[covering[0]] = _compact_entries(directory / f"{covering[0]}.compact")
        paths += [path for batch, path in compacted[covering[0]] if batch == k]
    return paths


def files_logged(location: str, index: int, up_to: int) -> list[str]:
    """Every file source ``index`` has read up to its log offset ``up_to``, in the log's order (the
    plain log files ``sources/<i>/<k>``, or the compacted one that holds them)."""
    directory = local_path(location) / "sources" / str(index)
    compacted: dict[int, list[tuple[int, str]]] = {}
    paths: list[str] = []
    for k in range(up_to + 1):
        if (directory / str(k)).exists():
            paths += source_log(location, index, k)
            continue
        covering = sorted(c for c in _compact_ids(directory) if c >= k)
        if not covering:
            continue  # not in the log (an entry Spark never wrote): nothing read there
        if covering[0] not in compacted:
            compacted[covering[0]] = _compact_entries(directory / f"{covering[0]}.compact")
        paths += [path for batch, path in compacted[covering[0]] if batch == k]
    return paths


def _log_offset(location: str, batch_id: int, index: int) -> int | None:
    """A file source's log offset in ``offsets/<batch_id>``; None when it has none yet (``-``)."""
    lines = read_offsets(location, batch_id).offsets
    if index >= len(lines) or lines[index].strip() in ("", "-"):
        return None
    try:
        value = json.loads(lines[index])
        return int(value["logOffset"] if isinstance(value, dict) else value)
    except (ValueError, KeyError, TypeError):
        raise CorruptCheckpoint(f"the checkpoint file {local_path(location) / 'offsets' / str(batch_id)} is not in "
                                f"Spark's format: line {index + 3} is not a file source's offset: "
                                f"{lines[index][:80]!r}",
                                way_out="Way out: restore the checkpoint directory from a backup, or start over "
                                "with `ematix-dagster reset PIPELINE.toml --yes`") from None


def _compact_ids(directory: Path) -> list[int]:
    names = (p.name[: -len(".compact")] for p in directory.glob("*.compact"))
    return [int(name) for name in names if name.isdigit()]


def _compact_entries(path: Path) -> list[tuple[int, str]]:
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()[1:], start=2):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            entries.append((int(entry["batchId"]), str(entry["path"])))
        except (ValueError, KeyError, TypeError):
            raise CorruptCheckpoint(f"the checkpoint file {path} is not in Spark's format: line {number} is not a "
                                    f"file entry: {line[:80]!r}",
                                    way_out="Way out: restore the checkpoint directory from a backup, or start over "
                                    "with `ematix-dagster reset PIPELINE.toml --yes`") from None
    return entries
