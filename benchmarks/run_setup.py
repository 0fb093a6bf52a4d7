"""What every benchmark run shares: the data's and the runs' options, the data and Spark session a
benchmark starts from, the JVM settled between measured runs, and the driver timers of ours."""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generated_data import generate  # noqa: E402
from measure import MB, DriverTimer  # noqa: E402
from results import Result  # noqa: E402

from ematix_dagster.spark.batch import window_call as window_call_mod  # noqa: E402
from ematix_dagster.spark.batch.batch_step import BatchStep  # noqa: E402
from ematix_dagster.spark.batch.row_call import RowCall  # noqa: E402
from ematix_dagster.spark.spark_session import get_spark  # noqa: E402
from ematix_dagster.streaming import micro_batch as micro_batch_mod  # noqa: E402
from ematix_dagster.streaming.kinds.fixed.fixed_state import FixedState  # noqa: E402
from ematix_dagster.streaming.micro_batch import Engine  # noqa: E402
from ematix_dagster.streaming.row_release import RowEngine  # noqa: E402
from state_store.postgres_store import PostgresStateStore  # noqa: E402
from state_store.sqlite import SqliteStateStore  # noqa: E402


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
    return start_spark(args)


def start_spark(args: argparse.Namespace):
    """The benchmarks' Spark session: ``args.driver_memory`` (the heap at that size from the start)
    and ``args.gc``'s collector; prints what it started."""
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


def install_timers(spans: bool = False) -> DriverTimer:
    """The driver timers of ours; ``spans`` keeps every call's start and end too (``DriverTimer``)."""
    timer = DriverTimer(spans)
    timer.wrap(BatchStep, "run", "foreachBatch callback", profile=True)
    timer.wrap(BatchStep, "_read", "batch read (plan, Spark job, convert)")
    timer.wrap(window_call_mod, "build_batch", "build_batch (plan)")
    try:
        from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
    except ImportError:  # pragma: no cover - older PySpark
        from pyspark.sql import DataFrame as ClassicDataFrame
    timer.wrap(ClassicDataFrame, "toArrow", "partials.toArrow (Spark job + Arrow)")
    timer.wrap(window_call_mod, "partial_lists", "convert.partial_lists")
    timer.wrap(Engine, "process", "Engine.process")
    timer.wrap(FixedState, "merge", "  FixedState.merge")
    timer.wrap(micro_batch_mod, "emit", "  emission.emit")
    timer.wrap(BatchStep, "_write", "target write")
    timer.wrap(BatchStep, "_commit", "state store commit (encode + store)")
    # a row pipeline's batch (delayed_rows.py): the same step, its own engine call
    timer.wrap(RowCall, "read", "row read (SQL, toArrow)")
    timer.wrap(RowEngine, "process", "RowEngine.process")
    timer.wrap(RowEngine, "_hold", "  RowEngine._hold (encode)")
    for store in (SqliteStateStore, PostgresStateStore):
        timer.wrap(store, "load_pending", "  store.load_pending")
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


def add_variant_arguments(ap: argparse.ArgumentParser, variants: list[str], profile_variant: str) -> None:
    """The options every script comparing variants of our engine takes (besides the data's)."""
    ap.add_argument("--variants", nargs="+", choices=variants, default=variants)
    ap.add_argument("--driver-memory", default="3g", help="spark.driver.memory ('' keeps Spark's default)")
    ap.add_argument("--profile", action="store_true", help="one extra cProfile'd run of --profile-variant at the end")
    ap.add_argument("--profile-variant", choices=variants, default=profile_variant)
    ap.add_argument("--profile-top", type=int, default=35)
    ap.add_argument("--profile-out", help="also write the profile's stats to this file (pstats format)")
    ap.add_argument("--verbose", action="store_true", help="print our per-batch progress lines")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scratch", default=None, help="directory for data and outputs (default: a temp dir)")


def rotated_runs(variants: list[str], warmup: int, runs: int, run: Callable[..., "Result"], verbose: bool,
                 after: Callable[["Result"], None]) -> dict[str, list["Result"]]:
    """``warmup`` unmeasured runs of every variant, then ``runs`` measured ones, the variants' order
    rotated from run to run (whatever runs first pays for what the JVM still compiles); ``after``
    prints what a script adds about each measured run."""
    for _ in range(warmup):
        for variant in variants:
            run(variant)
    if warmup:
        print("warm-up done", flush=True)
    results: dict[str, list[Result]] = {v: [] for v in variants}
    for i in range(runs):
        shift = i % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            r = run(variant, verbose)
            results[variant].append(r)
            print(f"run {i + 1}/{runs} {r.line()} (load avg {os.getloadavg()[0]:.1f})", flush=True)
            after(r)
    return results
