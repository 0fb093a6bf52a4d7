#!/usr/bin/env python
"""A row pipeline holding rows back with ``WATERMARK_TS()`` against the same pipeline without the delay.

Data: ``windowed_vs_native.py``'s plain workload (``generated_data.generate``): ``--events`` rows
(default 2,000,000) over ``--keys`` keys (default 10,000) in ``--files`` parquet files (default 20,
so 20 micro-batches of 100,000 rows), each file the next 60 s of event time. The pipeline is a row
pipeline (``windowed_engines.row_spec``: no ``[transform.window]``, the plain workload's lateness of
5 s, parquet target, ``trigger = "available_now"``, one file per micro-batch), its SQL either

- ``delayed``: ``SELECT key, amount, item, ts FROM source WHERE ts + INTERVAL <D> SECONDS <= WATERMARK_TS()``
  (``--delay-s`` D, default 10): a row waits in the state store until the watermark is D past its
  event time, so after each batch the rows of its last D + 5 s (lateness) of event time are pending,
  (D + 5) / 60 of a batch (25 % at D = 10); or
- ``not_delayed``: ``SELECT key, amount, item, ts FROM source``: every row written in its batch;

each with the SQLite store (a fresh file per run) or the PostgreSQL store (``--postgres-url``, in
the schema ``--pg-schema``, dropped before each run and at the end). Variants (``--variants``):
``not_delayed/sqlite``, ``delayed/sqlite``, ``not_delayed/postgres``, ``delayed/postgres``.

Reported per variant: CPU (process tree: the driver, the JVM), the CPU of the PostgreSQL backends
serving the run (outside the tree: ``measure.PostgresBackends``), wall, p50/p95 batch latency, peak
RSS, the driver callback's CPU, rows written (the parquet target, read after the measurement), the
pending share after each batch (rows held / the batch's rows), the peak of the rows held (the
runner's ``RowCounts.held_rows``), the pending rows' payload bytes per row (the store's
``pending_summary`` after the run, outside the measurement: the rows pending after the last batch)
and their on-disk bytes per row (PostgreSQL: ``pg_total_relation_size`` of the pending table, its
index, TOAST and the released rows not yet vacuumed included, and again after ``VACUUM FULL``;
SQLite: ``dbstat`` of the table and its index), and the CPU
of each delayed variant over the not-delayed one with the same store. Medians of ``--runs`` runs,
the variants' order rotated from run to run, after ``--warmup`` unmeasured runs of each on the same
data. ``--profile`` adds one cProfile'd run of ``--profile-variant`` (default ``delayed/sqlite``).

    .venv/bin/python benchmarks/delayed_rows.py --events 200000 --runs 1 --warmup 0   # smoke, ~2 min
    .venv/bin/python benchmarks/delayed_rows.py --warmup 1 --runs 3                   # full
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import MB, PostgresBackends, percentile, spark_jobs  # noqa: E402
from results import Result, median_result, print_splits  # noqa: E402
from run_setup import add_data_arguments, add_variant_arguments, install_timers, prepare, rotated_runs  # noqa: E402
from windowed_engines import profile_run, row_spec, run_spec, target_rows  # noqa: E402

from ematix_dagster.stores import make_store  # noqa: E402
from state_store.names import PENDING_EVENT_TS_INDEX, PENDING_TABLE  # noqa: E402

PIPELINE = "bench-rows"
COLUMNS = "key, amount, item, ts"
VARIANTS = ("not_delayed/sqlite", "delayed/sqlite", "not_delayed/postgres", "delayed/postgres")
#: driver thread CPU in our code: the batch's callback
CALLBACK = "foreachBatch callback"


def sql_of(variant: str, delay_s: int) -> str:
    if variant.startswith("delayed"):
        return f"SELECT {COLUMNS} FROM source WHERE ts + INTERVAL {delay_s} SECONDS <= WATERMARK_TS()"
    return f"SELECT {COLUMNS} FROM source"


def reset_schema(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def pending_figures(spec, work: Path) -> dict[str, float]:
    """The pending rows after the run (outside the measurement): count, payload and on-disk bytes."""
    store = make_store(spec.state_store)
    store.open()
    try:
        summary = store.pending_summary(PIPELINE)
    finally:
        store.close()
    out = {"pending_end": float(summary.rows), "payload_bytes": float(summary.payload_bytes)}
    cfg = spec.state_store
    if cfg.kind == "postgres":
        import psycopg

        table = f"{cfg.schema}.{PENDING_TABLE}"
        with psycopg.connect(cfg.url, autocommit=True) as conn:
            sizes = "SELECT pg_total_relation_size(%s::regclass), pg_relation_size(%s::regclass)"
            total, heap = conn.execute(sizes, (table, table)).fetchone()
            # the rows the run released are dead until a vacuum: compacted, only the pending rows remain
            conn.execute(f"VACUUM FULL {table}")
            compact = conn.execute(sizes, (table, table)).fetchone()[0]
        out["disk_bytes"], out["heap_bytes"], out["compact_bytes"] = float(total), float(heap), float(compact)
    else:
        conn = sqlite3.connect(work / "state.db")
        try:
            row = conn.execute("SELECT sum(pgsize) FROM dbstat WHERE name IN (?, ?)",
                               (PENDING_TABLE, PENDING_EVENT_TS_INDEX)).fetchone()
            out["disk_bytes"] = float(row[0] or 0)
        except sqlite3.OperationalError:  # built without dbstat
            pass
        finally:
            conn.close()
    return out


def shares(r: Result) -> list[float]:
    """Rows pending after each batch over the batch's rows."""
    return [held / rows_in for rows_in, _, held in r.row_batches if rows_in]


