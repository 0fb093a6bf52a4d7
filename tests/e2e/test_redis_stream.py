"""redis_stream sources against a real Redis and the pandas oracle (docs/contract/redis-streams.md).

Entries are written before the run; ``max_entries_per_trigger`` cuts them into several
micro-batches, which the oracle rebuilds from the checkpoint's offsets (tests/e2e/redis_helpers.py).
"""

from __future__ import annotations

import json

import redis

from tests.e2e.lateness_helpers import at, check_run, make_spec, row, run
from tests.e2e.redis_helpers import RedisFeed, redis_source
from tests.redis_server import stream_name

WINDOW = {"kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 5_000, "late_data": "dlq", "group_by": ["k"],
          "aggregations": [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"}]}


def test_json_payloads_with_payload_event_time_exact(spark, redis_url, tmp_path):
    """JSON documents whose ``ts`` is the event time, late rows and malformed payloads (not JSON, a
    value of the wrong type, no ``data`` field): windows, dead letters and counters as the oracle says."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    stream = stream_name("json")
    feed = RedisFeed(client)
    for i in range(30):
        minute, second = divmod(i * 9, 60)
        feed.json_row("clicks", stream, row(i, f"k{i % 3}", i, at(minute, second), page=f"p{i % 4}"))
        if i in (12, 25):  # minutes behind the watermark by then: late
            feed.json_row("clicks", stream, row(100 + i, "k1", 7, at(0, 5)))
        if i == 5:
            feed.malformed("clicks", stream, {"data": "not json {"}, "not json {")
        if i == 17:
            bad = json.dumps({"id": "seventeen", "k": "k1", "v": 1, "ts": "2024-01-01T00:02:00+00:00"})
            feed.malformed("clicks", stream, {"data": bad}, bad)
        if i == 22:
            feed.malformed("clicks", stream, {"other": "x"}, '{"other":"x"}')
    spec = make_spec(tmp_path, "redis_json", [redis_source("clicks", redis_url, [stream], event_time_column="ts",
                                                           max_entries_per_trigger=7)],
                     WINDOW, dead_letter=True)
    summary, registry = run(spec, spark)
    assert summary.batches >= 5, "seven entries per micro-batch"
    expected = check_run(spec, feed, summary, registry)
    assert expected.counters["malformed:clicks"] == 3 and expected.counters["late_rows"] == 2


def test_fields_payloads_two_streams_broker_time_exact(spark, redis_url, tmp_path):
    """Flat fields cast to the DDL types, two streams in one source, the entry id as event time; a
    field that does not cast makes its entry malformed (its fields as JSON)."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    streams = [stream_name("fields-a"), stream_name("fields-b")]
    feed = RedisFeed(client)
    base = 1_704_067_200_000  # 2024-01-01T00:00:00Z in ms: entry ids carry the event time
    for i in range(24):
        stream = streams[i % 2]
        ms = base + i * 7_000
        fields = {"id": str(i), "k": f"k{i % 2}", "v": str(i * 10), "page": "p"}
        feed.add("orders", stream, fields, {"id": i, "k": f"k{i % 2}", "v": i * 10, "page": "p", "_event_ts": ms * 1000},
                 entry_id=f"{ms}-0")
        if i == 9:
            raw = {"id": "9b", "k": "k1", "v": "1", "page": "p"}
            feed.add("orders", stream, raw, {"_event_ts": None, "_malformed": True,
                                             "_corrupt_record": json.dumps(raw, separators=(",", ":"))},
                     entry_id=f"{ms}-1")
    source = redis_source("orders", redis_url, streams, fmt="fields", max_entries_per_trigger=5)
    source["schema"] = "id BIGINT, k STRING, v BIGINT, page STRING"
    spec = make_spec(tmp_path, "redis_fields", [source], {**WINDOW, "late_data": "drop"}, dead_letter=True)
    summary, registry = run(spec, spark)
    assert summary.batches >= 5
    expected = check_run(spec, feed, summary, registry)
    assert expected.counters["malformed:orders"] == 1
