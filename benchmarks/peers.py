#!/usr/bin/env python
"""Our engine against Apache Flink (SQL through PyFlink) and Pathway: the same events, the same windows.

Data: ``generated_data.generate`` (``--events``, ``--keys``, ``--files``; at the defaults a key's
rows are 24 s apart on average, so a 30 s gap makes sessions of a few rows), event times rounded
to whole milliseconds (Flink's event time is ``TIMESTAMP(3)``), written once as parquet and then as
CSV, which every engine reads (Flink ships no parquet format and Pathway has no parquet reader):

- **ours** (this interpreter): the ``--files`` CSV files, one per micro-batch, by
  ``peers/ours_runner.py`` (``windowed_engines.our_spec``: SQLite state, parquet target,
  ``available_now``, ``end_of_input = "flush"``; local[2]);
- **flink** (``peers/.venv-flink``): the same files concatenated in file order into one CSV file,
  by ``peers/flink_runner.py`` (window TVFs, watermark ``ts - lateness``, parallelism 1). One
  file, because Flink's file source hands a directory's files to its reader in no fixed order
  (measured: 1, 3, 2, 0), so a later file's watermark would drop an earlier file's rows as late;
- **pathway** (``peers/.venv-pathway``): that file with a header line (Pathway's CSV reader needs
  one), by ``peers/pathway_runner.py`` (``windowby``, ``exactly_once_behavior(shift=lateness)``,
  static mode, one worker thread).

Workloads (``--workloads``): ``plain`` (count + sum(amount) per key, 1-minute tumbling), ``sketch``
(+ distinct items: ours HLL lgK 14, Flink exact ``COUNT(DISTINCT)``, Pathway exact
``count_distinct``: its HLL reducer takes append-only tables only and panics on ``windowby``'s),
``session`` (count + sum per key, gap 30 s) and ``hop`` (count + sum, 1-minute windows every
30 s). Lateness 5 s everywhere; every window is written by the end of the input.

Each engine runs in a process of its own (``--runs`` runs, the engines' order rotated from run to
run); CPU is psutil's over the whole process tree (the runner's Python, its JVM, Pathway's Rust
threads), sampled by ``measure.CpuMeter``, split into the start (interpreter, JVM, Spark session
or Flink catalog, until the runner prints ``PEER ready``) and the rest. Each engine's rows are
read back (``peer_rows.py``) and compared with ours: counts exactly, sums to a relative 1e-9,
distinct counts within the HLL bound, or the difference named as a rule.

    benchmarks/peers/setup.sh flink && benchmarks/peers/setup.sh pathway
    .venv/bin/python benchmarks/peers.py --events 100000 --runs 1     # smoke
    .venv/bin/python benchmarks/peers.py                              # full
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generated_data import LATENESS_MS, generate, write_csv  # noqa: E402
from measure import CpuMeter  # noqa: E402
from peer_rows import Comparison, compare, flink_rows, ours_rows, pathway_rows  # noqa: E402
from results import Result  # noqa: E402
from run_setup import add_data_arguments  # noqa: E402
from windowed_engines import SESSION_GAP_S  # noqa: E402

ENGINES = ("ours", "flink", "pathway")
WORKLOADS = ("plain", "sketch", "session", "hop")
PEERS = Path(__file__).resolve().parent / "peers"
#: each engine's distinct-count aggregator, as the report names it
DISTINCT = {"ours": "HLL lgK 14", "flink": "exact COUNT(DISTINCT)", "pathway": "exact count_distinct"}


@dataclass
class Inputs:
    """One generated data set in the forms the engines read."""

    keys: int
    files: Path  # the CSV files, one per micro-batch (ours)
    one: Path  # the same lines in one file (Flink)
    one_with_header: Path  # and with a header line (Pathway)


@dataclass
class Outcome:
    """An engine's runs of one workload: results, or the error that stopped them, and its rows."""

    results: list[Result] = field(default_factory=list)
    error: str | None = None
    rows: pd.DataFrame | None = None
    comparison: Comparison | None = None


