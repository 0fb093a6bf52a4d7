#!/usr/bin/env python
"""Our windowed engine vs Spark's native streaming aggregation, same data, same process.

Data: ``--events`` rows (default 2,000,000) over ``--keys`` keys (default 10,000) in ``--files``
parquet files (default 20), columns ``key BIGINT, amount DOUBLE, item STRING, ts TIMESTAMP``.
Each file covers the next 60 s of event time (offset by 30 s, so every file touches two
1-minute windows and most groups get two partials), with up to ``--disorder-ms`` of disorder
(default 2 s, inside the 5 s lateness, so no row is late). Files are written atomically with
strictly increasing mtimes, and both queries read them with ``maxFilesPerTrigger = 1`` under
``Trigger.AvailableNow``: one file = one micro-batch.

(a) ours: a pipeline spec with count, sum(amount), approximate count_distinct(item) at
    hll_precision 14, group_by key, lateness 5 s, parquet target, run through
    ``PipelineRunner(spec, spark=spark).run()`` with a fresh checkpoint and target each run.
(b) native: ``withWatermark("ts", "5 seconds").groupBy(window("ts", "1 minute"), "key")`` with
    count, sum, ``approx_count_distinct(item, rsd)``, default (HDFS-backed) state store,
    ``noop`` sink, append mode, a fresh checkpoint each run. Spark's HLL++ precision is
    ``p = ceil(2 * log2(1.106 / rsd))``: rsd 0.009 gives p = 14 (0.008 would give p = 15).

CPU is measured with psutil over the driver process and all its descendants (the JVM, Python
workers if any): user + system deltas, descendants sampled on a background thread so processes
that exit mid-run keep their last seen times; the sampler's own thread CPU is subtracted.
Peak RSS is the largest sampled driver + JVM resident set. The JVM's heap does not shrink
between runs, so the peak of a later run includes what earlier runs left resident.

Our driver-side share is measured by wrapping (in this script only) ``Engine.process`` and the
runner's ``partial_lists`` and reading the calling thread's CPU time.

    .venv/bin/python benchmarks/windowed_vs_native.py --events 200000 --runs 1   # smoke
    .venv/bin/python benchmarks/windowed_vs_native.py                            # full
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ematix_dagster.spark import batch as batch_mod
from ematix_dagster.spark.batch import BatchStep
from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spark.session import get_spark
from ematix_dagster.spec import load_pipeline_str
from ematix_dagster.streaming.micro_batch import Engine

SCHEMA_DDL = "key BIGINT, amount DOUBLE, item STRING, ts TIMESTAMP"
BASE_US = 1_704_067_230_000_000  # 2024-01-01T00:00:30Z: each 60 s file spans two 1-minute windows
FILE_SPAN_US = 60_000_000
LATENESS_MS = 5_000
HLL_PRECISION = 14
MB = 1 << 20


# ---------------------------------------------------------------------------------------------
# data


def generate(directory: Path, events: int, keys: int, files: int, items: int, disorder_ms: int, seed: int) -> None:
    """``files`` parquet files, event times increasing file by file, mild disorder inside."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pool = pa.array([f"item-{i}" for i in range(items)], pa.string())
    per_file = [events // files + (1 if i < events % files else 0) for i in range(files)]
    for i, n in enumerate(per_file):
        start = BASE_US + i * FILE_SPAN_US
        ts = np.sort(rng.integers(start, start + FILE_SPAN_US, n, dtype=np.int64))
        ts -= rng.integers(0, disorder_ms * 1_000 + 1, n, dtype=np.int64)  # out of order, within lateness
        table = pa.table({
            "key": pa.array(rng.integers(0, keys, n, dtype=np.int64)),
            "amount": pa.array(np.round(rng.random(n) * 100.0, 2)),
            "item": pool.take(pa.array(rng.integers(0, items, n, dtype=np.int64))),
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        })
        name = f"part-{i:05d}.parquet"
        tmp, final = directory / f".{name}.tmp", directory / name  # Spark ignores dot files
        pq.write_table(table, tmp)
        os.replace(tmp, final)
        mtime = 1_700_000_000 + i
        os.utime(final, (mtime, mtime))


# ---------------------------------------------------------------------------------------------
# measurement


class CpuMeter:
    """User+system CPU of this process and every descendant, plus peak driver+JVM RSS."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.root = psutil.Process()
        self._stop = threading.Event()
        self.baseline: dict[tuple[int, float], float] = {}
        self.last: dict[tuple[int, float], float] = {}
        self.names: dict[tuple[int, float], str] = {}
        self.peak_rss = 0
        self.sampler_cpu = 0.0

    def _procs(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return [self.root]

    def _sample(self, into: dict[tuple[int, float], float]) -> None:
        rss = 0
        for p in self._procs():
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    t = p.cpu_times()
                    into[key] = t.user + t.system
                    if key not in self.names:
                        self.names[key] = p.name()
                    if p.pid == self.root.pid or self.names[key] == "java":
                        rss += p.memory_info().rss
            except psutil.Error:  # exited between listing and reading: keep its last seen times
                continue
        self.peak_rss = max(self.peak_rss, rss)

    def _loop(self) -> None:
        started = time.thread_time()
        while not self._stop.wait(self.interval):
            self._sample(self.last)
        self.sampler_cpu = time.thread_time() - started

    def __enter__(self) -> Self:
        self._sample(self.baseline)
        self.last = dict(self.baseline)
        self._thread = threading.Thread(target=self._loop, name="cpu-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(self.last)

    @property
    def cpu(self) -> float:
        total = sum(v - self.baseline.get(k, 0.0) for k, v in self.last.items())
        return total - self.sampler_cpu

    def by_process(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for k, v in self.last.items():
            label = "driver" if k[0] == self.root.pid else self.names.get(k, "?")
            out[label] += v - self.baseline.get(k, 0.0)
        out["driver"] -= self.sampler_cpu
        out["meter thread (excluded)"] = self.sampler_cpu
        return dict(out)


class DriverTimer:
    """Thread CPU and wall time inside chosen driver functions (patched here, not in the engine)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.profiler: cProfile.Profile | None = None
        self._patched: list[tuple[object, str, object]] = []

    def reset(self) -> None:
        self.cpu.clear()
        self.wall.clear()
        self.calls.clear()

    def wrap(self, owner: object, attr: str, label: str, profile: bool = False) -> None:
        original = getattr(owner, attr, None)
        if original is None:  # the engine moved on: time what still exists
            print(f"note: {getattr(owner, '__name__', owner)}.{attr} not found, not timed", file=sys.stderr)
            return
        timer = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            prof = timer.profiler if profile else None
            c0, w0 = time.thread_time(), time.perf_counter()
            if prof is not None:
                prof.enable()
            try:
                return original(*args, **kwargs)
            finally:
                if prof is not None:
                    prof.disable()
                timer.cpu[label] += time.thread_time() - c0
                timer.wall[label] += time.perf_counter() - w0
                timer.calls[label] += 1

        self._patched.append((owner, attr, original))
        setattr(owner, attr, timed)


def install_timers() -> DriverTimer:
    timer = DriverTimer()
    timer.wrap(BatchStep, "run", "foreachBatch callback", profile=True)
    timer.wrap(batch_mod, "build_batch", "build_batch (plan)")
    try:
        from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
    except ImportError:  # pragma: no cover - older PySpark
        from pyspark.sql import DataFrame as ClassicDataFrame
    timer.wrap(ClassicDataFrame, "toArrow", "partials.toArrow (Spark job + Arrow)")
    timer.wrap(batch_mod, "partial_lists", "convert.partial_lists")
    timer.wrap(Engine, "process", "Engine.process")
    timer.wrap(batch_mod, "rows_to_arrow", "convert.rows_to_arrow")
    timer.wrap(BatchStep, "_write", "target write (incl. rows_to_arrow)")
    timer.wrap(BatchStep, "_commit", "state store commit (encode + store)")
    return timer


# ---------------------------------------------------------------------------------------------
# the two queries


@dataclass
class Result:
    engine: str
    cpu: float
    wall: float
    peak_rss: int
    batches: int
    rows_in: int
    rows_out: int
    by_process: dict[str, float]
    merge_cpu: float = 0.0
    splits: dict[str, tuple[int, float, float]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.cpu / self.wall if self.wall else float("nan")

    def line(self) -> str:
        procs = ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.by_process.items()) if abs(v) >= 0.05)
        extra = f", driver merge {self.merge_cpu:.2f} s ({self.merge_cpu / self.cpu:.1%})" if self.engine.startswith("ours") else ""
        return (f"{self.engine:>6}: CPU {self.cpu:6.1f} s, wall {self.wall:6.1f} s, CPU/wall {self.ratio:4.2f}, "
                f"peak RSS {self.peak_rss / MB:6.0f} MB, batches {self.batches}, rows in {self.rows_in}, "
                f"rows out {self.rows_out}{extra} [{procs}]")


