"""One run of our engine on a ``peers.py`` workload, in a process of its own as the peers run.

The pipeline is ``windowed_engines.our_spec`` (SQLite state, parquet target, one file per
micro-batch, ``available_now``) with ``end_of_input = "flush"``, so every window is written at the
end of the input, as Flink's final watermark and Pathway's end of input write theirs. Its Spark
session is ``run_setup.start_spark``'s (local[2], the heap at full size from the start, the parallel
collector). Prints ``PEER ready`` once the session is up and ``PEER done {json}`` at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run_setup import start_spark  # noqa: E402
from windowed_engines import our_spec  # noqa: E402

from ematix_dagster.spark.runner import PipelineRunner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--input", required=True, type=Path)
    ap.add_argument("--format", choices=["csv", "parquet"], default="csv")
    ap.add_argument("--work", required=True, type=Path, help="state, checkpoint and target (target/)")
    ap.add_argument("--max-groups", type=int, required=True)
    ap.add_argument("--driver-memory", default="3g")
    ap.add_argument("--gc", choices=["parallel", "g1"], default="parallel")
    args = ap.parse_args()

    t0 = time.perf_counter()
    spark = start_spark(args)
    spec = our_spec(args.input, args.work, args.workload, args.max_groups, end_of_input="flush",
                    source_format=args.format)
    print("PEER ready", flush=True)
    ready_s = time.perf_counter() - t0
    summary = PipelineRunner(spec, spark=spark, progress=lambda line: None).run()
    print("PEER done " + json.dumps({
        "ready_s": ready_s, "run_s": time.perf_counter() - t0 - ready_s, "batches": summary.batches,
        "rows_in": summary.rows_in, "late_rows": summary.late_rows,
        "distinct": "HLL lgK 14 (approximate)" if args.workload == "sketch" else ""}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
