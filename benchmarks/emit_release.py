#!/usr/bin/env python
"""A windowed pipeline publishing part of its rows late with ``[emit] sql``, against the same pipeline
without ``[emit]``.

Data: ``windowed_vs_native.py``'s plain workload (``generated_data.generate``): ``--events`` rows
(default 2,000,000) over ``--keys`` keys (default 10,000) in ``--files`` parquet files (default 20,
so 20 micro-batches), each file the next 60 s of event time. The pipeline is the plain workload's
(``windowed_engines.our_spec``: tumbling 60 s windows, count and sum per key, lateness 5 s,
parquet target, SQLite store, ``trigger = "available_now"``), either

- ``plain``: without ``[emit]``; or
- ``emit``: with ``[emit] sql = "SELECT * FROM windows WHERE key % 100 >= <P> OR window_end +
  INTERVAL 60 SECONDS <= WATERMARK_TS()"`` (``--delayed-percent`` P, default 12): the rows of P %
  of the keys wait one window, so after each batch about P % of the rows it emitted are pending.

Reported per variant: CPU (process tree: the driver, the JVM), wall, the driver callback's CPU, the
rows written, the pending share after each batch (rows pending / rows the batch emitted, from
``EmitBuffer.process``), and the CPU of ``emit`` over ``plain``. Medians of ``--runs`` runs, the
variants' order rotated from run to run, after ``--warmup`` unmeasured runs of each.

    .venv/bin/python benchmarks/emit_release.py --events 200000 --runs 1 --warmup 0   # smoke, ~1 min
    .venv/bin/python benchmarks/emit_release.py --warmup 1 --runs 3                   # full
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import Result, median_result, print_splits  # noqa: E402
from run_setup import add_data_arguments, add_variant_arguments, install_timers, prepare, rotated_runs  # noqa: E402
from windowed_engines import our_spec, profile_run, run_spec, target_rows  # noqa: E402

from ematix_dagster.spec import EmitRelease  # noqa: E402
from ematix_dagster.streaming.emit_buffer import EmitBuffer  # noqa: E402

VARIANTS = ("plain", "emit")
CALLBACK = "foreachBatch callback"  # driver thread CPU in our code: the batch's callback


def emit_of(percent: int, max_rows: int) -> EmitRelease:
    return EmitRelease(sql=f"SELECT * FROM windows WHERE key % 100 >= {percent} "
                           "OR window_end + INTERVAL 60 SECONDS <= WATERMARK_TS()",
                       max_buffered_rows=max_rows)


class PendingShares:
    """Rows pending after each batch over the rows it emitted, read from every ``EmitBuffer.process``."""

    def __init__(self) -> None:
        self.shares: list[float] = []
        real = EmitBuffer.process

        def process(buffer: EmitBuffer, batch_id, emitted, *args, **kwargs):
            out = real(buffer, batch_id, emitted, *args, **kwargs)
            if len(emitted) and not kwargs.get("flush"):
                self.shares.append(out.pending / len(emitted))
            return out

        EmitBuffer.process = process  # type: ignore[method-assign]

    def take(self) -> list[float]:
        shares, self.shares = self.shares, []
        return shares


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    add_variant_arguments(ap, list(VARIANTS), "emit")
    ap.add_argument("--delayed-percent", type=int, default=12, help="P: the keys (key %% 100 < P) whose rows wait")
    args = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="ematix-emit-bench-", dir=args.scratch))
    data = scratch / "data"
    try:
        spark = prepare(args, data)
        timer = install_timers()
        pending = PendingShares()
        shares: dict[str, list[float]] = {}

        def run(variant: str, verbose: bool = False) -> Result:
            work = Path(tempfile.mkdtemp(prefix="emit-", dir=scratch))
            spec = our_spec(data, work, "plain", args.keys * 2)
            if variant == "emit":
                spec = replace(spec, emit=emit_of(args.delayed_percent, args.keys)).validate()
            r = run_spec(spark, spec, "plain", timer, verbose)
            r.engine = variant
            r.rows_by_kind = target_rows(work / "target")
            shares[variant] = pending.take()
            shutil.rmtree(work, ignore_errors=True)
            return r

        def after(r: Result) -> None:
            share = shares.get(r.engine) or [0.0]
            print(f"          pending after a batch min / median / max {min(share):.1%} / "
                  f"{statistics.median(share):.1%} / {max(share):.1%}; rows written "
                  f"{sum(r.rows_by_kind.values())}", flush=True)
            print(f"          {r.jvm_line()}", flush=True)
            print_splits(r)

        results = rotated_runs(list(args.variants), args.warmup, args.runs, run, args.verbose, after)
        if args.profile:
            profile_run(timer, args.profile_top, args.profile_out, lambda: run(args.profile_variant))

        med = {k: median_result(v) for k, v in results.items()}
        print(f"\nmedian of {args.runs} run(s); {args.events} events, {args.keys} keys, {args.files} micro-batches "
              f"(60 s of event time each), tumbling 60 s, lateness 5 s, {args.delayed_percent} % of keys delayed "
              "one window; parquet target, SQLite store; CPU = process tree (driver + JVM)")
        print("| variant | CPU s | wall s | driver callback CPU s | rows written | CPU / plain |")
        print("|---|---|---|---|---|---|")
        base = med.get("plain")
        for name, r in med.items():
            callback = statistics.median(s.splits.get(CALLBACK, (0, 0.0, 0.0))[1] for s in results[name])
            written = statistics.median(sum(s.rows_by_kind.values()) for s in results[name])
            ratio = f"**{r.cpu / base.cpu:.2f}**" if base and name != "plain" else "-"
            print(f"| {name} | {r.cpu:.1f} | {r.wall:.1f} | {callback:.2f} | {written:.0f} | {ratio} |")
        for name, runs in results.items():
            print(f"{name}: single runs CPU {' / '.join(f'{r.cpu:.1f}' for r in runs)} s")
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
