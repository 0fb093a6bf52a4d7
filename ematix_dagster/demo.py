"""The README's demo: sample click events, then ``pipelines/demo_clicks.toml`` (or another) on them.

Every run adds the next four files of events (30 s of event time each) to ``demo/clicks`` and
runs the pipeline. Window state lives in ``demo/state.db`` (SQLite), so a second run continues
where the first stopped: windows the first run left open (``end_of_input = "keep"``) are
completed and emitted by the second. Delete ``demo/`` to start over.
"""

from __future__ import annotations

import os
import random
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
FILES_PER_RUN = 4


def generate(directory: Path, files: int = FILES_PER_RUN, rows_per_file: int = 50) -> list[Path]:
    """Append ``files`` more files of clicks after those already there, a few rows out of order."""
    directory.mkdir(parents=True, exist_ok=True)
    first = len(list(directory.glob("part-*.parquet")))
    start = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    written = []
    for f in range(first, first + files):
        rng = random.Random(f)
        rows = []
        for i in range(rows_per_file):
            ts = start + timedelta(seconds=30 * f + 30 * i / rows_per_file + rng.uniform(-3, 0))
            rows.append({"user_id": rng.randint(1, 4), "amount": round(rng.uniform(-5, 50), 2),
                         "page": f"/page/{rng.randint(1, 6)}", "ts": ts})
        tmp, final = directory / f".part-{f}.tmp", directory / f"part-{f:04d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp)
        os.replace(tmp, final)
        os.utime(final, (1_700_000_000 + f, 1_700_000_000 + f))  # Spark reads files in mtime order
        written.append(final)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m ematix_dagster.demo [PIPELINE.toml]``: any pipeline that reads ``demo/clicks``."""
    args = sys.argv[1:] if argv is None else argv
    pipeline = Path(args[0]).resolve() if args else PIPELINE
    written = generate(DEMO / "clicks")
    print(f"demo: added {len(written)} files of click events to {DEMO / 'clicks'} "
          f"({written[0].name} .. {written[-1].name})", file=sys.stderr)
    os.chdir(ROOT)
    from ematix_dagster.cli import main as cli

    return cli(["run", str(pipeline)])


if __name__ == "__main__":
    sys.exit(main())
