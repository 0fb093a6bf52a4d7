#!/usr/bin/env python
"""Append events to a Redis stream at a steady rate, as a process of its own, and report its CPU.

Run by ``latency.py`` (not imported: it loads only redis-py, so its CPU is the producer's alone):

    python benchmarks/stream_producer.py --url redis://127.0.0.1:6379/0 --stream S --rate 1000 --seconds 120

Each entry's ``data`` field holds ``{"key": K, "amount": A, "ts": T}``, ``T`` the event time in
epoch milliseconds: the producer's clock when the entry is sent. The pace is held against the
start, not the previous send: every ``--tick-ms`` it sends what is due by then (``rate`` x elapsed,
less what was sent), in one pipelined round trip, so a late tick catches up instead of drifting.
On exit it prints one JSON line: entries sent, the seconds it ran, CPU seconds of its loop and of
the whole process (imports included), and the most a tick fell behind its schedule.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time

import redis


def produce(client: redis.Redis, stream: str, rate: float, seconds: float, keys: int, tick_s: float,
            seed: int) -> dict[str, float]:
    """Send ``rate`` x ``seconds`` entries, evenly paced; what it did, for the report."""
    rng = random.Random(seed)
    total = int(rate * seconds)
    sent, behind = 0, 0.0
    cpu0, start = time.process_time(), time.time()
    tick = 0
    while sent < total:
        now = time.time()
        due = min(total, int(rate * (now - start))) - sent
        if due > 0:
            ts = int(now * 1000)
            pipe = client.pipeline(transaction=False)
            for _ in range(due):
                doc = f'{{"key":{rng.randrange(keys)},"amount":{rng.randrange(10_000) / 100},"ts":{ts}}}'
                pipe.xadd(stream, {"data": doc})
            pipe.execute()
            sent += due
        tick += 1
        wake = start + tick * tick_s
        lag = time.time() - wake
        if lag > 0:
            behind = max(behind, lag)
            tick = int((time.time() - start) / tick_s)
        else:
            time.sleep(-lag)
    return {"sent": sent, "seconds": time.time() - start, "loop_cpu_s": time.process_time() - cpu0,
            "max_behind_s": behind}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--rate", type=float, required=True, help="entries per second")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--tick-ms", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    report = produce(redis.Redis.from_url(args.url), args.stream, args.rate, args.seconds, args.keys,
                     args.tick_ms / 1000, args.seed)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({**report, "process_cpu_s": usage.ru_utime + usage.ru_stime}), flush=True)


if __name__ == "__main__":
    main()
