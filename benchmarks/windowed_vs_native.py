#!/usr/bin/env python
"""Our windowed engine vs Spark alone, same data, same process, side by side.

Data: ``--events`` rows (default 2,000,000) over ``--keys`` keys (default 10,000) in ``--files``
parquet files (default 20, so 100,000 rows per micro-batch), columns ``key BIGINT, amount DOUBLE,
item STRING, ts TIMESTAMP``. Each file covers the next 60 s of event time (offset by 30 s, so
every file touches two 1-minute windows), with up to ``--disorder-ms`` of disorder inside the 5 s
lateness, so no row is late. All queries read the files with ``maxFilesPerTrigger = 1`` under
``Trigger.AvailableNow``: one file = one micro-batch.

Workloads (``--workloads``): ``plain`` = count + sum(amount); ``sketch`` = those + approximate
count_distinct(item) at lgK 14; ``session`` = count + sum per key in session windows (gap 30 s,
cap 1 h) against Spark's streaming ``session_window`` (run it with ``--keys 100000``; the floor
has no session counterpart). Per workload, three engines:

- ``ours``: a pipeline spec (1-minute tumbling, group_by key, lateness 5 s, parquet target,
  SQLite state store) run by ``PipelineRunner(spec, spark=spark).run()``;
- ``native``: Spark's streaming ``withWatermark(...).groupBy(window("ts", "1 minute"), "key")``
  with the same aggregates (``approx_count_distinct(item, 0.009)`` is HLL++ p = 14), default
  state store, ``noop`` sink, append mode;
- ``floor``: the Spark floor of our design: the same source as ours (``union_sources``: Spark
  lists each batch's files, the batch reads them, ``input_files.read_files``) with a ``foreachBatch``
  that only runs the batch's ``groupBy(window start, key)`` with the same partial aggregates and
  ``toArrow`` — what any engine that pre-aggregates each batch in Spark and hands the partials to
  the driver must pay.

Heartbeat-only batches (``--heartbeat-batches``): ours and the floor under ``processing_time``
(every 500 ms) on an empty input directory, so each batch holds only the 1-row/s heartbeat; the
first ``SETTLE_BATCHES`` are not measured.

Reported per engine: CPU (process tree) and wall, per 100,000-row batch and per heartbeat-only
batch, p50/p95 batch latency (ours: the batch's own timing; floor: the callback; native: Spark's
``triggerExecution``), peak RSS, the JVM's CPU by thread group (JIT compiler, tasks, the query's
thread, GC) with the Spark jobs and stages per batch, and our driver-side split. Medians of
``--runs`` runs, the engines' order rotated from run to run, after ``--warmup`` unmeasured runs of
each (the JVM keeps compiling the planner's code paths for about 100 of our batches). The JVM's
heap is at full size from the start and every engine runs under the parallel collector
(``--gc g1`` for the JVM's default): under G1 the GC's share of one run depended on the garbage
earlier runs left more than on the run itself.

The engines' runs are ``windowed_engines.py``'s, beside this script with the data
(``generated_data.py``), the shared setup (``run_setup.py``), the results (``results.py``) and the
measuring (``measure.py``).

    .venv/bin/python benchmarks/windowed_vs_native.py --events 200000 --runs 1   # smoke
    .venv/bin/python benchmarks/windowed_vs_native.py                            # full
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import MB, percentile, spark_jobs  # noqa: E402
from results import Result, median_result, print_splits  # noqa: E402
from run_setup import add_data_arguments, install_timers, prepare  # noqa: E402
from windowed_engines import (  # noqa: E402
    profile_ours,
    run_floor,
    run_floor_heartbeats,
    run_native,
    run_ours,
    run_ours_heartbeats,
)

WORKLOADS = ("plain", "sketch", "session")
ENGINES = ("ours", "floor", "native")


def report(args, med: dict[tuple[str, str], Result], beats: dict[tuple[str, str], Result]) -> None:
    print(f"\nmedian of {args.runs} run(s); {args.events} events, {args.keys} keys, {args.files} micro-batches of "
          f"{args.events // args.files} rows, 1-minute tumbling windows; ours: SQLite state, parquet target; "
          f"native: HDFS state store, noop sink, approx_count_distinct rsd {args.rsd}; CPU = process tree")
    print("| workload | engine | CPU s | wall s | CPU s / batch | wall s / batch | p50 / p95 batch s | peak RSS MB "
          "| heartbeat batch CPU s / wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (workload, engine), r in med.items():
        beat = beats.get((workload, engine))
        hb = f"{beat.cpu_per_batch:.3f} / {beat.wall_per_batch:.3f}" if beat else "-"
        print(f"| {workload} | {engine} | {r.cpu:.1f} | {r.wall:.1f} | {r.cpu_per_batch:.3f} | {r.wall_per_batch:.3f} "
              f"| {percentile(r.latencies, .5):.3f} / {percentile(r.latencies, .95):.3f} | {r.peak_rss / MB:.0f} | {hb} |")
    print("\n| workload | ours / native CPU | ours / floor CPU per batch | ours / floor heartbeat CPU | "
          "driver merge CPU (share of ours) |")
    print("|---|---|---|---|---|")
    for workload in args.workloads:
        ours, floor, native = (med.get((workload, e)) for e in ENGINES)
        if ours is None:
            continue
        vs_native = f"{ours.cpu / native.cpu:.2f}" if native else "-"
        vs_floor = f"{ours.cpu_per_batch / floor.cpu_per_batch:.2f}" if floor else "-"
        hb_ours, hb_floor = beats.get((workload, "ours")), beats.get((workload, "floor"))
        vs_hb = f"{hb_ours.cpu_per_batch / hb_floor.cpu_per_batch:.2f}" if hb_ours and hb_floor else "-"
        print(f"| {workload} | {vs_native} | {vs_floor} | {vs_hb} | {ours.merge_cpu:.2f} s "
              f"({ours.merge_cpu / ours.cpu:.1%}) |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["plain", "sketch"])
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    ap.add_argument("--heartbeat-batches", type=int, default=20,
                    help="heartbeat-only batches measured for ours and the floor (0: skip)")
    ap.add_argument("--rsd", type=float, default=0.009, help="approx_count_distinct rsd for native (0.009 -> p=14)")
    ap.add_argument("--driver-memory", default="3g",
                    help="spark.driver.memory (default 3g: the native query at p=14 runs out of Spark's default 1g "
                         "heap on the full data set; '' keeps Spark's default)")
    ap.add_argument("--profile", action="store_true", help="one extra cProfile'd run of ours per workload at the end")
    ap.add_argument("--profile-top", type=int, default=35)
    ap.add_argument("--profile-out", help="also write the profile's stats to this file (pstats format), per workload")
    ap.add_argument("--verbose", action="store_true", help="print our per-batch progress lines")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scratch", default=None, help="directory for data and checkpoints (default: a temp dir)")
    args = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="ematix-bench-", dir=args.scratch))
    data = scratch / "data"
    try:
        spark = prepare(args, data)
        timer = install_timers()
        max_groups = max(args.keys, 1_000)

        def run(engine: str, workload: str, source: Path, verbose: bool = False) -> Result:
            jobs, stages = spark_jobs(spark)
            if engine == "ours":
                r = run_ours(spark, source, scratch, workload, timer, max_groups, verbose)
            elif engine == "floor":
                r = run_floor(spark, source, scratch, workload, max_groups)
            else:
                assert engine == "native"
                r = run_native(spark, source, scratch, workload, args.rsd)
            now = spark_jobs(spark)
            r.jobs, r.stages = now[0] - jobs, now[1] - stages
            return r

        # The JVM compiles its hot paths during the first large run (about 10 CPU s here): warm
        # every engine up on the measured data itself, or the first engine measured pays for all.
        for _ in range(args.warmup):
            for workload in args.workloads:
                for engine in args.engines:
                    if (workload, engine) != ("session", "floor"):
                        run(engine, workload, data)
        print("warm-up done", flush=True)

        results: dict[tuple[str, str], list[Result]] = {}
        for i in range(args.runs):
            engines = args.engines[i % len(args.engines):] + args.engines[:i % len(args.engines)]
            for workload in args.workloads:
                for engine in engines:
                    if (workload, engine) == ("session", "floor"):
                        continue  # the floor is a tumbling groupBy: no session counterpart
                    r = run(engine, workload, data, args.verbose)
                    results.setdefault((workload, engine), []).append(r)
                    print(f"run {i + 1}/{args.runs} {r.line()} (load avg {os.getloadavg()[0]:.1f})", flush=True)
                    print(f"          {r.jvm_line()}", flush=True)
                    if engine == "ours":
                        print_splits(r)

        # A heartbeat batch costs a few hundredths of a CPU second: medians of alternated runs, as above.
        heartbeats: dict[tuple[str, str], list[Result]] = {}
        if args.heartbeat_batches:
            for i in range(args.runs):
                for workload in (w for w in args.workloads if w != "session"):
                    pairs = (("ours", run_ours_heartbeats), ("floor", run_floor_heartbeats))
                    for engine, fn in pairs[i % 2:] + pairs[:i % 2]:
                        if engine in args.engines:
                            r = fn(spark, scratch, workload, args.heartbeat_batches, max_groups)
                            heartbeats.setdefault((workload, engine), []).append(r)
                            print(f"heartbeats {i + 1}/{args.runs} {r.line()}", flush=True)
        beats = {k: median_result(v) for k, v in heartbeats.items()}

        if args.profile:
            for workload in args.workloads:
                profile_ours(spark, data, scratch, workload, timer, max_groups, args.profile_top,
                             f"{args.profile_out}.{workload}" if args.profile_out else None)

        report(args, {k: median_result(v) for k, v in results.items()}, beats)
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
