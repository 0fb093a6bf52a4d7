"""The parquet target and parquet dead letters: one file per batch, replaced atomically on replay."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ematix_dagster.errors import PipelineConfigError, TargetError


class _BatchDirectories:
    """``<path>/batch_id=<N>/<part>.parquet``, each file replaced atomically on replay."""

    def __init__(self, path: str | None, pipeline_name: str, key: str) -> None:
        if not path:
            raise PipelineConfigError(f"{key}.path", "is required for parquet", "name an output directory")
        if path.startswith("file://"):
            path = path[len("file://"):]
        elif "://" in path:
            raise PipelineConfigError(f"{key}.path", f"{path!r} is not a local directory",
                                      "use a local path (remote file systems are not supported yet)")
        self.root = Path(path)
        self.pipeline_name = pipeline_name
        self.key = key

    def _fail(self, action: str, exc: BaseException) -> TargetError:
        return TargetError(f"pipeline {self.pipeline_name!r}: {action} under {str(self.root)!r} failed: {exc}")

    def open(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._recover()
        except OSError as exc:
            raise self._fail("preparing the parquet directory", exc) from None

    def _recover(self) -> None:
        """Remove temporary files a crash inside :meth:`write` left behind (readers skip them anyway)."""
        for entry in self.root.glob("batch_id=*/.*.tmp-*"):
            entry.unlink(missing_ok=True)

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        """Write ``batch_id=N/<part>.parquet`` with one atomic rename; a replay replaces the file.

        The rows go to a hidden temporary file (readers skip names starting with ``.``), fsynced,
        then renamed over ``<part>.parquet``: a reader sees the earlier attempt's whole file or this
        one, never a part, and a replay leaves one file, not two. A write that fails removes its
        temporary file and leaves the earlier file as it was."""
        if rows.num_rows == 0:
            return
        directory = self.root / f"batch_id={int(batch_id)}"
        final = directory / f"{part}.parquet"
        tmp = directory / f".{part}.parquet.tmp-{uuid.uuid4().hex[:12]}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                pq.write_table(rows, f, use_dictionary=_dictionary_columns(rows.schema))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            _fsync_dir(directory)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._fail(f"writing batch {batch_id}", exc) from None
        except BaseException:  # e.g. a value Arrow cannot write: the earlier attempt's file stays whole
            tmp.unlink(missing_ok=True)
            raise


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth a dictionary: strings and bytes (group keys, ``_emit_kind``, a payload's
    categories). Window bounds, sequence numbers and aggregates are mostly distinct, and trying a
    dictionary for them makes the write several times slower and the file no smaller."""
    return [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class ParquetWriter:
    """Rows to ``<path>/batch_id=<N>/part-0.parquet``: windows (with ``_emit_kind``) or dead letters."""

    idempotent = True

    def __init__(self, path: str | None, pipeline_name: str, key: str) -> None:
        self._dirs = _BatchDirectories(path, pipeline_name, key)
        self.path = str(self._dirs.root)
        what = "dead-letter batch directories" if key == "dead_letter" else "batch directories"
        self.description = f"parquet {what} under {self.path}"

    def open(self) -> None:
        self._dirs.open()

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        self._dirs.write(batch_id, rows, part)

    def close(self) -> None:
        pass