def prepare_inputs(scratch: Path, args: argparse.Namespace) -> Inputs:
    base = scratch / "data"
    t0 = time.perf_counter()
    generate(base / "parquet", args.events, args.keys, args.files, args.items, args.disorder_ms, args.seed, tick_us=1_000)
    write_csv(base / "parquet", base / "csv")
    one, header = base / "one" / "events.csv", base / "one-header" / "events.csv"
    one.parent.mkdir()
    header.parent.mkdir()
    with open(one, "wb") as out:
        for part in sorted((base / "csv").glob("part-*.csv")):
            out.write(part.read_bytes())
    with open(header, "wb") as out:
        out.write(b"key,amount,item,ts\n")
        out.write(one.read_bytes())
    print(f"data: {args.events} events, {args.keys} keys, {args.files} CSV files ({one.stat().st_size / 2**20:.1f} MB) "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)
    return Inputs(args.keys, base / "csv", one, header)


def command(engine: str, workload: str, inputs: Inputs, work: Path, args: argparse.Namespace) -> list[str]:
    if engine == "ours":
        return [sys.executable, str(PEERS / "ours_runner.py"), "--workload", workload, "--input", str(inputs.files),
                "--work", str(work), "--max-groups", str(max(inputs.keys, 1_000)),
                "--driver-memory", args.driver_memory, "--gc", args.gc]
    python = str(venv_python(engine))
    if engine == "flink":
        return [python, str(PEERS / "flink_runner.py"), "--workload", workload, "--input", str(inputs.one),
                "--output", str(work / "out"), "--lateness-ms", str(LATENESS_MS), "--gap-s", str(SESSION_GAP_S)]
    return [python, str(PEERS / "pathway_runner.py"), "--workload", workload, "--input", str(inputs.one_with_header),
            "--output", str(work / "out.csv"), "--lateness-ms", str(LATENESS_MS), "--gap-s", str(SESSION_GAP_S)]


def venv_python(engine: str) -> Path:
    return PEERS / f".venv-{engine}" / "bin" / "python"


def read_rows(engine: str, workload: str, work: Path) -> pd.DataFrame:
    if engine == "ours":
        return ours_rows(work / "target")
    if engine == "flink":
        return flink_rows(work / "out", distinct=workload == "sketch")
    return pathway_rows(work / "out.csv")


