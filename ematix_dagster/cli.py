"""``ematix-dagster validate | run PIPELINE.toml``.

Exit codes: 0 success, 2 a configuration error (nothing ran), 1 a failure while running
(the message says whether retrying can help).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Sequence

from ematix_dagster.errors import EmatixError, PipelineConfigError
from ematix_dagster.spec import PipelineSpec, load_pipeline


def _validate(spec: PipelineSpec) -> None:
    from ematix_dagster.spark.partials import analyse
    from ematix_dagster.spark.session import get_spark
    from ematix_dagster.spark.sources import union_sources

    spark = get_spark(f"ematix-validate-{spec.pipeline_name}")
    analyse(spark, spec, union_sources(spark, spec))


def cmd_validate(spec: PipelineSpec) -> int:
    _validate(spec)
    w = spec.window
    print(f"ok: pipeline {spec.pipeline_name}: {len(spec.sources)} source(s), {w.kind} window of {w.duration_ms} ms, "
          f"{len(w.aggregations)} aggregation(s), target {spec.target.kind}")
    return 0


def cmd_run(spec: PipelineSpec) -> int:
    from ematix_dagster.spark.runner import PipelineRunner

    runner = PipelineRunner(spec)

    def stop(signum: int, _frame: object) -> None:
        print(f"[{spec.pipeline_name}] {signal.Signals(signum).name}: stopping at the next batch boundary",
              file=sys.stderr, flush=True)
        threading.Thread(target=runner.request_stop, daemon=True).start()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    summary = runner.run()
    print(f"[{spec.pipeline_name}] done: {summary.batches} batches, {summary.rows_in} rows in, "
          f"{summary.windows_emitted} window rows emitted, {summary.late_rows} late rows", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ematix-dagster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("validate", "check a pipeline TOML (starts local Spark only to analyse [transform] sql)"),
                       ("run", "run a pipeline until its input is exhausted (available_now) or Ctrl-C / SIGTERM")):
        p = sub.add_parser(name, help=text)
        p.add_argument("pipeline", help="path of the pipeline TOML file")
    args = parser.parse_args(argv)
    try:
        spec = load_pipeline(args.pipeline)
        return {"validate": cmd_validate, "run": cmd_run}[args.command](spec)
    except PipelineConfigError as exc:
        print(f"error: invalid pipeline {args.pipeline}: {exc}", file=sys.stderr)
        return 2
    except EmatixError as exc:
        kind = "terminal" if exc.terminal else "transient (retrying may help)"
        print(f"error ({kind}): {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
