"""Write click events to a Redis stream for ``pipelines/clicks_redis.toml``.

``python -m pipelines.redis_producer [--url redis://127.0.0.1:6379/0] [--stream ematix:clicks]
[--events 1000] [--per-second 0] [--malformed 0]``: appends ``--events`` clicks (``XADD``), each a JSON
document in the entry's ``data`` field with the pipeline's columns (``user_id``, ``amount``,
``page``, ``ts``: the event time, now give or take a few seconds). ``--per-second`` paces them (0:
as fast as Redis takes them, in pipelined batches); ``--malformed`` adds that many entries that are
not JSON, which the pipeline counts and dead-letters. The URL may hold ``${NAME}`` placeholders,
expanded from the environment, so a password need not be typed on the command line.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import datetime, timedelta, timezone

import redis
from redis.typing import EncodableT, FieldT

from ematix_dagster.spec.environment import resolve_env

PAGES = ("home", "search", "product", "cart", "checkout")


def click(now: datetime, rng: random.Random) -> dict[FieldT, EncodableT]:
    ts = now - timedelta(milliseconds=rng.randint(0, 5_000))
    doc = {"user_id": rng.randint(1, 50), "amount": round(rng.uniform(0, 40), 2), "page": rng.choice(PAGES),
           "ts": ts.isoformat()}
    return {"data": json.dumps(doc)}


def produce(url: str, stream: str, events: int, per_second: float = 0, malformed: int = 0, seed: int | None = None) -> int:
    """Append ``events`` clicks (and ``malformed`` bad entries) to ``stream``; return how many entries were added."""
    client = redis.Redis.from_url(resolve_env(url) or url)
    rng = random.Random(seed)
    added = 0
    batch = 1 if per_second else 500
    while added < events:
        pipe = client.pipeline(transaction=False)
        n = min(batch, events - added)
        for _ in range(n):
            pipe.xadd(stream, click(datetime.now(timezone.utc), rng))
        pipe.execute()
        added += n
        if per_second:
            time.sleep(1 / per_second)
    for i in range(malformed):
        client.xadd(stream, {"data": f"not json #{i}"})
    return added + malformed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--stream", default="ematix:clicks")
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--per-second", type=float, default=0)
    parser.add_argument("--malformed", type=int, default=0)
    args = parser.parse_args(argv)
    n = produce(args.url, args.stream, args.events, args.per_second, args.malformed)
    print(f"added {n} entries to stream {args.stream}")


if __name__ == "__main__":
    main()
