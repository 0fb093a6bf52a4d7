#!/usr/bin/env python
"""Entries per second into a pipeline from Redis streams, beside the files source on the same events.

``--events`` click-like events (``key BIGINT, amount DOUBLE, item STRING, ts TIMESTAMP``, event
time increasing with mild disorder), each a JSON document, are fed three ways and read by the same
windowed pipeline (1-minute tumbling windows per key, count + sum(amount), parquet target, SQLite
state, ``available_now``, ``--batches`` micro-batches):

- ``files``: JSON-lines files, one per micro-batch (``max_files_per_trigger = 1``);
- ``redis-1``: one Redis stream, the document in each entry's ``data`` field
  (``max_entries_per_trigger`` = events / batches);
- ``redis-2``: the same events split over two streams of one source.

The stream (or the files) is written before each run, unmeasured. Reported per variant: wall and
CPU (process tree: driver, JVM, Spark's Python workers; the Redis server is outside it) of the
run, entries per wall second, as medians of ``--runs`` runs (variants rotated) after ``--warmup``
unmeasured ones. Needs a Redis at ``--url`` (default the machine's 127.0.0.1:6379); every run uses
fresh stream names and deletes its streams afterwards.

    .venv/bin/python benchmarks/redis_source.py --events 20000 --runs 1 --warmup 0   # smoke
    .venv/bin/python benchmarks/redis_source.py                                      # full
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import redis
import tomli_w

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import CpuMeter  # noqa: E402

from ematix_dagster.spark.runner import PipelineRunner  # noqa: E402
from ematix_dagster.spark.spark_session import get_spark  # noqa: E402
from ematix_dagster.spec import load_pipeline_str  # noqa: E402

SCHEMA = "key BIGINT, amount DOUBLE, item STRING, ts TIMESTAMP"
BASE_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
VARIANTS = ["files", "redis-1", "redis-2"]


def documents(events: int, keys: int, seed: int) -> list[str]:
    """The events as JSON text, 1 ms apart in event time, up to 2 s out of order."""
    rng = np.random.default_rng(seed)
    ts = BASE_MS + np.arange(events) - rng.integers(0, 2_000, events)
    key, amount = rng.integers(0, keys, events), np.round(rng.random(events) * 100, 2)
    return [json.dumps({"key": int(k), "amount": float(a), "item": f"item-{k % 50}",
                        "ts": np.datetime_as_string(np.datetime64(int(t), "ms"), unit="ms") + "Z"})
            for k, a, t in zip(key, amount, ts)]


def feed(variant: str, docs: list[str], batches: int, work: Path, client: redis.Redis) -> dict:
    """Write the events for ``variant``; return its ``[[sources]]`` table."""
    per_batch = -(-len(docs) // batches)
    common = {"name": "events", "schema": SCHEMA, "event_time_column": "ts"}
    if variant == "files":
        data = work / "in"
        data.mkdir()
        for i in range(batches):
            (data / f"part-{i:05d}.json").write_text("\n".join(docs[i * per_batch:(i + 1) * per_batch]) + "\n")
        return {**common, "kind": "files", "format": "json", "path": str(data), "max_files_per_trigger": 1}
    streams = [f"ematix-bench-{uuid.uuid4().hex[:8]}-{i}" for i in range(int(variant[-1]))]
    pipe = client.pipeline(transaction=False)
    for i, doc in enumerate(docs):
        pipe.xadd(streams[i % len(streams)], {"data": doc})
        if i % 5_000 == 4_999:
            pipe.execute()
    pipe.execute()
    url = client.get_connection_kwargs()
    return {**common, "kind": "redis_stream", "url": f"redis://{url['host']}:{url['port']}/{url.get('db', 0)}",
            "streams": streams, "format": "json", "max_entries_per_trigger": per_batch}


def pipeline(source: dict, work: Path) -> str:
    return tomli_w.dumps({
        "pipeline_name": "redis-bench", "sources": [source],
        "transform": {"window": {"kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 5_000, "group_by": ["key"],
                                 "max_groups_per_window": 1_000_000,
                                 "aggregations": [{"agg": "count", "as": "n"},
                                                  {"agg": "sum", "column": "amount", "as": "total"}]}},
        "target": {"kind": "parquet", "path": str(work / "out")},
        "state_store": {"kind": "sqlite", "path": str(work / "state.db")},
        "run": {"checkpoint_location": str(work / "cp"), "end_of_input": "flush"}})


def one_run(variant: str, docs: list[str], args: argparse.Namespace, spark, client: redis.Redis) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="ematix-redis-bench-") as tmp:
        work = Path(tmp)
        source = feed(variant, docs, args.batches, work, client)
        spec = load_pipeline_str(pipeline(source, work))
        try:
            with CpuMeter() as meter:
                start = time.perf_counter()
                summary = PipelineRunner(spec, spark=spark, progress=lambda _: None).run()
                wall = time.perf_counter() - start
        finally:
            for stream in source.get("streams", []):
                client.delete(stream)
        assert summary.rows_in == len(docs), f"{variant}: {summary.rows_in} rows in of {len(docs)}"
        return wall, meter.cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    ap.add_argument("--url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    client = redis.Redis.from_url(args.url)
    docs = documents(args.events, args.keys, args.seed)
    spark = get_spark("ematix-redis-bench")
    measured: dict[str, list[tuple[float, float]]] = {v: [] for v in args.variants}
    for r in range(args.warmup + args.runs):
        for variant in args.variants[r % len(args.variants):] + args.variants[:r % len(args.variants)]:
            wall, cpu = one_run(variant, docs, args, spark, client)
            if r >= args.warmup:
                measured[variant].append((wall, cpu))
            print(f"run {r} {variant}: wall {wall:.1f} s, cpu {cpu:.1f} s", file=sys.stderr, flush=True)
    print(f"{args.events:_} events, {args.batches} micro-batches, medians of {args.runs} runs")
    print("| source | wall s | CPU s | entries / wall s |")
    print("|---|---|---|---|")
    for variant, values in measured.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        print(f"| {variant} | {wall:.1f} | {cpu:.1f} | {args.events / wall:,.0f} |")


if __name__ == "__main__":
    main()
