#!/usr/bin/env python
"""Our engine under ``emit_trigger = "every_batch"`` against the default ``"watermark"``, same data, same process.

Data: ``windowed_vs_native.py``'s plain workload (``generated_data.generate``): ``--events`` rows
(default 2,000,000) over ``--keys`` keys (default 10,000) in ``--files`` parquet files (default 20,
so 20 micro-batches of 100,000 rows), each file the next 60 s of event time. The pipeline is
``windowed_engines.our_spec``'s plain one (count + sum(amount) per key, lateness 5 s, SQLite state,
parquet target, ``trigger = "available_now"``, one file per micro-batch) with tumbling windows of
``--duration-ms`` (default 3,600,000: the 20 files cover 20 minutes of event time, so each key's one
window lives through all 20 batches) and ``end_of_input = "flush"``, so the windows still open at
the end of the input close and their ``final`` rows are written. Variants (``--variants``):

- ``watermark``: the default trigger; a window's row is written once, when it closes (here: the flush);
- ``every_batch``: each batch also writes an ``early`` row for every group it changed in an open window;
- ``every_batch+retractions``: the same with ``[target] retractions = true``, so every row that
  supersedes one already written is preceded by a ``retract`` repeating it (about twice the rows).

Reported per variant: CPU (process tree: the driver, the JVM) and wall, per batch, p50/p95 batch
latency, peak RSS, the rows the parquet target holds by ``_emit_kind`` (read after the measurement),
our driver-side split, and each variant's CPU over ``watermark``'s. Medians of ``--runs`` runs, the
variants' order rotated from run to run, after ``--warmup`` unmeasured runs of each on the same data.
``--profile`` adds one cProfile'd run of ``every_batch`` (or ``--profile-variant``) at the end.

    .venv/bin/python benchmarks/emit_triggers.py --events 200000 --runs 1 --warmup 0   # smoke, ~1 min
    .venv/bin/python benchmarks/emit_triggers.py --warmup 2 --runs 3                   # full
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import MB, percentile, spark_jobs  # noqa: E402
from results import Result, median_result, print_splits  # noqa: E402
from run_setup import add_data_arguments, add_variant_arguments, install_timers, prepare, rotated_runs  # noqa: E402
from windowed_engines import profile_ours, run_ours  # noqa: E402

from ematix_dagster.spark.batch.batch_step import BatchStep  # noqa: E402
from ematix_dagster.streaming.micro_batch import Engine  # noqa: E402

#: variant -> ``our_spec`` keywords besides the window's duration and the end-of-input flush
VARIANTS = {
    "watermark": {"emit_trigger": "watermark"},
    "every_batch": {"emit_trigger": "every_batch"},
    "every_batch+retractions": {"emit_trigger": "every_batch", "retractions": True},
}
KINDS = ("early", "final", "retract", "correction")
#: driver thread CPU in our code: the batch's callback and the end-of-input flush
CALLBACK = ("foreachBatch callback", "end-of-input flush")


def report(args: argparse.Namespace, results: dict[str, list[Result]]) -> None:
    med = {k: median_result(v) for k, v in results.items()}
    print(f"\nmedian of {args.runs} run(s); {args.events} events, {args.keys} keys, {args.files} micro-batches of "
          f"{args.events // args.files} rows, tumbling windows of {args.duration_ms} ms, count + sum, "
          f"end_of_input = flush; SQLite state, parquet target; CPU = process tree")
    print("| variant | CPU s | wall s | CPU s / batch | p50 / p95 batch s | peak RSS MB | driver callback CPU s "
          "| rows written (" + " / ".join(KINDS) + ") | total rows | CPU / watermark |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = med.get("watermark")
    for name, r in med.items():
        callback = statistics.median(sum(s.splits.get(k, (0, 0.0, 0.0))[1] for k in CALLBACK) for s in results[name])
        rows = " / ".join(str(r.rows_by_kind.get(k, 0)) for k in KINDS)
        ratio = f"**{r.cpu / base.cpu:.2f}**" if base else "-"
        print(f"| {name} | {r.cpu:.1f} | {r.wall:.1f} | {r.cpu_per_batch:.3f} | {percentile(r.latencies, .5):.3f} / "
              f"{percentile(r.latencies, .95):.3f} | {r.peak_rss / MB:.0f} | {callback:.2f} | {rows} "
              f"| {sum(r.rows_by_kind.values())} | {ratio} |")
    for name, runs in results.items():
        print(f"{name}: single runs CPU {' / '.join(f'{r.cpu:.1f}' for r in runs)} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    add_variant_arguments(ap, list(VARIANTS), "every_batch")
    ap.add_argument("--duration-ms", type=int, default=3_600_000, help="the tumbling windows' duration")
    args = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="ematix-emit-bench-", dir=args.scratch))
    data = scratch / "data"
    try:
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        spark = prepare(args, data)
        timer = install_timers()
        timer.wrap(Engine, "flush", "Engine.flush")
        timer.wrap(BatchStep, "flush", "end-of-input flush")
        max_groups = max(args.keys, 1_000)

        def run(variant: str, verbose: bool = False) -> Result:
            jobs, stages = spark_jobs(spark)
            r = run_ours(spark, data, scratch, "plain", timer, max_groups, verbose, duration_ms=args.duration_ms,
                         end_of_input="flush", **VARIANTS[variant])
            now = spark_jobs(spark)
            r.engine, r.jobs, r.stages = variant, now[0] - jobs, now[1] - stages
            return r

        def after(r: Result) -> None:
            print(f"          rows written by kind: {r.rows_by_kind}; {r.jvm_line()}", flush=True)
            print_splits(r)

        results = rotated_runs(args.variants, args.warmup, args.runs, run, args.verbose, after)

        if args.profile:
            profile_ours(spark, data, scratch, "plain", timer, max_groups, args.profile_top, args.profile_out,
                         duration_ms=args.duration_ms, end_of_input="flush", **VARIANTS[args.profile_variant])

        report(args, results)
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
