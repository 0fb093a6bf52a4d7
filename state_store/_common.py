"""Pieces shared by the three stores: version checks on load, record <-> JSON, lease helpers."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Iterable

from ematix_dagster.errors import CorruptState, LeaseHeld, StateVersionError
from state_store import codec
from state_store.base import BatchCommit, PipelineRecord, SourceProgress


def where(pipeline: str | None, store: str) -> str:
    return f"pipeline {pipeline!r} in {store}" if pipeline else store


def check_record_version(record: PipelineRecord, store: str) -> None:
    if record.state_version is not None and record.state_version > codec.STATE_VERSION:
        raise StateVersionError(
            f"{where(record.pipeline, store)}: state version {record.state_version} is newer than this code "
            f"({codec.STATE_VERSION}); upgrade ematix-dagster")


def bring_forward(pipeline: str, store: str, rows: list[tuple[int, bytes, bytes]]) -> tuple[list[tuple[int, bytes, bytes]], int]:
    """Check every blob's version byte; migrate older blobs in memory (the rows are not rewritten).

    A blob whose version byte is not a state version raises ``CorruptState``, a newer one
    ``StateVersionError``, both naming the pipeline, the window and the store. Bodies of
    current-version blobs are decoded later by the caller (``codec.decode_groups``).
    """
    current = codec.STATE_VERSION
    stale = [i for i, row in enumerate(rows) if not row[2] or row[2][0] != current]
    if not stale:
        return rows, 0
    rows = list(rows)
    for i in stale:
        start, key, blob = rows[i]
        try:
            version = codec.state_version(blob)
            blob = codec.migrate(bytes(blob), version, current)
        except (CorruptState, StateVersionError) as exc:
            raise type(exc)(f"{where(pipeline, store)}: window {start}, key {bytes(key).hex()}: {exc}") from None
        rows[i] = (start, key, blob)
    return rows, len(stale)


def sources_to_json(sources: dict[str, SourceProgress]) -> str:
    # an array keeps the source order (jsonb would sort object keys)
    return json.dumps([[name, p.max_event_ts, p.last_arrival] for name, p in sources.items()])


def sources_from_json(value: Any) -> dict[str, SourceProgress]:
    items = json.loads(value) if isinstance(value, str) else value
    return {name: SourceProgress(max_event_ts=m, last_arrival=a) for name, m, a in (items or [])}


def loads(value: Any, default: Any) -> Any:
    if value is None:
        return default
    return json.loads(value) if isinstance(value, str) else value


#: The pipelines-table columns a load reads, in the order ``record_from_row`` expects.
PIPELINE_COLUMNS = ("state_version", "query_id", "last_batch_id", "fingerprint", "fingerprint_doc", "watermark",
                    "sources", "counters", "emitted", "lease_holder", "pending_migration")


def record_from_row(pipeline: str, row: tuple, offsets: dict[str, str]) -> PipelineRecord:
    """The pipelines-table row (in ``PIPELINE_COLUMNS`` order) as a record; JSON as text or jsonb."""
    record = PipelineRecord(
        pipeline=pipeline, state_version=row[0], query_id=row[1], last_batch_id=row[2], fingerprint=row[3],
        fingerprint_doc=loads(row[4], {}), watermark=row[5], sources=sources_from_json(row[6]),
        counters=loads(row[7], {}), emitted=loads(row[8], []), pending_migration=bool(row[10]))
    record.offsets = ordered_offsets(record.sources, offsets)
    return record


def ordered_offsets(record_sources: Iterable[str], offsets: dict[str, str]) -> dict[str, str]:
    """Offsets in the record's source order, then any others by name."""
    out = {name: offsets[name] for name in record_sources if name in offsets}
    for name in sorted(offsets):
        out.setdefault(name, offsets[name])
    return out


def check_batch(batch: BatchCommit) -> None:
    """Types a store relies on (the databases check the same through their column types)."""
    if not isinstance(batch.record, PipelineRecord) or not batch.record.pipeline:
        raise TypeError("BatchCommit.record must be a PipelineRecord with a pipeline name")
    for row in batch.upserts:
        start, key, blob = row
        if type(start) is not int or not isinstance(key, bytes) or not isinstance(blob, bytes):
            raise TypeError(f"an upsert must be (int window_start, bytes key, bytes blob), got {row!r:.200}")
    for row in batch.deletes:
        start, key = row
        if type(start) is not int or not isinstance(key, bytes):
            raise TypeError(f"a delete must be (int window_start, bytes key), got {row!r:.200}")
    for start in batch.deleted_windows:
        if type(start) is not int:
            raise TypeError(f"a deleted window must be an int window start, got {start!r:.200}")
    for name, offset in batch.record.offsets.items():
        if not isinstance(name, str) or not isinstance(offset, str):
            raise TypeError("record.offsets must map source names to offset JSON text")


def lease_held(pipeline: str, store: str, holder: str | None) -> LeaseHeld:
    text = holder or "another process (holder text not written yet)"
    err = LeaseHeld(
        f"pipeline {pipeline!r} is already running: its lease in {store} is held by {text}; "
        "wait for that run to end or stop it (a crashed holder frees the lease when its process ends)")
    err.pipeline = pipeline  # type: ignore[attr-defined]
    err.holder = text  # type: ignore[attr-defined]
    return err


def lease_key(schema: str, pipeline: str) -> int:
    """A stable signed 64-bit advisory-lock key for (schema, pipeline)."""
    digest = hashlib.blake2b(f"ematix-dagster lease\0{schema}\0{pipeline}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


def file_safe(pipeline: str) -> str:
    """The pipeline name as a file-name part (names outside [A-Za-z0-9_-] get a hash suffix)."""
    if _SAFE.match(pipeline):
        return pipeline
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", pipeline)[:60]
    return f"{clean}-{hashlib.blake2b(pipeline.encode(), digest_size=6).hexdigest()}"
