"""Keys, blobs, segments and records the state-store contract tests commit (the stores: conftest.py's
``make_store``)."""

from __future__ import annotations

from pathlib import Path

from state_store import codec
from state_store.contract import PipelineRecord, SourceProgress
from state_store.segments import Segment, encode_segment

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = Path(__file__).parent.parent / "fixtures" / "state_v1"
KINDS = ["in_memory", "sqlite", "postgres"]


def key(*values) -> bytes:
    return codec.encode_key(values)


def blob(*accs) -> bytes:
    return codec.encode_state(list(accs))


def end(start: int) -> int:
    """A window end for a stored group (stores keep it as given; one minute here)."""
    return start + 60_000_000


def segment(start: int, **counts: int) -> bytes:
    """A delta segment setting each key's one accumulator in window ``start``, encoded as the engine
    encodes one (a store keeps segments as opaque blobs)."""
    return encode_segment(Segment(starts=[start] * len(counts), ends=[end(start)] * len(counts),
                                  keys=[key(k) for k in counts], emitted=None, written=None, accs=[list(counts.values())]))


def record(pipeline: str, batch_id: int, **extra) -> PipelineRecord:
    fields = dict(
        query_id="6f1c2b9e-query", last_batch_id=batch_id, fingerprint="fp-1",
        fingerprint_doc={"window": {"kind": "tumbling", "duration_ms": 60000}, "sources": ["clicks", "views"]},
        watermark=1_700_000_000_000_000 + batch_id, counters={"late_rows_dropped": batch_id, "rows": 10 * batch_id},
        sources={"views": SourceProgress(max_event_ts=5, last_arrival=None),
                 "clicks": SourceProgress(max_event_ts=1_700_000_000_123_456, last_arrival=1_700_000_001_000_000)},
        offsets={"views": '{"logOffset": %d}' % batch_id, "clicks": "{}"})
    fields.update(extra)
    fields.setdefault("state_version", codec.STATE_VERSION)
    return PipelineRecord(pipeline=pipeline, **fields)


def groups_of(state) -> dict[tuple[int, bytes], bytes]:
    return {(start, k): b for start, _end, k, b in state.groups}


def same_state(a, b) -> bool:
    """Equal records, groups and segments (the order of loaded groups is not part of the contract; the
    segments' is)."""
    return (a.record == b.record and sorted(a.groups) == sorted(b.groups) and a.migrated == b.migrated
            and a.segments == b.segments)
