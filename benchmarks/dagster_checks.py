"""What a pipeline asset's checks cost (docs/dagster.md, "Asset checks"), beside what they ride on.

Runs our pipeline once over the generated events (1-hour tumbling windows, so every key's group
stays open in the SQLite or PostgreSQL store), then measures, alternated, medians of ``--runs``:

- **start checks**: the four checks from the store (``check_reports.stored_results``: checkpoint
  against store with every stored group decoded, idempotent target, lag, late rows), against the
  **restore** every run's start already pays (open the store, load the pipeline's state);
- **per materialization**: what the running step adds after a materialization (the latest
  materialization looked up, two runless evaluations written) against writing the
  materialization itself, in a Dagster instance on local SQLite storage;
- **checks job**: one pipeline's part of ``ematix_checks_job`` (start checks + four runless
  evaluations), no Spark session in it.

.venv/bin/python benchmarks/dagster_checks.py --events 400000 --keys 20000 --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dagster as dg  # noqa: E402
from generated_data import generate, pipeline_toml  # noqa: E402
from run_setup import add_data_arguments  # noqa: E402

from ematix_dagster.dagster import EmatixPipeline, streaming_pipeline_asset  # noqa: E402
from ematix_dagster.dagster.check_reports import StepChecks, report_stored_checks, stored_results  # noqa: E402
from ematix_dagster.dagster.checks import CheckBounds  # noqa: E402
from ematix_dagster.spark.runner import PipelineRunner  # noqa: E402
from ematix_dagster.spark.spark_session import get_spark  # noqa: E402
from ematix_dagster.spec import load_pipeline_str  # noqa: E402
from ematix_dagster.stores import make_store  # noqa: E402


class _Report:
    """The fields of a batch report the running checks read."""

    def __init__(self, batch_id: int) -> None:
        self.batch_id, self.late_rows, self.rows_in, self.watermark = batch_id, 3, 100_000, int(time.time() * 1e6)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def restore(spec) -> None:
    store = make_store(spec.state_store)
    store.open()
    try:
        store.load(spec.pipeline_name)
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    ap.add_argument("--postgres-url", default=None, help="a PostgreSQL store instead of SQLite")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="ematix-checks-bench-"))
    generate(scratch / "data", args.events, args.keys, args.files, args.items, args.disorder_ms, args.seed)
    spark = get_spark("ematix-bench-checks")
    toml = pipeline_toml("checks-bench", scratch / "data", scratch / "work", 'kind = "tumbling"\nduration_ms = 3_600_000',
                         max(args.keys * 2, 1_000), "", 'trigger = "available_now"')
    if args.postgres_url:
        toml = toml.replace(f'[state_store]\nkind = "sqlite"\npath = "{scratch / "work" / "state.db"}"\n',
                            f'[state_store]\nkind = "postgres"\nurl = "{args.postgres_url}"\nschema = "checks_bench"\n')
    spec = load_pipeline_str(toml)
    t0 = time.perf_counter()
    PipelineRunner(spec, spark=spark).run()
    print(f"pipeline ran in {time.perf_counter() - t0:.1f} s; {spec.state_store.kind} store", flush=True)

    asset = streaming_pipeline_asset(spec)
    pipeline = EmatixPipeline.from_asset(asset)
    bounds = CheckBounds.of_asset(asset)
    declared = {c.name for c in asset.check_specs}
    times: dict[str, list[float]] = {k: [] for k in ("restore", "start checks", "materialization",
                                                     "per materialization", "checks job")}
    with dg.instance_for_test() as instance:
        step = StepChecks(instance, pipeline, bounds, declared, set())
        for run in range(args.runs):
            times["restore"].append(timed(lambda: restore(spec)))
            times["start checks"].append(timed(lambda: stored_results(pipeline, spec, bounds)))
            written = dg.AssetMaterialization(asset_key=pipeline.key, metadata={"batch_id": run})
            times["materialization"].append(timed(lambda m=written: instance.report_runless_asset_event(m)))
            report = _Report(run)
            times["per materialization"].append(timed(lambda r=report, m=written: list(step.after_report(r, m))))
            with dg.instance_for_test() as fresh:  # nothing evaluated yet: every check reported
                times["checks job"].append(timed(lambda: report_stored_checks(fresh, pipeline, spec, bounds,
                                                                               declared)))
    med = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: f"{min(v):.1f}-{max(v):.1f}" for k, v in times.items()}
    print(f"\n{args.events} events, {args.keys} keys (open groups in the store), {args.runs} runs; ms, median (range)")
    for name, value in med.items():
        print(f"  {name:<20} {value:8.1f}  ({spread[name]})")
    print(f"  start checks / restore:                     {med['start checks'] / med['restore']:.2f}x")
    print(f"  per materialization / the materialization:  {med['per materialization'] / med['materialization']:.2f}x")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
