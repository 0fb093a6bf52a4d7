#!/usr/bin/env python
"""Window state in the driver against window state on the executors (``[run] window_state``), same data.

Data per size (``--groups``, default 1,000,000, 5,000,000 and 20,000,000): one row per group,
columns ``generated_data.SCHEMA_DDL`` (``item`` NULL), a BIGINT ``key`` taking every value from 0
to groups - 1 once in random order, ``amount`` a random double, split over ``--files`` parquet
files (default 4; ``maxFilesPerTrigger = 1``, so one file = one micro-batch). File i holds event
times in the i-th minute after 00:00:30 of 2024-01-01, so every row falls in one 1-hour tumbling
window that no watermark reaches: every group stays open. Each size's files are generated once,
read by both modes. The pipeline is ``generated_data.pipeline_toml``'s (count + sum(amount) per
key, lateness 5 s, parquet target, SQLite state store, ``trigger = "available_now"``, the open
window kept at the end of the input) in a 1-hour tumbling window, in two modes:

- ``driver`` (the default mode): the engine's window state in the driver's Python process, with
  ``max_groups_per_window`` set from the stated driver memory limit
  (``--driver-memory-limit-gb``, default 1): the limit over ``estimate_state``'s bytes per group
  (or ``--bytes-per-group``). Where the groups pass that cap the run must fail loud with
  ``StateCapExceeded``, and its row says so;
- ``executors`` (``window_state = "executors"``): Spark's stateful aggregation, RocksDB state.

Every (size, mode) runs in a fresh Python process with its own Spark session (local[2], the JVM's
heap at ``--driver-memory`` from the start, the parallel collector), so its memory is its own.
Reported per run: CPU of the process tree (the driver's Python, the JVM, which in local mode is
also the executor, and any process they start) over the query's whole run, per input batch and
split by process, and per input batch after the first; wall; driver memory after the run, in the
process that ran it: the Python process's RSS plus the JVM's heap used after ``System.gc()``
(RocksDB's memory is native, outside the heap, as an executor's would be on a cluster); the state:
driver mode's estimate (groups x bytes per group), the growth of the Python RSS over the run and
the SQLite store's files; executors mode's Spark progress (``stateOperators`` ``numRowsTotal``,
``memoryUsedBytes``, RocksDB's SST files) and the files under the checkpoint's ``state/`` directory.
Then ``executors / driver`` CPU per input batch at the largest size both modes complete. One run
per configuration: the JVM is cold in each, so at small sizes its compiling is much of a run's CPU.

    .venv/bin/python benchmarks/window_state_modes.py --quick   # smoke: 50,000 and 200,000 groups, a 0.03 GiB limit
    .venv/bin/python benchmarks/window_state_modes.py           # full: 1, 5 and 20 million groups, a 1 GiB limit
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generated_data import BASE_US, FILE_SPAN_US, pipeline_toml, write_part  # noqa: E402
from measure import MB, CpuMeter  # noqa: E402
from results import Result  # noqa: E402
from run_setup import start_spark  # noqa: E402

from ematix_dagster.errors import EmatixError, first_line  # noqa: E402
from ematix_dagster.spark.runner import PipelineRunner  # noqa: E402
from ematix_dagster.spec import load_pipeline_str  # noqa: E402
from ematix_dagster.streaming.state_size import GIB, estimate_state  # noqa: E402

MODES = ("driver", "executors")
WINDOW_MS = 3_600_000
SHAPE = f'kind = "tumbling"\nduration_ms = {WINDOW_MS}'
FULL_GROUPS = "1000000,5000000,20000000"
QUICK_GROUPS = "50000,200000"
QUICK_LIMIT_GB = 0.03  # 50,000 groups fit under it, 200,000 do not: both outcomes in a smoke run
RESULT = "RESULT "  # the child's last line: its result as JSON


# ---------------------------------------------------------------------------------------------
# data and spec


def generate_groups(directory: Path, groups: int, files: int, seed: int) -> None:
    """One row per group: ``key`` 0..groups - 1 once each, in random order, over ``files`` files,
    file i's event times inside the i-th minute of the run (all in one 1-hour window)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    keys = rng.permutation(groups).astype(np.int64)
    bounds = np.linspace(0, groups, files + 1).astype(np.int64)
    for i in range(files):
        n = int(bounds[i + 1] - bounds[i])
        start = BASE_US + i * FILE_SPAN_US
        write_part(directory, i, pa.table({
            "key": pa.array(keys[bounds[i]:bounds[i + 1]]),
            "amount": pa.array(np.round(rng.random(n) * 100.0, 2)),
            "item": pa.nulls(n, pa.string()),
            "ts": pa.array(np.sort(rng.integers(start, start + FILE_SPAN_US, n, dtype=np.int64)),
                           pa.timestamp("us", tz="UTC")),
        }))


