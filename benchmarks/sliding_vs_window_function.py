#!/usr/bin/env python
"""Our sliding windows (docs/contract/windows.md) vs a one-shot Spark window function, same data, same process.

Data: ``--events`` rows (default 2,000,000) over ``--keys`` keys (default 10,000) in ``--files``
parquet files (default 20: one file = one micro-batch of ours), columns ``key BIGINT, amount
DOUBLE, item STRING, ts TIMESTAMP``, made by ``generated_data.generate``: each file covers the
next 60 s of event time with up to ``--disorder-ms`` of disorder inside the 5 s lateness, so no row
is late and every window is created while open. Event times are in µs (nearly every row has an
event time of its own); ``--tick-ms N`` rounds them down to multiples of N ms so that rows share
event times (``disorder + tick`` must stay within the lateness).

Per key, one window ``[t - D, t]`` (both bounds inclusive) per distinct event time ``t``,
D = ``--duration-ms`` (default 300,000 = 5 min). Workloads (``--workload``): ``plain`` = count (n)
+ sum(amount) (total); ``distinct`` = those + exact count_distinct(item) (items) + max(amount) (top).

- ``ours``: a pipeline spec (``kind = "sliding"``, group_by key, lateness 5 s, parquet target,
  SQLite state store, ``trigger = "available_now"``, ``end_of_input = "flush"`` so every window is
  emitted) run by ``PipelineRunner(spec, spark=spark).run()``;
- ``window_fn``: a Spark batch job over the same files: one row per distinct (key, ts) with the
  partial aggregates, then a window function per key ordered by ``unix_micros(ts)`` over
  ``RANGE BETWEEN D(µs) PRECEDING AND CURRENT ROW`` (count = sum of the counts, sum of sums,
  max of maxima, size of the union of the per-ts item sets), written to a parquet directory.

After the timed runs, the outputs of each engine's last run are compared: ours read from every
``batch_id=*/`` file of the target, keeping the latest row per (window_start, key) (by batch_id,
the end-of-input flush file after the batch's own, then ``_emit_seq`` when present; a latest
``retract`` drops the window), against the baseline's rows (window_end = ts, window_start =
ts - D); counts, distinct counts and maxima must be equal, sums within a relative 1e-9. The script
exits with 1 when they differ.

Reported: CPU (process tree) and wall, peak driver + JVM RSS, our driver-side split (merge =
``Engine.process`` + ``convert.partial_lists`` + ``Engine.flush``; callback = the Python driver's
thread CPU in the foreachBatch callback and the flush) and ours / window_fn CPU: medians of
``--runs`` runs after ``--warmup`` unmeasured runs of both, the order alternated run by run.

    .venv/bin/python benchmarks/sliding_vs_window_function.py --events 50000 --keys 500 --files 5 --runs 1 --warmup 0  # smoke, ~1 min
    .venv/bin/python benchmarks/sliding_vs_window_function.py --events 50000 --keys 500 --files 5 --runs 1 --warmup 0 \
        --tick-ms 1000 --duration-ms 60000 --workload distinct  # smoke: shared event times, rows on the lower bound
    .venv/bin/python benchmarks/sliding_vs_window_function.py  # full (2,000,000 events, 3 runs after 1 warm-up)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generated_data import LATENESS_MS, SCHEMA_DDL, pipeline_toml  # noqa: E402
from measure import MB, CpuMeter, DriverTimer  # noqa: E402
from results import Result, median_result, print_splits  # noqa: E402
from run_setup import add_data_arguments, install_timers, prepare, settle  # noqa: E402
from windowed_engines import profile_run  # noqa: E402

from ematix_dagster.spark.batch.batch_step import BatchStep  # noqa: E402
from ematix_dagster.spark.runner import PipelineRunner  # noqa: E402
from ematix_dagster.spec import load_pipeline_str  # noqa: E402
from ematix_dagster.streaming.micro_batch import Engine  # noqa: E402

WORKLOADS = ("plain", "distinct")
ENGINES = ("ours", "window_fn")
MERGE = ("Engine.process", "convert.partial_lists", "Engine.flush")
CALLBACK = ("foreachBatch callback", "end-of-input flush")
REL_TOL = 1e-9
#: Output columns compared (besides the window bounds and key), per workload.
COLUMNS = {"plain": ("n", "total"), "distinct": ("n", "total", "items", "top")}


# ---------------------------------------------------------------------------------------------
# ours


def our_spec(data: Path, work: Path, args: argparse.Namespace):
    distinct = """
