"""The redis_stream reader's planning against a real Redis, without Spark: offsets, limits,
available_now's end, trimming and a stream created again (ematix_dagster/spark/sources/redis_source.py).
Whole pipelines on it run in tests/e2e/test_redis_*.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis
from pyspark import cloudpickle
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ematix_dagster.spark.sources.readers import ship_redis_reader
from ematix_dagster.spark.sources.redis_source import RedisStreamDataSource, RedisStreamReader, StreamTrimmed, id_before
from ematix_dagster.spec.environment import public_url
from tests.redis_server import stream_name


def reader(url: str, streams: list[str], **options: str) -> RedisStreamReader:
    return RedisStreamReader({"url": url, "streams": json.dumps(streams), **options})


def entries(r: RedisStreamReader, start: dict, end: dict) -> list[tuple[str, str]]:
    rows = [row for p in r.partitions(start, end) for batch in r.read(p) for row in batch.to_pylist()]
    return [(row["stream"], row["entry_id"]) for row in rows]


def test_ids_and_urls():
    assert id_before("5-3") == "5-2" and id_before("5-0") == f"4-{2**64 - 1}" and id_before("0-0") == "0-0"
    assert public_url("redis://user:secret@host:6379/0") == "redis://host:6379/0"


def test_the_reader_reaches_spark_workers_without_the_package():
    """Spark pickles the data source for its Python workers: unpickled in a fresh interpreter, it
    must bring in nothing of ematix_dagster (a cluster's workers need not have it)."""
    ship_redis_reader()
    code = ("import pickle, sys; source = pickle.loads(sys.stdin.buffer.read()); "
            "print(source.__name__, sorted(m for m in sys.modules if m.split('.')[0] == 'ematix_dagster'))")
    out = subprocess.run([sys.executable, "-c", code], input=cloudpickle.dumps(RedisStreamDataSource),
                         capture_output=True, check=True)
    assert out.stdout.decode().strip() == "RedisStreamDataSource []", out.stdout + out.stderr


def test_a_limit_takes_the_oldest_ids_of_all_streams_and_a_replay_reads_the_same(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    a, b = stream_name("limit-a"), stream_name("limit-b")
    for ms in (1, 2, 5, 6):
        client.xadd(a, {"v": str(ms)}, id=f"{ms}-0")
    for ms in (3, 4, 7):
        client.xadd(b, {"v": str(ms)}, id=f"{ms}-0")
    r = reader(redis_url, [a, b], max_entries="4")
    assert r.getDefaultReadLimit() == ReadMaxRows(4)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(4))
    assert entries(r, start, end) == [(a, "1-0"), (a, "2-0"), (b, "3-0"), (b, "4-0")]
    assert entries(r, start, end) == entries(r, start, end), "a replayed batch reads the same entries"
    rest = r.latestOffset(end, ReadAllAvailable())
    assert entries(r, end, rest) == [(a, "5-0"), (a, "6-0"), (b, "7-0")]
    assert r.latestOffset(rest, ReadAllAvailable()) == rest, "nothing new: the same offset"


def test_available_now_stops_at_what_the_stream_held_when_it_began(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    s = stream_name("now")
    client.xadd(s, {"v": "1"}, id="1-0")
    r = reader(redis_url, [s])
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    client.xadd(s, {"v": "2"}, id="2-0")
    end = r.latestOffset(start, ReadAllAvailable())
    assert entries(r, start, end) == [(s, "1-0")]


def test_trimmed_and_recreated_streams(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    s = stream_name("gone")
    for ms in range(1, 4):
        client.xadd(s, {"v": str(ms)}, id=f"{ms}-0")
    r = reader(redis_url, [s])
    read = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    for ms in range(4, 9):
        client.xadd(s, {"v": str(ms)}, id=f"{ms}-0")
    client.xtrim(s, maxlen=2, approximate=False)  # 4, 5 and 6 were never read
    with pytest.raises(StreamTrimmed, match="3 entries it has not read"):
        r.latestOffset(read, ReadAllAvailable())
    skipping = reader(redis_url, [s], on_trimmed="skip")
    end = skipping.latestOffset(read, ReadAllAvailable())
    assert end[s]["skipped"] == 3 and entries(skipping, read, end) == [(s, "7-0"), (s, "8-0")]
    client.delete(s)
    client.xadd(s, {"v": "9"}, id="9-0")
    with pytest.raises(StreamTrimmed, match="deleted and created again"):
        r.latestOffset(end, ReadAllAvailable())
    again = skipping.latestOffset(end, ReadAllAvailable())
    assert entries(skipping, end, again) == [(s, "9-0")]


def triggers(r: RedisStreamReader, offset: dict, count: int) -> tuple[dict, list[tuple[str, str]]]:
    """``count`` batches of at most 2 entries from ``offset``: the last offset, and what they read."""
    read = []
    for _ in range(count):
        end = r.latestOffset(offset, ReadMaxRows(2))
        read += entries(r, offset, end)
        offset = end
    return offset, read


@pytest.mark.parametrize("on_trimmed", ["fail", "skip"])
def test_an_xdel_is_looked_for_only_when_an_entry_left_the_stream_since(redis_url, monkeypatch, on_trimmed):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    s = stream_name(f"xdel-{on_trimmed}")
    for ms in range(1, 11):
        client.xadd(s, {"v": str(ms)}, id=f"{ms}-0")
    client.xdel(s, "8-0")  # before the pipeline began: no gap in what it reads, yet past its offset for a while
    r = reader(redis_url, [s], max_entries="2", on_trimmed=on_trimmed)
    scans: list[str] = []
    count_after = r._count_after
    monkeypatch.setattr(r, "_count_after", lambda stream, after: scans.append(after) or count_after(stream, after))
    offset, read = triggers(r, r.initialOffset(), 2)
    assert read == [(s, f"{ms}-0") for ms in range(1, 5)] and scans == []  # nothing left the stream since
    client.xdel(s, "6-0")  # not read yet, and below the max deleted id (8-0), which does not change
    if on_trimmed == "fail":
        with pytest.raises(StreamTrimmed, match="1 entries it has not read"):
            r.latestOffset(offset, ReadMaxRows(2))
        return
    offset, read = triggers(r, offset, 3)
    assert read == [(s, "5-0"), (s, "7-0"), (s, "9-0"), (s, "10-0")] and offset[s]["skipped"] == 1
    assert scans == ["4-0"]  # once, for the XDEL; not again while the offset was still before 8-0
