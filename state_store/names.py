"""The store's names: its tables, and the advisory-lock key of a (schema, pipeline) lease.

A leaf: it imports nothing of the project, so the migrations and the stores' shared pieces
(``_common``) both take their names from here without importing each other.
"""

from __future__ import annotations

import hashlib

STATE_TABLE = "ematix_streaming_state"
OFFSETS_TABLE = "ematix_streaming_offsets"
PIPELINES_TABLE = "ematix_streaming_pipelines"
SCHEMA_VERSION_TABLE = "ematix_streaming_schema_version"
PENDING_TABLE = "ematix_streaming_pending"
#: the pending table's index on (pipeline_name, event_ts), its non-NULL event times (schema step 7)
PENDING_EVENT_TS_INDEX = "ematix_streaming_pending_event_ts"
#: session and sliding state as ordered column blobs (schema step 8)
SEGMENTS_TABLE = "ematix_streaming_segments"


def lease_key(schema: str, pipeline: str) -> int:
    """A stable signed 64-bit advisory-lock key for (schema, pipeline)."""
    digest = hashlib.blake2b(f"ematix-dagster lease\0{schema}\0{pipeline}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)