[[transform.window.aggregations]]
agg = "count_distinct"
column = "item"
as = "items"
mode = "exact"
max_distinct_values_per_group = 100_000

[[transform.window.aggregations]]
agg = "max"
column = "amount"
as = "top"
""" if args.workload == "distinct" else ""
    shape = (f'kind = "sliding"\nduration_ms = {args.duration_ms}\n'
             f'max_events_per_group = {args.max_events_per_group}')
    toml = pipeline_toml("bench-sliding", data, work, shape, max(args.keys, 1_000), distinct,
                         'trigger = "available_now"\nend_of_input = "flush"')
    return load_pipeline_str(toml)


def run_ours(spark, data: Path, work: Path, args: argparse.Namespace, timer: DriverTimer) -> Result:
    spec = our_spec(data, work, args)
    timer.reset()
    settle(spark)
    progress = (lambda line: print("   ", line, flush=True)) if args.verbose else (lambda line: None)
    with CpuMeter() as meter:
        t0 = time.perf_counter()
        summary = PipelineRunner(spec, spark=spark, progress=progress).run()
        wall = time.perf_counter() - t0
    if summary.late_rows:
        print(f"    note: {summary.late_rows} late rows (none expected)", flush=True)
    return Result("ours", args.workload, meter.cpu, wall, meter.peak_rss, summary.batches, summary.rows_in,
                  summary.windows_emitted, meter.by_process(), [r.seconds for r in summary.reports],
                  sum(timer.cpu[k] for k in MERGE),
                  {k: (timer.calls[k], timer.cpu[k], timer.wall[k]) for k in timer.calls})


# ---------------------------------------------------------------------------------------------
# the baseline: a Spark window function over the distinct (key, ts)


def window_fn_frame(spark, data: Path, args: argparse.Namespace):
    """One row per distinct (key, ts): the aggregates of the key's rows with event time in [ts - D, ts]."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    d_us = args.duration_ms * 1_000
    aggs = [F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total")]
    if args.workload == "distinct":
        aggs += [F.collect_set("item").alias("items"), F.max("amount").alias("top")]
    per_ts = spark.read.schema(SCHEMA_DDL).parquet(str(data)).groupBy("key", "ts").agg(*aggs)
    w = Window.partitionBy("key").orderBy(F.unix_micros("ts")).rangeBetween(-d_us, 0)  # both bounds inclusive
    cols = [F.timestamp_micros(F.unix_micros("ts") - F.lit(d_us)).alias("window_start"),
            F.col("ts").alias("window_end"), "key",
            F.sum("n").over(w).alias("n"), F.sum("total").over(w).alias("total")]
    if args.workload == "distinct":
        cols += [F.size(F.array_distinct(F.flatten(F.collect_list("items").over(w)))).cast("bigint").alias("items"),
                 F.max("top").over(w).alias("top")]
    return per_ts.select(*cols)


def run_window_fn(spark, data: Path, work: Path, args: argparse.Namespace) -> Result:
    settle(spark)
    out = work / "out"
    with CpuMeter() as meter:
        t0 = time.perf_counter()
        window_fn_frame(spark, data, args).write.mode("overwrite").parquet(str(out))
        wall = time.perf_counter() - t0
    rows_out = spark.read.parquet(str(out)).count()  # untimed
    return Result("window_fn", args.workload, meter.cpu, wall, meter.peak_rss, 1, args.events, rows_out,
                  meter.by_process(), [wall])


# ---------------------------------------------------------------------------------------------
# equality


def latest_windows(spark, target: Path):
    """Our target's rows, the latest per (window_start, key); windows whose latest row retracts dropped."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ours = (spark.read.parquet(str(target))  # batch_id from the batch_id=N directories
            .withColumn("_flush", F.input_file_name().contains("/flush.parquet").cast("int")))
    order = [F.col("batch_id").desc(), F.col("_flush").desc()]
    if "_emit_seq" in ours.columns:
        order.append(F.col("_emit_seq").desc())
    latest = (ours.withColumn("_rank", F.row_number().over(Window.partitionBy("window_start", "key").orderBy(*order)))
              .filter(F.col("_rank") == 1))
    kinds = {r["_emit_kind"]: r["count"] for r in ours.groupBy("_emit_kind").count().collect()}
    return latest.filter(F.col("_emit_kind") != "retract"), ours.count(), kinds


def check_equal(spark, target: Path, baseline: Path, args: argparse.Namespace) -> bool:
    from pyspark.sql import functions as F

    ours, rows_read, kinds = latest_windows(spark, target)
    base = spark.read.parquet(str(baseline))
    cols = COLUMNS[args.workload]
    o = ours.select("key", "window_start", "window_end", *cols).alias("o")
    b = base.select("key", "window_start", "window_end", *cols).alias("b")
    joined = o.join(b, (F.col("o.key") == F.col("b.key")) & (F.col("o.window_end") == F.col("b.window_end")),
                    "full_outer")
    missing = F.col("o.key").isNull() | F.col("b.key").isNull()
    wrong = [F.col("o.window_start") != F.col("b.window_start")]
    for c in cols:
        ov, bv = F.col(f"o.{c}"), F.col(f"b.{c}")
        if c == "total":
            wrong.append(F.abs(ov - bv) > F.lit(REL_TOL) * F.greatest(F.abs(ov), F.abs(bv)))
        else:
            wrong.append(~ov.eqNullSafe(bv))
    bad = F.lit(False)
    for cond in wrong:
        bad = bad | F.coalesce(cond, F.lit(True))
    flagged = joined.withColumn("_missing", missing).withColumn("_bad", missing | bad)
    counts = flagged.agg(F.count(F.col("o.key")).alias("ours"), F.count(F.col("b.key")).alias("base"),
                         F.sum(F.col("o.key").isNull().cast("int")).alias("only_base"),
                         F.sum(F.col("b.key").isNull().cast("int")).alias("only_ours"),
                         F.sum(F.col("_bad").cast("int")).alias("bad")).first()
    distinct_ts = spark.read.schema(SCHEMA_DDL).parquet(str(args.data)).select("key", "ts").distinct().count()
    equal = counts["bad"] == 0
    print(f"\nequality: ours {counts['ours']} windows (from {rows_read} rows read, kinds {kinds}), "
          f"window_fn {counts['base']} windows, distinct (key, ts) in the input {distinct_ts}; "
          f"only in ours {counts['only_ours']}, only in window_fn {counts['only_base']}, "
          f"differing {counts['bad'] - counts['only_ours'] - counts['only_base']}: "
          f"{'EQUAL' if equal else 'NOT EQUAL'}", flush=True)
    if not equal:
        sample = flagged.filter("_bad").orderBy(F.coalesce(F.col("o.key"), F.col("b.key")),
                                                F.coalesce(F.col("o.window_end"), F.col("b.window_end")))
        for r in sample.limit(args.show_diffs).collect():
            print("   ", {f"{side}.{k}": r[i] for i, (side, k) in
                          enumerate([(s, k) for s in "ob" for k in ("key", "window_start", "window_end", *cols)])})
    return equal


# ---------------------------------------------------------------------------------------------


def report(args: argparse.Namespace, results: dict[str, list[Result]], equal: bool | None) -> None:
    med = {k: median_result(v) for k, v in results.items()}
    print(f"\nmedian of {args.runs} run(s); {args.events} events, {args.keys} keys, {args.files} micro-batches, "
          f"sliding windows of {args.duration_ms} ms, workload {args.workload}, tick {args.tick_ms or 'µs'}; "
          f"ours: SQLite state, parquet target; window_fn: Spark batch, parquet output; CPU = process tree")
    print("| engine | CPU s | wall s | peak RSS MB | windows | driver merge CPU s (share) | driver callback CPU s (share) |")
    print("|---|---|---|---|---|---|---|")
    for engine, r in med.items():
        merge = callback = "-"
        if engine == "ours":
            merge = f"{r.merge_cpu:.2f} ({r.merge_cpu / r.cpu:.1%})"
            cb = statistics.median(sum(s.splits.get(k, (0, 0.0, 0.0))[1] for k in CALLBACK) for s in results[engine])
            callback = f"{cb:.2f} ({cb / r.cpu:.1%})"
        print(f"| {engine} | {r.cpu:.1f} | {r.wall:.1f} | {r.peak_rss / MB:.0f} | {r.rows_out} | {merge} | {callback} |")
    ours, base = med.get("ours"), med.get("window_fn")
    if ours and base:
        print(f"\nours / window_fn: CPU {ours.cpu / base.cpu:.2f}, wall {ours.wall / base.wall:.2f}; "
              f"outputs {'equal' if equal else 'NOT EQUAL' if equal is False else 'not compared'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    ap.add_argument("--workload", choices=WORKLOADS, default="plain")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    ap.add_argument("--duration-ms", type=int, default=300_000, help="D: each window is [t - D, t]")
    ap.add_argument("--max-events-per-group", type=int, default=100_000)
    ap.add_argument("--tick-ms", type=int, default=0, help="round event times down to multiples of this (0: µs)")
    ap.add_argument("--driver-memory", default="3g", help="spark.driver.memory ('' keeps Spark's default)")
    ap.add_argument("--show-diffs", type=int, default=10, help="differing windows printed when not equal")
    ap.add_argument("--no-check", action="store_true", help="skip the equality check")
    ap.add_argument("--verbose", action="store_true", help="print our per-batch progress lines")
    ap.add_argument("--profile", action="store_true", help="one extra cProfile'd run of ours at the end")
    ap.add_argument("--profile-top", type=int, default=35)
    ap.add_argument("--profile-out", help="also write the profile's stats to this file (pstats format)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scratch", default=None, help="directory for data and outputs (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.disorder_ms + args.tick_ms >= LATENESS_MS:
        ap.error(f"--disorder-ms + --tick-ms must stay below the lateness ({LATENESS_MS} ms), or rows are late")

    scratch = Path(tempfile.mkdtemp(prefix="ematix-sliding-bench-", dir=args.scratch))
    args.data = data = scratch / "data"
    try:
        spark = prepare(args, data, tick_us=max(args.tick_ms * 1_000, 1))
        timer = install_timers()
        timer.wrap(Engine, "flush", "Engine.flush")
        timer.wrap(BatchStep, "flush", "end-of-input flush")

        kept: dict[str, Path] = {}  # each engine's last output, for the equality check

        def run(engine: str) -> Result:
            work = Path(tempfile.mkdtemp(prefix=f"{engine}-", dir=scratch))
            r = run_ours(spark, data, work, args, timer) if engine == "ours" else run_window_fn(spark, data, work, args)
            if engine in kept:
                shutil.rmtree(kept[engine], ignore_errors=True)
            kept[engine] = work
            return r

        for _ in range(args.warmup):
            for engine in args.engines:
                run(engine)
        if args.warmup:
            print("warm-up done", flush=True)

        results: dict[str, list[Result]] = {}
        for i in range(args.runs):
            for engine in (args.engines if i % 2 == 0 else args.engines[::-1]):
                r = run(engine)
                results.setdefault(engine, []).append(r)
                print(f"run {i + 1}/{args.runs} {r.line()} (load avg {os.getloadavg()[0]:.1f})", flush=True)
                if engine == "ours":
                    print_splits(r)

        equal = None
        if not args.no_check and {"ours", "window_fn"} <= kept.keys():
            equal = check_equal(spark, kept["ours"] / "target", kept["window_fn"] / "out", args)
        report(args, results, equal)
        if args.profile:
            profile_run(timer, args.profile_top, args.profile_out, lambda: run("ours"))
        return 1 if equal is False else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
