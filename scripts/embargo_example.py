"""Run the embargo example (``pipelines/embargoed_clicks.toml``) on four small input files and print the worked
example of docs/contract/row-pipelines.md: per micro-batch the clicks in, the watermark W after the batch and the
clicks it released, then what ``ematix-dagster state`` says about the clicks still held back.

``.venv/bin/python scripts/embargo_example.py [DIRECTORY]``: the pipeline runs in DIRECTORY (a fresh temporary
one by default), unchanged: its paths (``.ematix/...``) are relative to it. Local Spark, no database.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("page", pa.string()), ("tier", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC"))])
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
# (user, tier, seconds after 12:00) per input file, one micro-batch each; users 1 and 2 are realtime customers,
# user 6's click comes from an older file without a tier (NULL: embargoed like any non-realtime one)
BATCHES = [
    [(1, "realtime", 0), (3, "standard", 30), (4, "standard", 60)],
    [(2, "realtime", 300), (3, "standard", 600), (6, None, 120)],
    [(5, "standard", 960)],
    [(1, "realtime", 1570)],
]


def hms(value: datetime | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        value = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=value)
    return value.strftime("%H:%M:%S")


def click(user: int, tier: str | None, at: datetime) -> str:
    return f"u{user} {tier or 'NULL'} {hms(at)}"


def main(directory: Path) -> None:
    from ematix_dagster.operations import summary
    from ematix_dagster.spark.runner import PipelineRunner
    from ematix_dagster.spec import load_pipeline

    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "pipelines" / "embargoed_clicks.toml", directory / "embargoed_clicks.toml")
    os.chdir(directory)
    data = Path(".ematix/data/clicks")
    data.mkdir(parents=True, exist_ok=True)
    for n, rows in enumerate(BATCHES):
        path = data / f"part-{n:05d}.parquet"
        pq.write_table(pa.Table.from_pylist([{"user_id": u, "amount": 1.0, "page": "/p", "tier": tier,
                                              "ts": T0 + timedelta(seconds=s)} for u, tier, s in rows], schema=SCHEMA),
                       path)
        os.utime(path, (1_700_000_000 + n,) * 2)  # one file per micro-batch, in this order
    spec = load_pipeline("embargoed_clicks.toml")
    result = PipelineRunner(spec, progress=lambda line: print(line, file=sys.stderr)).run()

    print("| batch | clicks in (user, tier, event time) | W after the batch | released (in this order) | held back |")
    print("|---|---|---|---|---|")
    for report, rows in zip(result.reports, BATCHES):
        part = Path(spec.target.path) / f"batch_id={report.batch_id}" / "part-0.parquet"
        released = pq.read_table(part).to_pylist() if part.exists() else []
        ins = ", ".join(click(u, t, T0 + timedelta(seconds=s)) for u, t, s in rows)
        outs = ", ".join(click(r["user_id"], r["tier"], r["_event_ts"]) for r in released) or "-"
        print(f"| {report.batch_id} | {ins} | {hms(report.watermark)} | {outs} | {report.count('held_rows')} |")
    print()
    print(json.dumps(summary(spec, windows=False)["pending"], indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="embargo-")))
