#!/usr/bin/env python
"""A one-day backfill against streaming the same events (docs/contract/backfill.md).

Data: ``windowed_vs_native.py``'s plain workload (``generated_data.generate``): ``--events`` rows
(default 2,000,000) over ``--keys`` keys (default 10,000) in ``--files`` parquet files (default 20),
all on 2024-01-01, plus one closing file on 2024-01-02 that moves the watermark past the day. The
pipeline: 1-minute tumbling windows per key, count + sum(amount), a PostgreSQL target (schema
``--pg-schema``, dropped before each run), SQLite state, ``[backfill] partition = "daily"``.

Each run streams the files (``streamed``: ``PipelineRunner``, one file per micro-batch, measured),
then backfills 2024-01-01 (``backfill``: ``run_backfill``, measured) over the same files, and
checks that the backfill left the table as the stream wrote it (both count every row: nothing in
the generated data is late). Reported: CPU of the process tree (driver + JVM), the PostgreSQL
backends' CPU apart, wall, and the backfill's CPU over the stream's. Medians of ``--runs`` runs
after ``--warmup`` unmeasured ones.

    .venv/bin/python benchmarks/backfill_day.py --events 200000 --runs 1 --warmup 0   # smoke
    .venv/bin/python benchmarks/backfill_day.py --warmup 1 --runs 3                   # full
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import tomli_w

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import generated_data  # noqa: E402
from generated_data import generate  # noqa: E402
from measure import CpuMeter, PostgresBackends  # noqa: E402
from run_setup import add_data_arguments, settle  # noqa: E402

from ematix_dagster.backfill import run_backfill  # noqa: E402
from ematix_dagster.spark.runner import PipelineRunner  # noqa: E402
from ematix_dagster.spark.spark_session import get_spark  # noqa: E402
from ematix_dagster.spec import load_pipeline_str  # noqa: E402

PIPELINE = "bench-backfill"
DAY = ("2024-01-01", "2024-01-02")


def pipeline_toml(data: Path, work: Path, url: str, schema: str) -> str:
    """``generated_data``'s benchmark pipeline (1-minute tumbling windows, count + sum per key, SQLite
    state), its target a PostgreSQL table, with ``[backfill]``."""
    doc = tomllib.loads(generated_data.pipeline_toml(PIPELINE, data, work, 'kind = "tumbling"\nduration_ms = 60_000',
                                                     1_000_000, "", 'trigger = "available_now"'))
    doc["target"] = {"kind": "postgres", "url": url, "table": f"{schema}.windows", "create_table": True}
    doc["backfill"] = {"partition": "daily", "start": "2024-01-01"}
    return tomli_w.dumps(doc)


def closing_file(data: Path, files: int) -> None:
    """One row on 2024-01-02 00:10, read after the others (its mtime is the latest)."""
    import os

    table = pa.table({"key": pa.array([0], pa.int64()), "amount": [0.0], "item": ["close"],
                      "ts": pa.array([1_704_154_200_000_000], pa.timestamp("us", tz="UTC"))})
    path = data / f"part-{files:05d}.parquet"
    pq.write_table(table, path)
    os.utime(path, (1_700_000_000 + files, 1_700_000_000 + files))


def table_rows(url: str, schema: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        # sums of doubles added in another order (per batch, or at once) differ in the last bits
        return conn.execute(f"SELECT window_start, key, n, round(total::numeric, 6) FROM {schema}.windows "
                            "WHERE window_start < '2024-01-02' ORDER BY 1, 2").fetchall()


def one_run(spark, data: Path, scratch: Path, url: str, schema: str) -> dict[str, tuple[float, float, float]]:
    """(CPU, PG CPU, wall) of the stream and of the backfill."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
    work = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
    spec = load_pipeline_str(pipeline_toml(data, work, url, schema))
    out: dict[str, tuple[float, float, float]] = {}
    backends = PostgresBackends(url)
    try:
        settle(spark)
        with CpuMeter(extra_pids=backends) as meter:
            t0 = time.perf_counter()
            PipelineRunner(spec, spark=spark, progress=lambda line: None).run()
            out["streamed"] = (meter.cpu, meter.extra_cpu, time.perf_counter() - t0)
        streamed = table_rows(url, schema)
        settle(spark)
        with CpuMeter(extra_pids=backends) as meter:
            t0 = time.perf_counter()
            result = run_backfill(spec, *DAY, spark=spark)
            out["backfill"] = (meter.cpu, meter.extra_cpu, time.perf_counter() - t0)
    finally:
        backends.close()
    if table_rows(url, schema) != streamed or result.rows_written != len(streamed):
        print(f"warning: the backfill's {result.rows_written} rows differ from the stream's {len(streamed)}", flush=True)
    print(f"  streamed {out['streamed'][0]:.1f} CPU s (+{out['streamed'][1]:.1f} PG), backfill "
          f"{out['backfill'][0]:.1f} CPU s (+{out['backfill'][1]:.1f} PG), {len(streamed)} window rows", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    ap.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--pg-schema", default="ematix_bench_backfill")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="ematix-backfill-bench-"))
    data = scratch / "data"
    generate(data, args.events, args.keys, args.files, args.items, args.disorder_ms, args.seed)
    closing_file(data, args.files)
    spark = get_spark("ematix-bench-backfill")
    runs = [one_run(spark, data, scratch, args.postgres_url, args.pg_schema) for _ in range(args.warmup + args.runs)]
    measured = runs[args.warmup:]
    med = {name: tuple(statistics.median(r[name][i] for r in measured) for i in range(3)) for name in measured[0]}
    print(f"\nmedian of {args.runs} run(s); {args.events} events on one day, {args.keys} keys, 1-minute windows; "
          "CPU = process tree (driver + JVM), PostgreSQL backends apart")
    print("| variant | CPU s | PG backends CPU s | wall s | CPU / streamed |")
    print("|---|---|---|---|---|")
    for name, (cpu, pg, wall) in med.items():
        print(f"| {name} | {cpu:.1f} | {pg:.1f} | {wall:.1f} | **{cpu / med['streamed'][0]:.2f}** |")
    for name in med:
        print(f"{name}: single runs CPU {' / '.join(f'{r[name][0]:.1f}' for r in measured)} s")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
