"""Write sample input for the example pipelines under ``.ematix/data`` (one file per call and source).

``python -m pipelines.sample_data [--minutes 3] [--close]``: appends ``--minutes`` minutes of clicks
(ending now, each with its customer's ``tier``) to ``.ematix/data/clicks``, of orders to ``.ematix/data/orders-web`` and
``.ematix/data/orders-mobile``, and of card payments to ``.ematix/data/payments`` (a few cards, most
paying several times within 10 minutes). ``--close`` adds one event 10 minutes ahead per source,
which moves the watermark past every window so the running pipelines emit them all.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA = Path(".ematix/data")
CLICKS = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("page", pa.string()), ("tier", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC"))])
ORDERS = pa.schema([("order_id", pa.int64()), ("user_id", pa.int64()), ("amount", pa.float64()),
                    ("ts", pa.timestamp("us", tz="UTC"))])
PAYMENTS = pa.schema([("payment_id", pa.int64()), ("card_id", pa.int64()), ("amount", pa.float64()),
                      ("merchant", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
MERCHANTS = ("grocer", "cafe", "fuel", "books", "pharmacy", "online")


def _write(directory: Path, rows: list[dict], schema: pa.Schema) -> Path:
    """One Parquet file, written atomically, with an mtime after every file already there."""
    directory.mkdir(parents=True, exist_ok=True)
    n = len(list(directory.glob("part-*.parquet")))
    final = directory / f"part-{n:05d}.parquet"
    tmp = directory / f".part-{n:05d}.tmp"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    os.replace(tmp, final)
    mtime = max([time.time()] + [p.stat().st_mtime + 1 for p in directory.glob("part-*.parquet") if p != final])
    os.utime(final, (mtime, mtime))
    return final


def write_sample(minutes: int = 3, close: bool = False, seed: int | None = None, root: Path = DATA) -> list[Path]:
    rng = random.Random(seed)
    end = datetime.now(timezone.utc).replace(microsecond=0)
    start = end - timedelta(minutes=minutes)
    written = []
    if close:
        ahead = end + timedelta(minutes=10)
        written.append(_write(root / "clicks", [{"user_id": 0, "amount": 0.0, "page": "/close", "tier": "realtime", "ts": ahead}], CLICKS))
        for channel in ("web", "mobile"):
            written.append(_write(root / f"orders-{channel}",
                                  [{"order_id": 0, "user_id": 0, "amount": 0.0, "ts": ahead}], ORDERS))
        written.append(_write(root / "payments", [{"payment_id": 0, "card_id": 0, "amount": 0.0, "merchant": "close",
                                                   "ts": ahead}], PAYMENTS))
        return written
    seconds = minutes * 60
    # users 1 and 2 are realtime customers (embargoed-clicks publishes their clicks at once)
    clicks = [{"user_id": (user := rng.randint(1, 5)), "amount": round(rng.uniform(0, 40), 2),
               "page": f"/p/{rng.randint(1, 8)}", "tier": "realtime" if user <= 2 else "standard",
               "ts": start + timedelta(seconds=rng.uniform(0, seconds))} for _ in range(20 * minutes)]
    written.append(_write(root / "clicks", clicks, CLICKS))
    for channel in ("web", "mobile"):
        orders = [{"order_id": rng.randint(1, 10**9), "user_id": rng.randint(1, 50),
                   "amount": round(rng.uniform(5, 200), 2), "ts": start + timedelta(seconds=rng.uniform(0, seconds))}
                  for _ in range(10 * minutes)]
        written.append(_write(root / f"orders-{channel}", orders, ORDERS))
    # a few cards, 4 payments a minute: each card pays several times within any 10 minutes
    payments = [{"payment_id": rng.randint(1, 10**9), "card_id": rng.randint(1, 4),
                 "amount": round(rng.uniform(2, 150), 2), "merchant": rng.choice(MERCHANTS),
                 "ts": start + timedelta(seconds=rng.uniform(0, seconds))} for _ in range(4 * minutes)]
    written.append(_write(root / "payments", payments, PAYMENTS))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=3)
    parser.add_argument("--close", action="store_true", help="add one event 10 minutes ahead per source")
    args = parser.parse_args(argv)
    for path in write_sample(args.minutes, args.close):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
