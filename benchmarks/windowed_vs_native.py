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

    .venv/bin/python benchmarks/windowed_vs_native.py --events 200000 --runs 1   # smoke
    .venv/bin/python benchmarks/windowed_vs_native.py                            # full
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import CpuMeter, DriverTimer, percentile, spark_jobs  # noqa: E402

from ematix_dagster.spark import batch as batch_mod  # noqa: E402
from ematix_dagster.spark.batch import BatchStep  # noqa: E402
from ematix_dagster.spark.checkpoint import batch_files  # noqa: E402
from ematix_dagster.spark.input_files import read_files  # noqa: E402
from ematix_dagster.spark.readers import union_sources  # noqa: E402
from ematix_dagster.spark.recovery import HEARTBEAT  # noqa: E402
from ematix_dagster.spark.runner import PipelineRunner  # noqa: E402
from ematix_dagster.spark.session import get_spark  # noqa: E402
from ematix_dagster.spec import load_pipeline_str  # noqa: E402
from ematix_dagster.streaming import micro_batch as micro_batch_mod  # noqa: E402
from ematix_dagster.streaming.micro_batch import Engine  # noqa: E402
from ematix_dagster.streaming.state.fixed import FixedState  # noqa: E402

SCHEMA_DDL = "key BIGINT, amount DOUBLE, item STRING, ts TIMESTAMP"
BASE_US = 1_704_067_230_000_000  # 2024-01-01T00:00:30Z: each 60 s file spans two 1-minute windows
FILE_SPAN_US = 60_000_000
WINDOW_US = 60_000_000
LATENESS_MS = 5_000
HLL_PRECISION = 14
HEARTBEAT_INTERVAL_MS = 500
MB = 1 << 20
WORKLOADS = ("plain", "sketch", "session")
SESSION_GAP_S = 30
ENGINES = ("ours", "floor", "native")


# ---------------------------------------------------------------------------------------------
# data


def generate(directory: Path, events: int, keys: int, files: int, items: int, disorder_ms: int, seed: int,
             tick_us: int = 1) -> None:
    """``files`` parquet files, event times increasing file by file, mild disorder inside.

    ``tick_us`` > 1 rounds event times down to its multiples, so rows share event times.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pool = pa.array([f"item-{i}" for i in range(items)], pa.string())
    per_file = [events // files + (1 if i < events % files else 0) for i in range(files)]
    for i, n in enumerate(per_file):
        start = BASE_US + i * FILE_SPAN_US
        ts = np.sort(rng.integers(start, start + FILE_SPAN_US, n, dtype=np.int64))
        ts -= rng.integers(0, disorder_ms * 1_000 + 1, n, dtype=np.int64)  # out of order, within lateness
        ts -= ts % tick_us
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
# results


@dataclass
class Result:
    engine: str
    workload: str
    cpu: float
    wall: float
    peak_rss: int
    batches: int
    rows_in: int
    rows_out: int
    by_process: dict[str, float]
    latencies: list[float] = field(default_factory=list)  # seconds per batch
    merge_cpu: float = 0.0
    splits: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    jvm: dict[str, float] = field(default_factory=dict)  # JVM CPU by thread group (measure.JVM_THREADS)
    jobs: int = 0  # Spark jobs and stages the run submitted
    stages: int = 0

    @property
    def cpu_per_batch(self) -> float:
        return self.cpu / self.batches if self.batches else float("nan")

    @property
    def wall_per_batch(self) -> float:
        return self.wall / self.batches if self.batches else float("nan")

    def line(self) -> str:
        procs = ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.by_process.items()) if abs(v) >= 0.05)
        return (f"{self.engine:>6} {self.workload:<6}: CPU {self.cpu:6.1f} s, wall {self.wall:6.1f} s, "
                f"per batch CPU {self.cpu_per_batch:.3f} s wall {self.wall_per_batch:.3f} s, p50/p95 "
                f"{percentile(self.latencies, .5):.3f}/{percentile(self.latencies, .95):.3f} s, batches {self.batches}, "
                f"rows in {self.rows_in}, out {self.rows_out}, peak RSS {self.peak_rss / MB:.0f} MB [{procs}]")

    def jvm_line(self) -> str:
        threads = ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.jvm.items(), key=lambda kv: -kv[1]) if v >= 0.05)
        per = f", per batch {self.jobs / self.batches:.1f} jobs / {self.stages / self.batches:.1f} stages" \
            if self.batches else ""
        return f"JVM CPU s by thread: {threads}; Spark jobs {self.jobs}, stages {self.stages}{per}"


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
    timer.wrap(FixedState, "merge", "  FixedState.merge")
    timer.wrap(micro_batch_mod, "emit", "  emission.emit")
    timer.wrap(BatchStep, "_write", "target write")
    timer.wrap(BatchStep, "_commit", "state store commit (encode + store)")
    return timer


def settle(spark) -> None:
    """Start each measured run from the same JVM state (outside the measurement).

    A stopped native query leaves its state store providers loaded until the next maintenance
    pass; ``StateStore.stop()`` unloads them (no query is active now).
    """
    gc.collect()
    jvm = spark.sparkContext._jvm  # type: ignore[union-attr]
    getattr(getattr(jvm, "org.apache.spark.sql.execution.streaming.state.StateStore$"), "MODULE$").stop()
    jvm.System.gc()
    time.sleep(1.0)


# ---------------------------------------------------------------------------------------------
# ours


def our_spec(data: Path, work: Path, workload: str, max_groups: int, heartbeat: bool = False):
    distinct = """