def our_spec(data: Path, work: Path, max_groups: int, store: str):
    store_path = f'\npath = "{work / "state.db"}"' if store == "sqlite" else ""
    toml = f"""
pipeline_name = "bench-windowed"

[[sources]]
name = "events"
kind = "files"
format = "parquet"
path = "{data}"
schema = "{SCHEMA_DDL}"
event_time_column = "ts"
max_files_per_trigger = 1

[transform.window]
kind = "tumbling"
duration_ms = 60_000
lateness_ms = {LATENESS_MS}
source_idleness_ms = 3_600_000
group_by = ["key"]
late_data = "drop"
max_groups_per_window = {max_groups}
hll_precision = {HLL_PRECISION}

[[transform.window.aggregations]]
agg = "count"
as = "n"

[[transform.window.aggregations]]
agg = "sum"
column = "amount"
as = "total"

[[transform.window.aggregations]]
agg = "count_distinct"
column = "item"
as = "items"
mode = "approximate"

[target]
kind = "parquet"
path = "{work / 'target'}"

[state_store]
kind = "{store}"{store_path}

[run]
trigger = "available_now"
checkpoint_location = "{work / 'checkpoint'}"
"""
    return load_pipeline_str(toml)


def settle(spark) -> None:
    """Start each measured run from the same JVM state (outside the measurement).

    A stopped native query leaves its state store providers (hundreds of MB of HLL++ state
    here) loaded until the next maintenance pass notices, which would make the next run pay
    for the previous one's memory; ``StateStore.stop()`` unloads them (no query is active now).
    """
    gc.collect()
    jvm = spark.sparkContext._jvm  # type: ignore[union-attr]
    getattr(getattr(jvm, "org.apache.spark.sql.execution.streaming.state.StateStore$"), "MODULE$").stop()
    jvm.System.gc()
    time.sleep(1.0)