def per_row(r: Result, key: str) -> float:
    return r.extra[key] / r.extra["pending_end"] if r.extra.get("pending_end") and key in r.extra else float("nan")


def report(args: argparse.Namespace, results: dict[str, list[Result]]) -> None:
    med = {k: median_result(v) for k, v in results.items()}
    print(f"\nmedian of {args.runs} run(s); {args.events} events, {args.keys} keys, {args.files} micro-batches of "
          f"{args.events // args.files} rows (60 s of event time each), lateness 5 s, delay {args.delay_s} s; "
          "parquet target; CPU = process tree (driver + JVM), PostgreSQL backends apart")
    print("| variant | CPU s | PG backends CPU s | wall s | p50 / p95 batch s | peak RSS MB | driver callback CPU s "
          "| rows written | pending after a batch min / median / max | peak buffered rows | payload B / row "
          "| on-disk B / row | on-disk B / row after VACUUM FULL | CPU / not delayed | (CPU + PG) / not delayed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in med.items():
        runs = results[name]
        callback = statistics.median(s.splits.get(CALLBACK, (0, 0.0, 0.0))[1] for s in runs)
        written = statistics.median(s.rows_by_kind.get("row", 0) for s in runs)
        share = shares(runs[0])
        share_text = (f"{min(share):.1%} / {statistics.median(share):.1%} / {max(share):.1%}"
                      if share and max(share) else "-")
        peak = max(max((held for *_, held in s.row_batches), default=0) for s in runs)
        base = med.get("not_delayed/" + name.split("/")[1])
        ratio = f"**{r.cpu / base.cpu:.2f}**" if base and name.startswith("delayed") else "-"
        ratio_pg = (f"{(r.cpu + r.extra_cpu) / (base.cpu + base.extra_cpu):.2f}"
                    if base and name.startswith("delayed") and name.endswith("postgres") else "-")
        payload = statistics.median(per_row(s, "payload_bytes") for s in runs)
        disk = statistics.median(per_row(s, "disk_bytes") for s in runs)
        compact = statistics.median(per_row(s, "compact_bytes") for s in runs)
        pg = f"{r.extra_cpu:.1f}" if name.endswith("postgres") else "-"
        print(f"| {name} | {r.cpu:.1f} | {pg} | {r.wall:.1f} | {percentile(r.latencies, .5):.3f} / "
              f"{percentile(r.latencies, .95):.3f} | {r.peak_rss / MB:.0f} | {callback:.2f} | {written:.0f} "
              f"| {share_text} | {peak} | {'-' if payload != payload else f'{payload:.1f}'} "
              f"| {'-' if disk != disk else f'{disk:.0f}'} | {'-' if compact != compact else f'{compact:.0f}'} "
              f"| {ratio} | {ratio_pg} |")
    for name, runs in results.items():
        print(f"{name}: single runs CPU {' / '.join(f'{r.cpu:.1f}' for r in runs)} s"
              + (f", PG backends {' / '.join(f'{r.extra_cpu:.1f}' for r in runs)} s" if name.endswith("postgres")
                 else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    add_variant_arguments(ap, list(VARIANTS), "delayed/sqlite")
    ap.add_argument("--delay-s", type=int, default=10, help="D in ts + INTERVAL D SECONDS <= WATERMARK_TS()")
    ap.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--pg-schema", default="ematix_bench", help="the PostgreSQL store's schema (dropped before each run)")
    args = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="ematix-rows-bench-", dir=args.scratch))
    data = scratch / "data"
    uses_pg = any(v.endswith("postgres") for v in args.variants + [args.profile_variant] * args.profile)
    backends = PostgresBackends(args.postgres_url) if uses_pg else None
    try:
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        spark = prepare(args, data)
        timer = install_timers()

        def run(variant: str, verbose: bool = False) -> Result:
            work = Path(tempfile.mkdtemp(prefix="rows-", dir=scratch))
            postgres = variant.endswith("postgres")
            if postgres:
                reset_schema(args.postgres_url, args.pg_schema)
            spec = row_spec(data, work, sql_of(variant, args.delay_s),
                            max_buffered_rows=args.events if variant.startswith("delayed") else None,
                            postgres_url=args.postgres_url if postgres else None,
                            schema=args.pg_schema if postgres else None)
            jobs, stages = spark_jobs(spark)
            r = run_spec(spark, spec, "rows", timer, verbose, postgres=backends if postgres else None)
            now = spark_jobs(spark)
            r.engine, r.jobs, r.stages = variant, now[0] - jobs, now[1] - stages
            r.rows_by_kind = target_rows(work / "target")
            r.extra = pending_figures(spec, work)
            # every row is written once or still pending, none filtered, none twice
            written, pending = r.rows_by_kind.get("row", 0), int(r.extra["pending_end"])
            if written != r.rows_out or written + pending != r.rows_in or r.row_batches[-1][2] != pending:
                print(f"    WARNING: rows in {r.rows_in}, written {written} (reports: {r.rows_out}), pending "
                      f"{pending} (last report: {r.row_batches[-1][2]})", flush=True)
            shutil.rmtree(work, ignore_errors=True)
            return r

        def after(r: Result) -> None:
            held = [h for *_, h in r.row_batches]
            print(f"          pending after each batch: {' '.join(f'{s:.1%}' for s in shares(r))} (peak "
                  f"{max(held, default=0)} rows); pending after the run {r.extra['pending_end']:.0f} rows, "
                  f"{per_row(r, 'payload_bytes'):.1f} payload B/row, "
                  + (f"{per_row(r, 'disk_bytes'):.0f} on-disk B/row" if "disk_bytes" in r.extra else "")
                  + (f" (heap alone {per_row(r, 'heap_bytes'):.0f}; after VACUUM FULL "
                     f"{per_row(r, 'compact_bytes'):.0f})" if "heap_bytes" in r.extra else "")
                  + f"; rows written {r.rows_by_kind.get('row', 0)}", flush=True)
            print(f"          {r.jvm_line()}", flush=True)
            print_splits(r)

        results = rotated_runs(args.variants, args.warmup, args.runs, run, args.verbose, after)

        if args.profile:
            profile_run(timer, args.profile_top, args.profile_out, lambda: run(args.profile_variant))

        report(args, results)
        return 0
    finally:
        if backends is not None:
            backends.close()
            reset_schema(args.postgres_url, args.pg_schema)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