[[transform.window.aggregations]]
agg = "count_distinct"
column = "item"
as = "items"
mode = "approximate"
""" if workload == "sketch" else ""
    run = (f'trigger = "processing_time"\ntrigger_interval_ms = {HEARTBEAT_INTERVAL_MS}' if heartbeat
           else 'trigger = "available_now"')
    shape = (f'kind = "session"\ngap_ms = {SESSION_GAP_S * 1000}\nmax_session_duration_ms = 3_600_000'
             if workload == "session" else 'kind = "tumbling"\nduration_ms = 60_000')
    return load_pipeline_str(pipeline_toml("bench-windowed", data, work, shape, max_groups, distinct, run))


def pipeline_toml(name: str, data: Path, work: Path, shape: str, max_groups: int, extra_aggregations: str,
                  run: str) -> str:
    """A benchmark pipeline over the generated files: count + sum(amount) per key (plus
    ``extra_aggregations``, TOML tables) in the window ``shape``, SQLite state, parquet target."""
    return f"""
pipeline_name = "{name}"

[[sources]]
name = "events"
kind = "files"
format = "parquet"
path = "{data}"
schema = "{SCHEMA_DDL}"
event_time_column = "ts"
max_files_per_trigger = 1

[transform.window]
{shape}
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
{extra_aggregations}
[target]
kind = "parquet"
path = "{work / 'target'}"

[state_store]
kind = "sqlite"
path = "{work / 'state.db'}"