def run_ours(spark, data: Path, scratch: Path, timer: DriverTimer, max_groups: int, verbose: bool,
             store: str) -> Result:
    work = Path(tempfile.mkdtemp(prefix="ours-", dir=scratch))
    spec = our_spec(data, work, max_groups, store)
    timer.reset()
    settle(spark)
    progress = (lambda line: print("   ", line, flush=True)) if verbose else (lambda line: None)
    with CpuMeter() as meter:
        t0 = time.perf_counter()
        summary = PipelineRunner(spec, spark=spark, progress=progress).run()
        wall = time.perf_counter() - t0
    if summary.late_rows:
        print(f"    note: {summary.late_rows} late rows", flush=True)
    merge = timer.cpu["Engine.process"] + timer.cpu["convert.partial_lists"]
    splits = {k: (timer.calls[k], timer.cpu[k], timer.wall[k]) for k in timer.calls}
    shutil.rmtree(work, ignore_errors=True)
    label = "ours" if store == "sqlite" else f"ours ({store})"
    return Result(label, meter.cpu, wall, meter.peak_rss, summary.batches, summary.rows_in, summary.windows_emitted,
                  meter.by_process(), merge, splits)


def run_native(spark, data: Path, scratch: Path, rsd: float) -> Result:
    from pyspark.sql import functions as F

    work = Path(tempfile.mkdtemp(prefix="native-", dir=scratch))
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    settle(spark)
    with CpuMeter() as meter:
        t0 = time.perf_counter()
        stream = (spark.readStream.format("parquet").schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1)
                  .load(str(data)))
        agg = (stream.withWatermark("ts", f"{LATENESS_MS // 1000} seconds")
               .groupBy(F.window("ts", "1 minute"), "key")
               .agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total"),
                    F.approx_count_distinct("item", rsd).alias("items")))
        query = (agg.writeStream.format("noop").outputMode("append")
                 .option("checkpointLocation", str(work / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        wall = time.perf_counter() - t0
    progress = query.recentProgress
    batches = sum(1 for p in progress if p.numInputRows > 0)
    rows_in = sum(p.numInputRows for p in progress)
    rows_out = sum(p.sink.numOutputRows for p in progress if p.sink is not None)
    shutil.rmtree(work, ignore_errors=True)
    return Result("native", meter.cpu, wall, meter.peak_rss, batches, rows_in, rows_out, meter.by_process())


# ---------------------------------------------------------------------------------------------


def print_splits(r: Result) -> None:
    for label, (calls, cpu, wall) in r.splits.items():
        print(f"          {label:<40} calls {calls:3d}  thread CPU {cpu:7.2f} s  wall {wall:7.2f} s")


def profile_ours(spark, data: Path, scratch: Path, timer: DriverTimer, max_groups: int, top: int, store: str) -> None:
    timer.profiler = cProfile.Profile()
    result = run_ours(spark, data, scratch, timer, max_groups, verbose=False, store=store)
    timer.profiler.disable()
    print(f"\nprofiled run (cProfile inside the foreachBatch callback; inflated): {result.line()}")
    for sort in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(timer.profiler, stream=out).strip_dirs().sort_stats(sort).print_stats(top)
        print(f"\n--- driver callback profile, by {sort} ---")
        print(out.getvalue())
    timer.profiler = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3, help="measured runs per engine (median reported)")
    ap.add_argument("--files", type=int, default=20, help="parquet files = micro-batches")
    ap.add_argument("--items", type=int, default=50_000, help="distinct item values")
    ap.add_argument("--disorder-ms", type=int, default=2_000)
    ap.add_argument("--rsd", type=float, default=0.009, help="approx_count_distinct rsd for native (0.009 -> p=14)")
    ap.add_argument("--extra-native-rsd", type=float, default=None,
                    help="also run native once with this rsd (e.g. 0.05, Spark's default, p=9), for context")
    ap.add_argument("--driver-memory", default="3g",
                    help="spark.driver.memory (default 3g: the native query at p=14 runs out of Spark's default 1g "
                         "heap on the full data set; '' keeps Spark's default)")
    ap.add_argument("--state-store", choices=("sqlite", "in_memory"), default="sqlite",
                    help="our state store (default sqlite, the engine's default, in a fresh temp file per run)")
    ap.add_argument("--extra-in-memory", action="store_true", help="also run ours once with the in-memory store")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured warm-up runs per engine (JIT) on a small file set")
    ap.add_argument("--profile", action="store_true", help="one extra cProfile'd run of ours at the end")
    ap.add_argument("--profile-top", type=int, default=35)
    ap.add_argument("--verbose", action="store_true", help="print our per-batch progress lines")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scratch", default=None, help="directory for data and checkpoints (default: a temp dir)")
    args = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="ematix-bench-", dir=args.scratch))
    data = scratch / "data"
    try:
        t0 = time.perf_counter()
        generate(data, args.events, args.keys, args.files, args.items, args.disorder_ms, args.seed)
        print(f"data: {args.events} events, {args.keys} keys, {args.files} files in {data} "
              f"({sum(f.stat().st_size for f in data.iterdir()) / MB:.1f} MB, {time.perf_counter() - t0:.1f} s)",
              flush=True)

        t0 = time.perf_counter()
        conf = {"spark.ui.showConsoleProgress": "false"}
        if args.driver_memory:
            conf["spark.driver.memory"] = args.driver_memory
        spark = get_spark("ematix-bench", conf=conf)
        print(f"spark {spark.version} {spark.sparkContext.master}, session up in {time.perf_counter() - t0:.1f} s; "
              f"shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}, state store provider "
              f"{spark.conf.get('spark.sql.streaming.stateStore.providerClass')}, JVM max heap "
              f"{spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory() / MB:.0f} MB", flush=True)
        timer = install_timers()
        max_groups = max(args.keys, 1_000)

        if args.warmup:
            warm = scratch / "warmup"
            generate(warm, max(min(args.events // 4, 100_000), 4), args.keys, 4, args.items, args.disorder_ms, args.seed + 1)
            for _ in range(args.warmup):
                run_ours(spark, warm, scratch, timer, max_groups, verbose=False, store=args.state_store)
                run_native(spark, warm, scratch, args.rsd)
            print("warm-up done", flush=True)

        results: dict[str, list[Result]] = {"ours": [], "native": []}
        order: list[str] = []
        for i in range(args.runs):
            order += ["ours", "native"] if i % 2 == 0 else ["native", "ours"]
        for n, engine in enumerate(order, 1):
            if engine == "ours":
                r = run_ours(spark, data, scratch, timer, max_groups, args.verbose, args.state_store)
            else:
                r = run_native(spark, data, scratch, args.rsd)
            results[engine].append(r)
            print(f"run {n}/{len(order)} {r.line()} (load avg {os.getloadavg()[0]:.1f})", flush=True)
            if engine == "ours":
                print_splits(r)

        if args.extra_in_memory and args.state_store != "in_memory":
            r = run_ours(spark, data, scratch, timer, max_groups, args.verbose, "in_memory")
            print(f"extra   {r.line()}", flush=True)
            print_splits(r)

        if args.extra_native_rsd:
            r = run_native(spark, data, scratch, args.extra_native_rsd)
            r.engine = "native*"
            print(f"extra   {r.line()}  (* rsd {args.extra_native_rsd})", flush=True)

        if args.profile:
            profile_ours(spark, data, scratch, timer, max_groups, args.profile_top, args.state_store)

        med = {e: {m: statistics.median(getattr(r, m) for r in rs) for m in ("cpu", "wall", "peak_rss", "merge_cpu")}
               for e, rs in results.items()}
        print(f"\nmedian of {args.runs} run(s) each; {args.events} events, {args.keys} keys, {args.files} micro-batches, "
              f"1-minute tumbling windows, count + sum + approx count_distinct (lgK 14); our state store: "
              f"{args.state_store}; native: HDFS state store, approx_count_distinct rsd {args.rsd}")
        print("| engine | CPU s | wall s | CPU/wall | peak RSS MB (driver+JVM) | driver merge CPU s (share) |")
        print("|---|---|---|---|---|---|")
        for e in ("ours", "native"):
            m = med[e]
            share = f"{m['merge_cpu']:.2f} ({m['merge_cpu'] / m['cpu']:.1%})" if e == "ours" else "-"
            print(f"| {e} | {m['cpu']:.1f} | {m['wall']:.1f} | {m['cpu'] / m['wall']:.2f} | {m['peak_rss'] / MB:.0f} | {share} |")
        print(f"| ours / native | {med['ours']['cpu'] / med['native']['cpu']:.2f} | "
              f"{med['ours']['wall'] / med['native']['wall']:.2f} | | | |")
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
