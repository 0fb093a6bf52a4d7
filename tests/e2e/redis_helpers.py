"""Feeding Redis streams and telling the oracle what each micro-batch read.

A redis_stream source's offset (line ``i`` of the checkpoint's ``offsets/N``) holds, per stream,
the id of the last entry the batch took; batch N read the ids after batch N-1's (after ``0-0``
for batch 0: these tests start at ``earliest``). :meth:`RedisFeed.batches` rebuilds the batches
from that alone, without the engine's code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import redis

from ematix_dagster.spark.input.checkpoint import read_offsets
from tests import oracle
from tests.e2e.lateness_helpers import us


def id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


class RedisFeed:
    """Entries written to streams, each with the row the oracle expects from it."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.rows: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}  # (source, stream) -> [(id, row)]

    def add(self, source: str, stream: str, fields: dict[str, str], row: dict[str, Any], entry_id: str = "*") -> str:
        added = self.client.xadd(stream, fields, id=entry_id)
        entry = added.decode() if isinstance(added, bytes) else added
        self.rows.setdefault((source, stream), []).append((entry, {**row, "_source": source}))
        return entry

    def json_row(self, source: str, stream: str, r: dict[str, Any]) -> str:
        """A valid entry: the row as a JSON document in the ``data`` field, ``ts`` as ISO text."""
        doc = {**r, "ts": r["ts"].isoformat() if r["ts"] is not None else None}
        return self.add(source, stream, {"data": json.dumps(doc)},
                        {**{k: v for k, v in r.items() if k != "ts"}, "_event_ts": us(r["ts"])})

    def malformed(self, source: str, stream: str, fields: dict[str, str], raw: str) -> str:
        return self.add(source, stream, fields, {"_event_ts": None, "_malformed": True, "_corrupt_record": raw})

    def batches(self, cp: str, sources: list[str]) -> list[oracle.Batch]:
        """Each micro-batch's entries: per stream, the ids in (previous offset, this offset]."""
        n = len([p for p in (Path(cp) / "offsets").iterdir() if p.name.isdigit()])
        before: dict[tuple[str, str], tuple[int, int]] = {}
        out, read = [], 0
        for batch_id in range(n):
            offsets = read_offsets(cp, batch_id)
            rows: list[dict[str, Any]] = []
            for i, source in enumerate(sources):
                for stream, offset in json.loads(offsets.offsets[i]).items():
                    low, high = before.get((source, stream), (0, 0)), id_key(offset["id"])
                    rows += [r for entry, r in self.rows.get((source, stream), []) if low < id_key(entry) <= high]
                    before[(source, stream)] = high
            read += len(rows)
            out.append(oracle.Batch(pd.DataFrame(rows, dtype=object), offsets.batch_timestamp_ms * 1_000))
        total = sum(len(r) for r in self.rows.values())
        assert read == total, f"every entry was read by exactly one batch: {read} read of {total}"
        return out


def redis_source(name: str, url: str, streams: list[str], fmt: str = "json", **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "redis_stream", "url": url, "streams": streams, "format": fmt,
            "schema": "id BIGINT, k STRING, v BIGINT, page STRING, ts TIMESTAMP", **extra}
