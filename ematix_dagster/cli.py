"""``ematix-dagster validate | run | check | state | migrate | reset | backfill PIPELINE.toml``.

Exit codes: 0 success, 2 a configuration error (nothing ran), 1 a failure while running or a
problem found by ``check`` (the message says whether retrying can help).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Sequence

from ematix_dagster.errors import BackfillRefused, ConfigError, UnexpectedError
from ematix_dagster.spark.failures.classify import classify
from ematix_dagster.spec import PipelineSpec, load_pipeline, spec_warnings


def _validate(spec: PipelineSpec) -> None:
    from ematix_dagster.spark.batch.convert import output_schema
    from ematix_dagster.spark.batch.emit_stage import EmitStage
    from ematix_dagster.spark.plans.row_plan import analyse_rows
    from ematix_dagster.spark.plans.window_plan import analyse
    from ematix_dagster.spark.sources.readers import union_sources
    from ematix_dagster.spark.spark_session import get_spark

    resolved = spec.resolved()
    spark = get_spark(f"ematix-validate-{spec.pipeline_name}")
    stream = union_sources(spark, resolved)
    if spec.is_row_pipeline:
        analyse_rows(spark, resolved, stream)
    else:
        plan = analyse(spark, resolved, stream)
        if resolved.emit is not None:
            EmitStage.analysed(resolved, output_schema(plan))


def _shape(spec: PipelineSpec) -> str:
    """What the pipeline writes, for the ``validate`` line."""
    if spec.rows is None:
        delayed = ", published when WATERMARK_TS() reaches them ([emit] sql)" if spec.emit else ""
        return f"{spec.window.shape}, {len(spec.window.aggregations)} aggregation(s){delayed}"
    if spec.rows.max_buffered_rows is None:  # mandatory with WATERMARK_TS(), refused without it
        return "rows of [transform] sql as they arrive"
    return (f"rows of [transform] sql held back until WATERMARK_TS() reaches them "
            f"(at most {spec.rows.max_buffered_rows:_} pending)")


def cmd_validate(spec: PipelineSpec) -> int:
    _validate(spec)
    print(f"ok: pipeline {spec.pipeline_name}: {len(spec.sources)} source(s), {_shape(spec)}, "
          f"target {spec.target.kind}")
    return 0


def cmd_run(spec: PipelineSpec, verbose: bool = False, resume_from_store: bool = False) -> int:
    from ematix_dagster.spark.runner import PipelineRunner

    if resume_from_store:
        from ematix_dagster.spark.resume import resume_from_store as resume

        print(resume(spec), file=sys.stderr, flush=True)

    runner = PipelineRunner(spec, quiet_failures=not verbose)

    def stop(signum: int, _frame: object) -> None:
        print(f"[{spec.pipeline_name}] {signal.Signals(signum).name}: stopping at the next batch boundary",
              file=sys.stderr, flush=True)
        threading.Thread(target=runner.request_stop, daemon=True).start()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    summary = runner.run()
    if spec.is_row_pipeline:
        held = summary.reports[-1].count("held_rows") if summary.reports else None
        print(f"[{spec.pipeline_name}] done: {summary.batches} batches, {summary.rows_in} rows in, "
              f"{sum(r.rows_written for r in summary.reports)} rows written"
              + (f", {held} held back by WATERMARK_TS()" if held else ""), file=sys.stderr)
        return 0
    print(f"[{spec.pipeline_name}] done: {summary.batches} batches, {summary.rows_in} rows in, "
          f"{summary.windows_emitted} window rows emitted, {summary.late_rows} late rows", file=sys.stderr)
    return 0


def cmd_check(spec: PipelineSpec) -> int:
    from ematix_dagster.operations import check

    report = check(spec)
    print(f"pipeline {spec.pipeline_name}: {report.store}, {report.position}, lease "
          f"{'held by ' + report.lease_holder if report.lease_holder else 'free'}")
    for problem in report.problems:
        print(f"problem {problem.code}: {problem.message}\n  way out: {problem.fix}")
    if report.healthy:
        print("ok: checkpoint and state store agree")
    return 0 if report.healthy else 1


def cmd_state(spec: PipelineSpec, detail: bool = False) -> int:
    from ematix_dagster.operations import summary

    print(json.dumps(summary(spec, detail=detail), indent=2, default=str))
    return 0


def cmd_migrate(spec: PipelineSpec, dry_run: bool) -> int:
    from ematix_dagster.operations import migrate

    for line in migrate(spec, dry_run=dry_run):
        print(line)
    return 0


def cmd_reset(spec: PipelineSpec, yes: bool) -> int:
    from ematix_dagster.operations import reset

    if not yes:
        if not sys.stdin.isatty():
            print("error: reset deletes the pipeline's state and checkpoint; confirm with --yes", file=sys.stderr)
            return 2
        answer = input(f"delete the state and checkpoint of pipeline {spec.pipeline_name} (not the target)? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    for line in reset(spec):
        print(line)
    return 0


def cmd_backfill(spec: PipelineSpec, start: str, end: str) -> int:
    from ematix_dagster.backfill import run_backfill

    r = run_backfill(spec, start, end, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"[{spec.pipeline_name}] backfilled {r.span}: "
          f"{r.windows} windows, {r.rows_written} rows written, {r.rows_deleted} rows replaced, {r.rows_read} rows "
          f"read, {r.seconds:.1f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ematix-dagster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = (
        ("validate", "check a pipeline TOML (starts local Spark only to analyse [transform] sql)"),
        ("run", "run a pipeline until its input is exhausted (available_now) or Ctrl-C / SIGTERM"),
        ("check", "compare the Spark checkpoint with the state store and explain any problem"),
        ("state", "print open windows, groups, bytes, watermarks and counters from the store"),
        ("migrate", "bring stored state to this version's format (respects the lease)"),
        ("reset", "delete the pipeline's state and checkpoint, never the target (respects the lease)"),
        ("backfill", "rewrite the windows starting in [--from, --to) from archived input ([backfill])"),
    )
    for name, text in commands:
        p = sub.add_parser(name, help=text)
        p.add_argument("pipeline", help="path of the pipeline TOML file")
        if name == "migrate":
            p.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
        if name == "reset":
            p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        if name == "run":
            p.add_argument("--resume-from-store", action="store_true",
                           help="the checkpoint is lost: start a new one after the offsets the state store holds")
        if name == "state":
            p.add_argument("--detail", action="store_true",
                           help='window_state = "executors": read Spark\'s state from the checkpoint for its open '
                                "windows (starts Spark)")
        if name == "backfill":
            p.add_argument("--from", dest="start", required=True, help="the range's start (ISO date or date-time, UTC)")
            p.add_argument("--to", dest="end", required=True, help="the range's end, exclusive")
        p.add_argument("--verbose", action="store_true",
                       help="on a failure, print Spark's log and the tracebacks (else written to a file it names)")
    args = parser.parse_args(argv)
    try:
        spec = load_pipeline(args.pipeline)
        if args.command in ("validate", "run"):
            for warning in spec_warnings(spec):  # the file as written: resolved values are never shown
                print(f"warning: {warning}", file=sys.stderr)
        if args.command == "migrate":
            return cmd_migrate(spec, args.dry_run)
        if args.command == "reset":
            return cmd_reset(spec, args.yes)
        if args.command == "backfill":
            return cmd_backfill(spec, args.start, args.end)
        if args.command == "run":
            return cmd_run(spec, args.verbose, args.resume_from_store)
        if args.command == "state":
            return cmd_state(spec, args.detail)
        return {"validate": cmd_validate, "check": cmd_check}[args.command](spec)
    except BackfillRefused as exc:  # nothing ran: the range asked for cannot be rewritten
        print(f"error: backfill refused: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:  # the pipeline's (PipelineConfigError) or its store's (StoreConfigError)
        print(f"error: invalid pipeline {args.pipeline}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - every failure leaves as a classified EmatixError
        err = classify(exc, Path(args.pipeline).stem)
        if isinstance(err, UnexpectedError) or args.verbose:
            traceback.print_exception(exc, file=sys.stderr)
        kind = "terminal" if err.terminal else "transient (retrying may help)"
        report = f" (Spark's report of it, with the JVM stack: {err.stack_file}; --verbose prints it)" \
            if err.stack_file else ""
        print(f"error ({kind}): {err}{report}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