def run_engine(engine: str, workload: str, inputs: Inputs, scratch: Path, args: argparse.Namespace,
               keep_rows: bool) -> tuple[Result | None, str | None, pd.DataFrame | None]:
    """One run in a process of its own: (its result, None, its rows if ``keep_rows``) or (None, error, None)."""
    work = Path(tempfile.mkdtemp(prefix=f"{engine}-{workload}-", dir=scratch))
    log = work / "log.txt"
    info: dict = {}
    start_cpu = start_wall = float("nan")
    with CpuMeter() as meter, open(log, "w") as log_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen(command(engine, workload, inputs, work, args), stdout=subprocess.PIPE,
                                stderr=log_file, text=True, start_new_session=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if line.startswith("PEER ready"):
                    start_cpu, start_wall = meter.sample(), time.perf_counter() - t0
                elif line.startswith("PEER done "):
                    info = json.loads(line[len("PEER done "):])
                else:
                    log_file.write(line)
            rc = proc.wait(timeout=args.timeout_s)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.perf_counter() - t0
    if rc != 0 or not info:
        return None, f"exit {rc}: {last_error(log)} (log: {log})", None
    try:
        rows = read_rows(engine, workload, work)
    except Exception as e:  # a peer's output this script cannot read is that peer's error, not the run's end
        return None, f"its rows could not be read: {e!r} (in {work})", None
    result = Result(engine, workload, meter.cpu, wall, meter.peak_rss, info.get("batches", 1), info.get("rows_in", 0),
                    len(rows), meter.by_process(), jvm=meter.by_jvm_thread(),
                    extra={"start_cpu": start_cpu, "start_wall": start_wall, "late_rows": info.get("late_rows", 0)})
    shutil.rmtree(work, ignore_errors=True)
    return result, None, rows if keep_rows else None


def last_error(log: Path) -> str:
    """The log's last line naming an error or exception (Java or Python), else its last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line or "Exception" in line]
    return (named or lines or ["no output"])[-1][:400]


def report(args: argparse.Namespace, outcomes: dict[tuple[str, str], Outcome], loads: list[float]) -> None:
    print(f"\nmedians of {args.runs} run(s), engines rotated; {args.events} events, {args.files} files; load average "
          f"{min(loads):.1f}-{max(loads):.1f} during the runs; CPU = each engine's whole process tree")
    print("| workload | engine | distinct aggregator | CPU s (single runs) | start CPU s | CPU s after start | "
          "wall s | rows out | rows vs ours |")
    print("|---|---|---|---|---|---|---|---|---|")
    for workload in args.workloads:
        for engine in args.engines:
            o = outcomes.get((workload, engine))
            if o is None:
                continue
            agg = DISTINCT[engine] if workload == "sketch" else "-"
            if not o.results:
                print(f"| {workload} | {engine} | {agg} | - | - | - | - | - | {o.error} |")
                continue
            cpus = [r.cpu for r in o.results]
            start = statistics.median(r.extra["start_cpu"] for r in o.results)
            after = statistics.median(r.cpu - r.extra["start_cpu"] for r in o.results)
            single = " / ".join(f"{c:.1f}" for c in cpus)
            verdict = "(ours)" if engine == "ours" else o.comparison.verdict() if o.comparison else "-"
            rows = sorted({r.rows_out for r in o.results})
            print(f"| {workload} | {engine} | {agg} | {statistics.median(cpus):.1f} ({single}) | {start:.1f} | "
                  f"{after:.1f} | {statistics.median(r.wall for r in o.results):.1f} | "
                  f"{', '.join(f'{n:,}' for n in rows)} | {verdict}{'; ' + o.error if o.error else ''} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    ap.set_defaults(events=500_000, runs=3, warmup=0)
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["plain", "sketch", "session"])
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    ap.add_argument("--driver-memory", default="3g", help="ours: spark.driver.memory")
    ap.add_argument("--timeout-s", type=int, default=900, help="a run still going after this is killed and reported")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scratch", default=None, help="directory for data and outputs (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.warmup:
        ap.error("--warmup does not apply: every run is a fresh process")

    scratch = Path(tempfile.mkdtemp(prefix="ematix-peers-", dir=args.scratch))
    outcomes: dict[tuple[str, str], Outcome] = {(w, e): Outcome() for w in args.workloads for e in args.engines}
    for engine in args.engines:
        if engine != "ours" and not venv_python(engine).exists():
            for workload in args.workloads:
                outcomes[(workload, engine)].error = (f"not installed: run benchmarks/peers/setup.sh {engine} "
                                                      f"(no {venv_python(engine)})")
    loads: list[float] = []
    try:
        inputs = prepare_inputs(scratch, args)
        for i in range(args.runs):
            engines = args.engines[i % len(args.engines):] + args.engines[:i % len(args.engines)]
            for workload in args.workloads:
                for engine in engines:
                    o = outcomes[(workload, engine)]
                    if o.error and not o.results:
                        continue
                    result, error, rows = run_engine(engine, workload, inputs, scratch, args, o.rows is None)
                    loads.append(os.getloadavg()[0])
                    if result is None:
                        o.error = error
                        print(f"run {i + 1}/{args.runs} {engine:>7} {workload:<7}: FAILED {error}", flush=True)
                        continue
                    o.results.append(result)
                    if rows is not None:
                        o.rows = rows
                    print(f"run {i + 1}/{args.runs} {result.line()} (start CPU {result.extra['start_cpu']:.1f} s, "
                          f"wall {result.extra['start_wall']:.1f} s; load avg {loads[-1]:.1f})", flush=True)
                    if result.jvm:
                        threads = ", ".join(f"{k} {v:.1f}" for k, v in sorted(result.jvm.items(), key=lambda kv: -kv[1]))
                        print(f"          JVM CPU s by thread: {threads}", flush=True)
        for workload in args.workloads:
            ours = outcomes.get((workload, "ours"))
            for engine in args.engines:
                peer = outcomes[(workload, engine)]
                if engine != "ours" and ours is not None and ours.rows is not None and peer.rows is not None:
                    peer.comparison = compare(ours.rows, peer.rows, engine.capitalize(),
                                              SESSION_GAP_S * 1000 if workload == "session" else None)
        report(args, outcomes, loads or [os.getloadavg()[0]])
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
