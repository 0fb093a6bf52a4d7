"""The README's demo: generate sample click events and run ``pipelines/demo_clicks.toml`` (or another).

Each run starts from a fresh ``demo/`` directory (events, checkpoint), because window state is
kept in memory and a run refuses to resume a checkpoint it cannot restore.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "demo"
PIPELINE = ROOT / "pipelines" / "demo_clicks.toml"
SCHEMA = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("page", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC"))])


def generate(directory: Path, files: int = 4, rows_per_file: int = 50, seed: int = 7) -> None:
    """Four files of clicks, 30 s of event time each, a few rows out of order."""
    rng = random.Random(seed)
    start = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    directory.mkdir(parents=True)
    for f in range(files):
        rows = []
        for i in range(rows_per_file):
            ts = start + timedelta(seconds=30 * f + 30 * i / rows_per_file + rng.uniform(-3, 0))
            rows.append({"user_id": rng.randint(1, 4), "amount": round(rng.uniform(-5, 50), 2),
                         "page": f"/page/{rng.randint(1, 6)}", "ts": ts})
        tmp, final = directory / f".part-{f}.tmp", directory / f"part-{f:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp)
        os.replace(tmp, final)
        os.utime(final, (1_700_000_000 + f, 1_700_000_000 + f))


def main(argv: list[str] | None = None) -> int:
    """``python -m ematix_dagster.demo [PIPELINE.toml]``: any pipeline that reads ``demo/clicks``."""
    args = sys.argv[1:] if argv is None else argv
    pipeline = Path(args[0]).resolve() if args else PIPELINE
    if DEMO.exists():
        shutil.rmtree(DEMO)
    generate(DEMO / "clicks")
    os.chdir(ROOT)
    from ematix_dagster.cli import main as cli

    return cli(["run", str(pipeline)])


if __name__ == "__main__":
    sys.exit(main())
