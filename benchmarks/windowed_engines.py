"""The engines ``windowed_vs_native.py`` compares, each run once over the generated data.

``ours`` (a pipeline spec run by ``PipelineRunner``), the Spark ``floor`` (the same source, the
batch's groupBy and ``toArrow``, nothing else) and Spark's ``native`` streaming aggregation; ours
and the floor also on heartbeat-only batches. :func:`row_spec` is a row pipeline (no window) over
the same data, run like ours by :func:`run_spec` (``delayed_rows.py``).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generated_data import (  # noqa: E402
    HLL_PRECISION,
    LATENESS_MS,
    SCHEMA_DDL,
    pipeline_toml,
    row_pipeline_toml,
    state_store_toml,
)
from measure import CpuMeter, DriverTimer, PostgresBackends  # noqa: E402
from results import Result  # noqa: E402
from run_setup import settle  # noqa: E402

from ematix_dagster.columns import HEARTBEAT  # noqa: E402
from ematix_dagster.spark.batch.batch_report import RowCounts  # noqa: E402
from ematix_dagster.spark.input.checkpoint import batch_files  # noqa: E402
from ematix_dagster.spark.input.input_files import read_files  # noqa: E402
from ematix_dagster.spark.runner import PipelineRunner  # noqa: E402
from ematix_dagster.spark.sources.readers import union_sources  # noqa: E402
from ematix_dagster.spec import load_pipeline_str  # noqa: E402

WINDOW_US = 60_000_000
HEARTBEAT_INTERVAL_MS = 500
SESSION_GAP_S = 30
HOP_MS = 30_000


# ---------------------------------------------------------------------------------------------
# ours


def our_spec(data: Path, work: Path, workload: str, max_groups: int, heartbeat: bool = False, *,
             duration_ms: int = 60_000, emit_trigger: str = "watermark", retractions: bool = False,
             end_of_input: str = "keep", source_format: str = "parquet"):
    """Our pipeline spec for ``workload``: tumbling windows of ``duration_ms`` (sessions: ``SESSION_GAP_S``;
    ``hop``: hopping, a window every ``HOP_MS``) emitted under ``emit_trigger``, ``[target] retractions``
    and ``[run] end_of_input`` as given, over files in ``source_format``."""
    distinct = """
[[transform.window.aggregations]]
agg = "count_distinct"
column = "item"
as = "items"
mode = "approximate"
""" if workload == "sketch" else ""
    run = (f'trigger = "processing_time"\ntrigger_interval_ms = {HEARTBEAT_INTERVAL_MS}' if heartbeat
           else f'trigger = "available_now"\nend_of_input = "{end_of_input}"')
    shape = {"session": f'kind = "session"\ngap_ms = {SESSION_GAP_S * 1000}\nmax_session_duration_ms = 3_600_000',
             "hop": f'kind = "hopping"\nduration_ms = {duration_ms}\nhop_ms = {HOP_MS}',
             }.get(workload, f'kind = "tumbling"\nduration_ms = {duration_ms}')
    shape += f'\nemit_trigger = "{emit_trigger}"'
    target = "retractions = true" if retractions else ""
    return load_pipeline_str(pipeline_toml("bench-windowed", data, work, shape, max_groups, distinct, run, target,
                                           source_format))


def row_spec(data: Path, work: Path, sql: str, *, max_buffered_rows: int | None = None,
             postgres_url: str | None = None, schema: str | None = None):
    """A row pipeline (no ``[transform.window]``) over the generated data: ``sql`` over the view
    ``source``, lateness as the windowed pipelines', parquet target, ``trigger = "available_now"``;
    SQLite state in ``work``, or PostgreSQL at ``postgres_url`` in ``schema``."""
    return load_pipeline_str(row_pipeline_toml("bench-rows", data, work, sql, 'trigger = "available_now"',
                                               state_store_toml(work, postgres_url, schema), max_buffered_rows))


def target_rows(target: Path) -> dict[str, int]:
    """Rows a parquet target holds, by ``_emit_kind`` (every batch's files and the end-of-input flush's);
    a row pipeline's target, which has no ``_emit_kind``, as ``{"row": n}``."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    if not target.exists():
        return {}
    dataset = ds.dataset(target, format="parquet", partitioning="hive")
    if "_emit_kind" not in dataset.schema.names:
        return {"row": dataset.count_rows()}
    kinds = dataset.to_table(columns=["_emit_kind"])["_emit_kind"]
    return {str(v["values"]): int(v["counts"]) for v in pc.value_counts(kinds).to_pylist()}


def run_spec(spark, spec, workload: str, timer: DriverTimer, verbose: bool,
             postgres: PostgresBackends | None = None) -> Result:
    """One measured run of a pipeline spec by ``PipelineRunner`` (outputs left in place); ``postgres``
    also counts the CPU of the PostgreSQL backends serving this process (``Result.extra_cpu``)."""
    timer.reset()
    settle(spark)
    progress = (lambda line: print("   ", line, flush=True)) if verbose else (lambda line: None)
    with CpuMeter(extra_pids=postgres) as meter:
        t0 = time.perf_counter()
        summary = PipelineRunner(spec, spark=spark, progress=progress).run()
        wall = time.perf_counter() - t0
    if summary.late_rows:
        print(f"    note: {summary.late_rows} late rows", flush=True)
    row_batches = [(r.rows_in, r.counts.released_rows, r.counts.held_rows) for r in summary.reports
                   if isinstance(r.counts, RowCounts)]
    return Result("ours", workload, meter.cpu, wall, meter.peak_rss, summary.batches, summary.rows_in,
                  summary.windows_emitted + sum(released for _, released, _ in row_batches), meter.by_process(),
                  [r.seconds for r in summary.reports],
                  timer.cpu["Engine.process"] + timer.cpu["convert.partial_lists"],
                  {k: (timer.calls[k], timer.cpu[k], timer.wall[k]) for k in timer.calls}, meter.by_jvm_thread(),
                  row_batches=row_batches, extra_cpu=meter.extra_cpu)


def run_ours(spark, data: Path, scratch: Path, workload: str, timer: DriverTimer, max_groups: int,
             verbose: bool, **spec_options) -> Result:
    """One run of ours (``spec_options``: :func:`our_spec`'s keywords), its target's rows counted by
    kind after the measurement."""
    work = Path(tempfile.mkdtemp(prefix="ours-", dir=scratch))
    result = run_spec(spark, our_spec(data, work, workload, max_groups, **spec_options), workload, timer, verbose)
    result.rows_by_kind = target_rows(work / "target")
    shutil.rmtree(work, ignore_errors=True)
    return result


def profile_ours(spark, data: Path, scratch: Path, workload: str, timer: DriverTimer, max_groups: int,
                 top: int, out_path: str | None = None, **spec_options) -> None:
    """One extra run of ours with cProfile inside the foreachBatch callback; prints its stats."""
    profile_run(timer, top, out_path,
                lambda: run_ours(spark, data, scratch, workload, timer, max_groups, verbose=False, **spec_options))


def profile_run(timer: DriverTimer, top: int, out_path: str | None, run: Callable[[], Result]) -> None:
    """``run()`` once with cProfile inside the foreachBatch callback (the timer's profiled wrap); prints its stats."""
    timer.profiler = cProfile.Profile()
    result = run()
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
