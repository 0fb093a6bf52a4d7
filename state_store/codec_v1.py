"""Version 1 of the state blob (tagged text values), read only to bring old blobs forward.

Kept apart so the current codec reads as what is written today; see ``state_store.codec``
("Version history") for why version 2 replaced it.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import msgpack


def v1_values(blob: bytes) -> list[Any]:
    """The accumulator list of a version-1 blob; raises ``ValueError`` for anything else."""

    def value(tagged: Any) -> Any:
        tag, payload = tagged
        if tag == "none":
            return None
        if tag == "bool":
            return bool(payload)
        if tag == "int":
            return int(payload)
        if tag == "float":
            return float(payload)
        if tag == "decimal":
            return Decimal(payload)
        if tag == "str":
            if not isinstance(payload, str):
                raise ValueError("str payload is not text")
            return payload
        if tag == "bytes":
            if not isinstance(payload, bytes):
                raise ValueError("bytes payload is not binary")
            return payload
        if tag == "timestamp":
            dt = datetime.fromisoformat(payload)
            if dt.utcoffset() is None:
                raise ValueError("timestamp without an offset")
            return dt.astimezone(timezone.utc)
        if tag == "timestamp_ntz":
            return datetime.fromisoformat(payload)
        if tag == "date":
            return date.fromisoformat(payload)
        if tag == "tuple":
            return tuple(value(x) for x in payload)
        if tag == "set":
            return {value(x) for x in payload}
        raise ValueError(f"unknown version-1 tag {tag!r}")

    entries = msgpack.unpackb(memoryview(blob)[1:], raw=False, use_list=True, strict_map_key=True)
    if not isinstance(entries, list):
        raise ValueError("a version-1 blob holds a list")
    return [value(e) for e in entries]
