"""Write sample input for the example pipelines under ``.ematix/data`` (one file per call and source).

``python -m pipelines.sample_data [--minutes 3] [--days 2] [--close]``: appends ``--minutes`` minutes of clicks
(ending now, each with its customer's ``tier``) to ``.ematix/data/clicks``, of orders to ``.ematix/data/orders-web`` and
``.ematix/data/orders-mobile``, and of card payments to ``.ematix/data/payments`` (a few cards, most
paying several times within 10 minutes). ``--close`` adds one event 10 minutes ahead per source,
which moves the watermark past every window so the running pipelines emit them all.

The backfill asset (``public/user_clicks_1min-backfill``) offers complete past UTC days only, so
minutes ending now give it nothing to rewrite. The first call into an empty clicks directory
therefore also writes the ``--days`` complete UTC days before today (a few hundred clicks each,
spread over the day), one file per day, before the recent minutes. They go into the same directory
because that is the backfill's archive (the pipeline has no ``[backfill] sources``) and because the
stream must pass those days before the backfill accepts them: it refuses a range the streaming state
may still change. Written first, their files have the oldest modification times, so a stream reads
them before the recent minutes (Spark's file source orders files by it) and none of their rows is
late. Later calls add no past day: a stream whose watermark is already past it would count its
rows as late and drop them (failing the late-row check for what is only sample data). To get the
days before a new today, start over: delete ``.ematix/`` (input, checkpoints and state together: a
checkpoint remembers the file names a new directory would reuse). Orders and payments have no
backfill, so no past days.
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
DAY = timedelta(days=1)
PAST_DAYS = 2  # yesterday and the day before: a backfill of either rewrites windows
CLICKS_PER_DAY = 300


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


def _click(rng: random.Random, ts: datetime) -> dict:
    user = rng.randint(1, 5)  # users 1 and 2 are realtime customers (embargoed-clicks publishes their clicks at once)
    return {"user_id": user, "amount": round(rng.uniform(0, 40), 2), "page": f"/p/{rng.randint(1, 8)}",
            "tier": "realtime" if user <= 2 else "standard", "ts": ts}


def past_days(now: datetime, days: int) -> list[datetime]:
    """The starts (UTC midnight) of the ``days`` complete UTC days before ``now``'s day, oldest first."""
    today = now.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return [today - n * DAY for n in range(days, 0, -1)]


def _write_past_days(directory: Path, now: datetime, days: int, rng: random.Random) -> list[Path]:
    """One file of clicks per past day, into a directory holding none yet (see the module's docstring)."""
    if directory.exists() and any(directory.glob("part-*.parquet")):
        return []
    written = []
    for start in past_days(now, days):
        times = sorted(start + timedelta(seconds=rng.uniform(0, DAY.total_seconds())) for _ in range(CLICKS_PER_DAY))
        written.append(_write(directory, [_click(rng, ts) for ts in times], CLICKS))
    return written


def write_sample(minutes: int = 3, close: bool = False, seed: int | None = None, root: Path = DATA,
                 days: int = PAST_DAYS) -> list[Path]:
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
    written.extend(_write_past_days(root / "clicks", end, days, rng))
    clicks = [_click(rng, start + timedelta(seconds=rng.uniform(0, seconds))) for _ in range(20 * minutes)]
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
    parser.add_argument("--days", type=int, default=PAST_DAYS,
                        help="complete past UTC days of clicks for the backfill, written into an empty clicks "
                             "directory only (0: none)")
    parser.add_argument("--close", action="store_true", help="add one event 10 minutes ahead per source")
    args = parser.parse_args(argv)
    for path in write_sample(args.minutes, args.close, days=args.days):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