def spec_for(mode: str, data: Path, work: Path, max_groups: int):
    run = 'trigger = "available_now"' + ('\nwindow_state = "executors"' if mode == "executors" else "")
    return load_pipeline_str(pipeline_toml("bench-window-state", data, work, SHAPE, max_groups, "", run))


def bytes_per_group(args: argparse.Namespace) -> int:
    """Driver memory per open group the cap is sized by: ``--bytes-per-group``, else the start's
    estimate (``estimate_state``, which assumes an interned key: it cannot know the key's type)."""
    if args.bytes_per_group:
        return args.bytes_per_group
    return estimate_state(spec_for("driver", Path("data"), Path("work"), 1).window).bytes_per_group


# ---------------------------------------------------------------------------------------------
# one run, in its own process


def tree_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (Hadoop's ``.crc`` files left out)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.name.endswith(".crc")) \
        if path.exists() else 0


def heap_used_after_gc(spark) -> int:
    jvm = spark.sparkContext._jvm  # type: ignore[union-attr]
    runtime = jvm.java.lang.Runtime.getRuntime()
    jvm.System.gc()
    time.sleep(0.5)
    return int(runtime.totalMemory() - runtime.freeMemory())


def spark_state(runner) -> dict[str, float]:
    """Spark's state after the run, from the query's last progress that reports a state operator."""
    query = runner.query
    progress = [p for p in (query.recentProgress if query is not None else []) if p.stateOperators]
    if not progress:
        return {}
    ops = progress[-1].stateOperators
    return {"state_rows": float(sum(op.numRowsTotal for op in ops)),
            "memory_used_bytes": float(sum(op.memoryUsedBytes for op in ops)),
            "sst_bytes": float(sum(int(op.customMetrics.get("rocksdbSstFileSize", 0)) for op in ops))}


def tree_cpu(meter: CpuMeter) -> float:
    """The process tree's CPU so far, as the meter's last sample saw it."""
    for _ in range(5):
        try:
            return meter.cpu
        except RuntimeError:  # the sampler added a process while this read its samples
            time.sleep(0.01)
    return meter.cpu


def child(args: argparse.Namespace) -> int:
    work = Path(args.work)
    spec = spec_for(args.mode, Path(args.data), work, args.cap)
    spark = start_spark(args)
    proc = psutil.Process()
    gc.collect()
    rss_before = proc.memory_info().rss
    progress = (lambda line: print("   ", line, flush=True)) if args.verbose else (lambda line: None)
    runner = PipelineRunner(spec, spark=spark, progress=progress)
    reports, error, after_first = [], None, None
    with CpuMeter() as meter:
        t0 = time.perf_counter()
        try:
            for report in runner.events():
                reports.append(report)
                if after_first is None and report.rows_in:
                    after_first = tree_cpu(meter)  # the query's start and its first batch
        except EmatixError as exc:
            error = f"{type(exc).__name__}: {first_line(exc)}"
            if exc.stack_file:  # Spark's log of the failure, kept off the terminal
                Path(exc.stack_file).unlink(missing_ok=True)
        wall = time.perf_counter() - t0
    extra: dict[str, float] = {"cpu_after_first": meter.cpu if after_first is None else after_first}
    if args.mode == "driver" and runner.step is not None:
        extra["state_rows"] = float(runner.step.call.engine.state.state_rows)
    gc.collect()
    extra["python_rss"] = float(proc.memory_info().rss)
    extra["python_rss_growth"] = extra["python_rss"] - rss_before
    extra["heap_used"] = float(heap_used_after_gc(spark))
    java = [p for p in proc.children(recursive=True) if p.name() == "java"]
    extra["jvm_rss"] = float(sum(p.memory_info().rss for p in java))
    if args.mode == "executors":
        extra.update(spark_state(runner))
        extra["checkpoint_state_bytes"] = float(tree_size(work / "checkpoint" / "state"))
    else:
        extra["store_bytes"] = float(sum(f.stat().st_size for f in work.glob("state.db*")))
    rows_in = sum(r.rows_in for r in reports)
    result = Result(args.mode, str(args.groups), meter.cpu, wall, meter.peak_rss,
                    sum(1 for r in reports if r.rows_in), rows_in, sum(r.count("windows_emitted") for r in reports),
                    meter.by_process(), [r.seconds for r in reports], jvm=meter.by_jvm_thread(), extra=extra)
    print(RESULT + json.dumps({"result": dataclasses.asdict(result), "error": error, "batches": len(reports)}),
          flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# the parent: data, one process per run, the table


@dataclasses.dataclass
class Run:
    groups: int
    mode: str
    cap: int
    result: Result | None = None
    error: str | None = None  # the run's failure as it reported it
    crashed: str | None = None  # no result came back


def run_child(args: argparse.Namespace, mode: str, groups: int, data: Path, work: Path, cap: int) -> Run:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--mode", mode, "--groups", str(groups),
           "--data", str(data), "--work", str(work), "--cap", str(cap), "--driver-memory", args.driver_memory,
           "--gc", args.gc] + (["--verbose"] if args.verbose else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    run = Run(groups, mode, cap)
    found = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    for line in done.stdout.splitlines():
        if args.verbose and not line.startswith(RESULT):
            print(f"  [{mode} {groups:,}] {line}", flush=True)
    if not found:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        run.crashed = f"exit {done.returncode}: {tail[:300]}"
        return run
    got = json.loads(found[-1][len(RESULT):])
    run.result, run.error = Result(**got["result"]), got["error"]
    run.result.extra["batches_run"] = got["batches"]
    return run


def state_cells(run: Run, bpg: int) -> tuple[str, str]:
    """(in memory, on disk) MB of a completed run's window state."""
    x = run.result.extra if run.result else {}
    if run.mode == "driver":
        return (f"{run.groups * bpg / MB:.1f} estimate; RSS +{x['python_rss_growth'] / MB:.1f} measured",
                f"{x['store_bytes'] / MB:.1f} SQLite")
    return (f"{x.get('memory_used_bytes', 0) / MB:.1f} memoryUsedBytes",
            f"{x.get('sst_bytes', 0) / MB:.1f} SST; {x['checkpoint_state_bytes'] / MB:.1f} checkpoint state/")


def run_line(run: Run, bpg: int) -> str:
    head = f"{run.mode:>9} {run.groups:>11,} groups"
    if run.crashed or run.result is None:
        return f"{head}: crashed ({run.crashed})"
    r, x = run.result, run.result.extra
    in_memory, on_disk = state_cells(run, bpg)
    outcome = f"; fails loud: {run.error}" if run.error else ""
    return (f"{head}: {r.line()}\n{'':>11}after: Python RSS {x['python_rss'] / MB:.0f} MB, JVM heap used "
            f"{x['heap_used'] / MB:.0f} MB, JVM RSS {x['jvm_rss'] / MB:.0f} MB; state rows "
            f"{x.get('state_rows', 0):,.0f}, in memory {in_memory}, on disk {on_disk}{outcome}")


def steady_per_batch(r: Result) -> float:
    """CPU s per input batch after the first (which pays the query's start and most of the JIT)."""
    return (r.cpu - r.extra["cpu_after_first"]) / (r.batches - 1) if r.batches > 1 else float("nan")


def cpu_split(r: Result) -> tuple[float, float, float]:
    """(driver Python, JVM, other processes: a Python process started in executors mode) CPU s of a run."""
    py, jvm = r.by_process.get("driver", 0.0), r.by_process.get("java", 0.0)
    return py, jvm, r.cpu - py - jvm


def report(args: argparse.Namespace, runs: list[Run], bpg: int, limit: int) -> None:
    print(f"\none 1-hour tumbling window, count + sum per BIGINT key, every group open; {args.files} files = "
          f"{args.files} input batches (maxFilesPerTrigger = 1); one fresh process per run; CPU = process tree "
          f"(driver Python + JVM + other processes), over the whole query (start, the executors' closing batch); "
          f"driver memory limit {limit / GIB:g} GiB -> driver max_groups_per_window = {limit // bpg:,} "
          f"({bpg} bytes per group); load average {os.getloadavg()[0]:.1f}")
    print("| open groups | mode | CPU s / input batch, whole run (Python + JVM + other) "
          "| CPU s / batch after the first | run CPU s (batches run) | wall s "
          "| driver memory MB (Python RSS + JVM heap used) | state in memory MB | state on disk MB | outcome |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        cells = [f"{run.groups:,}", run.mode]
        if run.crashed or run.error or run.result is None:
            why = f"crashed: {run.crashed}" if run.crashed else f"{run.mode}: fails loud: {run.error}"
            held = run.result.extra.get("state_rows") if run.result else None
            state = f"estimate {run.groups * bpg / MB:.1f} > limit {limit / MB:.1f}" if run.mode == "driver" else "-"
            state += f"; {held:,.0f} groups held when it failed" if held is not None else ""
            print("| " + " | ".join(cells + ["-", "-", "-", "-", "-", state, "-", why]) + " |")
            continue
        r, x = run.result, run.result.extra
        split = " + ".join(f"{part / r.batches:.2f}" for part in cpu_split(r))
        per = [f"{r.cpu_per_batch:.2f} ({split})", f"{steady_per_batch(r):.2f}"]
        py_rss, heap = x["python_rss"] / MB, x["heap_used"] / MB
        memory = f"{py_rss + heap:.0f} ({py_rss:.0f} + {heap:.0f})"
        in_memory, on_disk = state_cells(run, bpg)
        held = f"completes, {x.get('state_rows', 0):,.0f} groups held"
        total = [f"{r.cpu:.1f} ({x['batches_run']:.0f})", f"{r.wall:.1f}"]
        print("| " + " | ".join(cells + per + total + [memory, in_memory, on_disk, held]) + " |")
    both = [g for g in args.sizes if all(any(x.groups == g and x.mode == m and x.result and not x.error for x in runs)
                                         for m in MODES)]
    if both:
        g = max(both)
        d, e = (next(x.result for x in runs if x.groups == g and x.mode == m) for m in MODES)
        print(f"\nthe plain workload side by side, {g:,} groups, one machine: executors / driver CPU per input batch "
              f"**{e.cpu_per_batch / d.cpu_per_batch:.2f}** over the whole run ({e.cpu_per_batch:.2f} / "
              f"{d.cpu_per_batch:.2f} s), **{steady_per_batch(e) / steady_per_batch(d):.2f}** after the first batch "
              f"({steady_per_batch(e):.2f} / {steady_per_batch(d):.2f} s)")
    else:
        print("\nno size both modes complete: no executors / driver figure")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", default=None, help=f"open groups per run, comma-separated (default {FULL_GROUPS}; "
                                                   f"--quick: {QUICK_GROUPS})")
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: groups {QUICK_GROUPS}, driver memory limit {QUICK_LIMIT_GB} GiB unless given")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--driver-memory-limit-gb", type=float, default=None,
                    help="the driver memory driver mode's window state may take (default 1; --quick: "
                         f"{QUICK_LIMIT_GB}): max_groups_per_window = limit / bytes per group")
    ap.add_argument("--bytes-per-group", type=int, default=None,
                    help="driver bytes per group the cap assumes (default: estimate_state's for this window)")
    ap.add_argument("--files", type=int, default=4, help="parquet files per size = input batches")
    ap.add_argument("--driver-memory", default="3g", help="spark.driver.memory, the JVM's heap ('' keeps Spark's)")
    ap.add_argument("--gc", choices=["parallel", "g1"], default="parallel", help="the JVM's garbage collector")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scratch", default=None, help="directory for data and runs (default: a temp dir)")
    ap.add_argument("--verbose", action="store_true", help="print each run's own output (progress lines)")
    # one run, in a process of its own (the parent starts these)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--cap", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.groups = int(args.groups)
        return child(args)

    args.sizes = [int(g) for g in (args.groups or (QUICK_GROUPS if args.quick else FULL_GROUPS)).split(",")]
    limit_gb = args.driver_memory_limit_gb if args.driver_memory_limit_gb is not None else \
        (QUICK_LIMIT_GB if args.quick else 1.0)
    limit = int(limit_gb * GIB)
    bpg = bytes_per_group(args)
    cap = limit // bpg
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; driver mode: {bpg} bytes per group, "
          f"limit {limit_gb:g} GiB -> max_groups_per_window {cap:,}", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="ematix-window-state-", dir=args.scratch))
    runs: list[Run] = []
    started = time.perf_counter()
    try:
        for groups in args.sizes:
            data = scratch / f"data-{groups}"
            t0 = time.perf_counter()
            generate_groups(data, groups, args.files, args.seed)
            print(f"data: {groups:,} groups in {args.files} files ({tree_size(data) / MB:.1f} MB, "
                  f"{time.perf_counter() - t0:.1f} s)", flush=True)
            for mode in args.modes:
                if mode == "driver" and groups * bpg > limit:
                    print(f"   driver: estimate {groups * bpg / MB:.1f} MB passes the limit {limit / MB:.1f} MB: "
                          "the run must fail loud", flush=True)
                work = scratch / f"{mode}-{groups}"
                work.mkdir()
                run = run_child(args, mode, groups, data, work, cap if mode == "driver" else groups)
                runs.append(run)
                print(run_line(run, bpg), flush=True)
                shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(data, ignore_errors=True)
        report(args, runs, bpg, limit)
        print(f"\ntotal {time.perf_counter() - started:.0f} s", flush=True)
        unexpected = [r for r in runs if r.crashed or r.result is None or (
            r.mode == "executors" and r.error) or (r.mode == "driver" and (r.groups * bpg > limit) != bool(
                r.error and r.error.startswith("StateCapExceeded")))]
        for r in unexpected:
            print(f"unexpected outcome: {r.mode} at {r.groups:,} groups "
                  f"({'past' if r.groups * bpg > limit else 'within'} the driver limit): "
                  f"{r.crashed or r.error or 'completed'}", flush=True)
        return 1 if unexpected else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