[run]
{run}
checkpoint_location = "{work / 'checkpoint'}"
"""


def run_ours(spark, data: Path, scratch: Path, workload: str, timer: DriverTimer, max_groups: int,
             verbose: bool) -> Result:
    work = Path(tempfile.mkdtemp(prefix="ours-", dir=scratch))
    spec = our_spec(data, work, workload, max_groups)
    timer.reset()
    settle(spark)
    progress = (lambda line: print("   ", line, flush=True)) if verbose else (lambda line: None)
    with CpuMeter() as meter:
        t0 = time.perf_counter()
        summary = PipelineRunner(spec, spark=spark, progress=progress).run()
        wall = time.perf_counter() - t0
    if summary.late_rows:
        print(f"    note: {summary.late_rows} late rows", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return Result("ours", workload, meter.cpu, wall, meter.peak_rss, summary.batches, summary.rows_in,
                  summary.windows_emitted, meter.by_process(), [r.seconds for r in summary.reports],
                  timer.cpu["Engine.process"] + timer.cpu["convert.partial_lists"],
                  {k: (timer.calls[k], timer.cpu[k], timer.wall[k]) for k in timer.calls}, meter.by_jvm_thread())


#: heartbeat batches run before measuring (either engine): the first pays the query's start, and the
#: JVM goes on compiling what our pipeline's start ran (analysing the SQL, planning) for a few seconds
SETTLE_BATCHES = 5


def run_ours_heartbeats(spark, scratch: Path, workload: str, batches: int, max_groups: int) -> Result:
    work = Path(tempfile.mkdtemp(prefix="ours-hb-", dir=scratch))
    (work / "empty").mkdir()
    spec = our_spec(work / "empty", work, workload, max_groups, heartbeat=True)
    settle(spark)
    runner = PipelineRunner(spec, spark=spark, progress=lambda line: None)
    latencies: list[float] = []
    with CpuMeter() as meter:
        t0 = time.perf_counter()
        for report in runner.events():
            latencies.append(report.seconds)
            if len(latencies) == SETTLE_BATCHES:
                meter.restart()
                t0 = time.perf_counter()
            if len(latencies) >= SETTLE_BATCHES + batches:
                runner.request_stop()
        wall = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    measured = latencies[SETTLE_BATCHES:]
    return Result("ours", workload, meter.cpu, wall, meter.peak_rss, len(measured), 0, 0, meter.by_process(),
                  measured, jvm=meter.by_jvm_thread())


# ---------------------------------------------------------------------------------------------
# the Spark floor: the same source, the batch's groupBy and toArrow, nothing else


def floor_partials(df, workload: str):
    from pyspark.sql import functions as F

    ts = F.unix_micros("ts")
    aggs = [F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total")]
    if workload == "sketch":
        aggs.append(F.hll_sketch_agg("item", HLL_PRECISION).alias("items"))
    return (df.filter(F.col("_source") != HEARTBEAT)
            .groupBy((ts - F.pmod(ts, F.lit(WINDOW_US))).alias("_ws"), "key").agg(*aggs))


def _floor_query(spark, spec, workload: str, latencies: list[float], rows: list[int]):
    def on_batch(df, batch_id: int) -> None:
        t0 = time.perf_counter()
        # a local parquet source is read in the batch from the checkpoint's file list, as ours reads it
        urls = batch_files(spec.run.checkpoint_location, 0, batch_id)
        if not urls:
            latencies.append(time.perf_counter() - t0)
            return
        table = floor_partials(read_files(df.sparkSession, spec, 0, urls), workload).toArrow()
        rows.append(table.num_rows)
        latencies.append(time.perf_counter() - t0)

    writer = (union_sources(spark, spec).writeStream.option("checkpointLocation", spec.run.checkpoint_location)
              .foreachBatch(on_batch))
    if spec.run.trigger == "available_now":
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{HEARTBEAT_INTERVAL_MS} milliseconds").start()


def run_floor(spark, data: Path, scratch: Path, workload: str, max_groups: int) -> Result:
    work = Path(tempfile.mkdtemp(prefix="floor-", dir=scratch))
    spec = our_spec(data, work, workload, max_groups)
    settle(spark)
    latencies: list[float] = []
    rows: list[int] = []
    with CpuMeter() as meter:
        t0 = time.perf_counter()
        query = _floor_query(spark, spec, workload, latencies, rows)
        query.awaitTermination()
        wall = time.perf_counter() - t0
    rows_in = sum(p.numInputRows for p in query.recentProgress)
    shutil.rmtree(work, ignore_errors=True)
    return Result("floor", workload, meter.cpu, wall, meter.peak_rss, len(latencies), rows_in, sum(rows),
                  meter.by_process(), latencies, jvm=meter.by_jvm_thread())


def run_floor_heartbeats(spark, scratch: Path, workload: str, batches: int, max_groups: int) -> Result:
    work = Path(tempfile.mkdtemp(prefix="floor-hb-", dir=scratch))
    (work / "empty").mkdir()
    spec = our_spec(work / "empty", work, workload, max_groups, heartbeat=True)
    settle(spark)
    latencies: list[float] = []
    with CpuMeter() as meter:
        query = _floor_query(spark, spec, workload, latencies, [])
        while len(latencies) < SETTLE_BATCHES:
            time.sleep(0.05)
        meter.restart()
        t0 = time.perf_counter()
        while len(latencies) < SETTLE_BATCHES + batches:
            time.sleep(0.05)
        query.stop()
        wall = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    measured = latencies[SETTLE_BATCHES:]
    return Result("floor", workload, meter.cpu, wall, meter.peak_rss, len(measured), 0, 0, meter.by_process(),
                  measured, jvm=meter.by_jvm_thread())


# ---------------------------------------------------------------------------------------------
# Spark's native streaming aggregation


def run_native(spark, data: Path, scratch: Path, workload: str, rsd: float) -> Result:
    from pyspark.sql import functions as F

    work = Path(tempfile.mkdtemp(prefix="native-", dir=scratch))
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    settle(spark)
    aggs = [F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total")]
    if workload == "sketch":
        aggs.append(F.approx_count_distinct("item", rsd).alias("items"))
    window = F.session_window("ts", f"{SESSION_GAP_S} seconds") if workload == "session" else F.window("ts", "1 minute")
    with CpuMeter() as meter:
        t0 = time.perf_counter()
        stream = (spark.readStream.format("parquet").schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1)
                  .load(str(data)))
        agg = (stream.withWatermark("ts", f"{LATENESS_MS // 1000} seconds")
               .groupBy(window, "key").agg(*aggs))
        query = (agg.writeStream.format("noop").outputMode("append")
                 .option("checkpointLocation", str(work / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        wall = time.perf_counter() - t0
    progress = [p for p in query.recentProgress if p.numInputRows > 0]
    rows_out = sum(p.sink.numOutputRows for p in progress if p.sink is not None)
    shutil.rmtree(work, ignore_errors=True)
    return Result("native", workload, meter.cpu, wall, meter.peak_rss, len(progress),
                  sum(p.numInputRows for p in progress), rows_out, meter.by_process(),
                  [p.durationMs.get("triggerExecution", 0) / 1000 for p in progress], jvm=meter.by_jvm_thread())


# ---------------------------------------------------------------------------------------------


def print_splits(r: Result) -> None:
    for label, (calls, cpu, wall) in r.splits.items():
        print(f"          {label:<40} calls {calls:3d}  thread CPU {cpu:7.2f} s  wall {wall:7.2f} s")


def profile_ours(spark, data: Path, scratch: Path, workload: str, timer: DriverTimer, max_groups: int,
                 top: int, out_path: str | None = None) -> None:
    timer.profiler = cProfile.Profile()
    result = run_ours(spark, data, scratch, workload, timer, max_groups, verbose=False)
    timer.profiler.disable()
    if out_path:
        timer.profiler.dump_stats(out_path)
    print(f"\nprofiled run (cProfile inside the foreachBatch callback; inflated): {result.line()}")
    for sort in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(timer.profiler, stream=out).strip_dirs().sort_stats(sort).print_stats(top)
        print(f"\n--- driver callback profile, by {sort} ---")
        print(out.getvalue())
    timer.profiler = None


def _median(results: list[Result]) -> Result:
    """A result whose numbers are the medians of ``results`` (latencies pooled)."""
    first = results[0]
    return dataclasses.replace(
        first, cpu=statistics.median(r.cpu for r in results), wall=statistics.median(r.wall for r in results),
        peak_rss=int(statistics.median(r.peak_rss for r in results)),
        merge_cpu=statistics.median(r.merge_cpu for r in results),
        latencies=[x for r in results for x in r.latencies])


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


def add_data_arguments(ap: argparse.ArgumentParser) -> None:
    """The generated data's and the runs' options, shared with the other benchmarks."""
    ap.add_argument("--gc", choices=["parallel", "g1"], default="parallel",
                    help="the JVM's garbage collector for every engine (g1: the JVM's default)")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--files", type=int, default=20, help="parquet files = micro-batches")
    ap.add_argument("--items", type=int, default=50_000, help="distinct item values")
    ap.add_argument("--disorder-ms", type=int, default=2_000)
    ap.add_argument("--runs", type=int, default=3, help="measured runs per engine (median reported)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured warm-up runs per engine (JIT), on the same data")


def prepare(args: argparse.Namespace, data: Path, tick_us: int = 1):
    """Generate the data (``add_data_arguments``' options) into ``data`` and start the shared Spark
    session; returns it. Both print what they made."""
    t0 = time.perf_counter()
    generate(data, args.events, args.keys, args.files, args.items, args.disorder_ms, args.seed, tick_us=tick_us)
    print(f"data: {args.events} events, {args.keys} keys, {args.files} files in {data} "
          f"({sum(f.stat().st_size for f in data.iterdir()) / MB:.1f} MB, {time.perf_counter() - t0:.1f} s)",
          flush=True)
    conf = {"spark.ui.showConsoleProgress": "false"}
    options = []
    if args.driver_memory:
        # the heap at its full size from the start: a heap that shrinks after each run's System.gc()
        # and grows again makes the GC's share of a run vary several-fold (1.3-6.6 CPU s measured)
        conf["spark.driver.memory"] = args.driver_memory
        options.append(f"-Xms{args.driver_memory}")
    if args.gc == "parallel":
        # G1's concurrent cycles, started by the garbage an earlier run left, put 0.1-5.5 CPU s of GC
        # into one plain run of 20 batches (measured); the parallel collector's pauses are all young
        options.append("-XX:+UseParallelGC")
    if options:
        conf["spark.driver.extraJavaOptions"] = " ".join(options)
    spark = get_spark("ematix-bench", conf=conf)
    print(f"spark {spark.version} {spark.sparkContext.master}; shuffle partitions "
          f"{spark.conf.get('spark.sql.shuffle.partitions')}; JVM max heap "
          f"{spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory() / MB:.0f} MB, {args.gc} GC", flush=True)
    return spark


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
        beats = {k: _median(v) for k, v in heartbeats.items()}

        if args.profile:
            for workload in args.workloads:
                profile_ours(spark, data, scratch, workload, timer, max_groups, args.profile_top,
                             f"{args.profile_out}.{workload}" if args.profile_out else None)

        report(args, {k: _median(v) for k, v in results.items()}, beats)
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
