#!/usr/bin/env python
"""How long an event waits before its window's row is committed: Redis stream in, PostgreSQL out.

A producer process (``stream_producer.py``) appends events to a fresh Redis stream at a steady
``--rates`` (entries per second) for ``--seconds``; its own CPU is reported. Each event carries its
event time (``ts``, epoch ms: the producer's clock when it sent the entry); its append time is the
time in its entry id, which Redis takes from the server's clock when the entry is added (same
machine, same clock as everything else here). The pipeline reads the stream (``redis_stream``,
``format = "json"``) under a processing-time trigger of 1 s, per key (``--keys``) in 10-second
tumbling windows with ``lateness_ms = 0`` (count + sum), state in PostgreSQL and the rows in a
PostgreSQL table of the same database in the same transaction (``same_transaction = true``), both
in a fresh schema dropped afterwards.

Per the contract (docs/contract/time-and-watermarks.md, windows.md) the watermark after a batch is
the largest event time seen, and a window [s, e) closes in the batch after which e <= W: the batch
holding the first event with ts >= e, the window's **closing event**. Event times follow append
order, so it is the first entry with ts >= e, found in the stream after the run. Its latency runs
from its append time to the moment the closing batch's transaction committed: when the state
store's ``commit`` returned on the driver (it writes the window's rows, state and offsets in one
PostgreSQL transaction). As a check, the table's ``committed_at`` column (default
``clock_timestamp()``, the time of the row's INSERT inside that transaction) must fall within that
commit. Breakdown, which adds up to the latency:

- **wait for trigger**: append -> the trigger that took the entry started (Spark's progress
  ``timestamp``); a batch longer than the interval makes the next trigger wait for it;
- **Spark before callback**: trigger start -> our ``foreachBatch`` callback starts (the source's
  ``latestOffset`` against Redis, the offsets log, planning);
- **Spark job**: the batch's ``toArrow`` calls (the job: Redis read in a Python worker, JSON
  parse, partial aggregates);
- **driver**: the rest of the callback before the commit (plan building, conversion, the window
  engine, the output rows);
- **commit**: the target write and the store's transaction (rows, state, offsets).

``every_batch`` (``--modes``) runs the same with ``emit_trigger = "every_batch"`` and reports,
besides, the time to a window's first ``early`` row: from the append of the window's first event
(the first entry with ts >= s, which is also the previous window's closing event) to the commit of
the batch holding it. The **floor** runs the same pipeline at ``--floor-rate`` (default one entry
every 2 s) for ``--floor-seconds``: batches with one entry and empty batches (only the heartbeat
ticked: no Spark job) through the same path, trigger start -> commit.

An unmeasured warm-up run (``--warmup-seconds`` at the first rate) comes first. The machine's load
average is printed with every run. Needs Redis 7 at ``--url`` and PostgreSQL at
``--postgres-url``.

    .venv/bin/python benchmarks/latency.py --seconds 25 --rates 1000 --floor-seconds 12 --warmup-seconds 0  # smoke
    .venv/bin/python benchmarks/latency.py                                                                  # full
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Callable, cast

import psycopg
import redis
import tomli_w
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import CpuMeter, DriverTimer, percentile, spark_jobs, stage_times  # noqa: E402
from run_setup import install_timers, start_spark  # noqa: E402

from ematix_dagster.errors import EmatixError  # noqa: E402
from ematix_dagster.spark.batch.batch_report import BatchReport  # noqa: E402
from ematix_dagster.spark.runner import PipelineRunner  # noqa: E402
from ematix_dagster.spec import load_pipeline_str  # noqa: E402

WINDOW_MS = 10_000
PRODUCER = Path(__file__).resolve().parent / "stream_producer.py"
MODES = ["watermark", "every_batch"]
#: the breakdown's parts, in the order they add up to the latency
PARTS = ["wait for trigger", "Spark before callback", "Spark job", "driver", "commit"]
#: the DriverTimer labels (run_setup.install_timers) a batch's parts are read from
CALLBACK, JOB, WRITE, COMMIT = ("foreachBatch callback", "partials.toArrow (Spark job + Arrow)", "target write",
                                "state store commit (encode + store)")


@dataclass
class Batch:
    """One micro-batch on the epoch clock (seconds): Spark's trigger start, our callback, its commit."""

    batch_id: int
    trigger: float
    callback: tuple[float, float]
    job: float  # seconds in toArrow (the Spark job)
    commit: float  # seconds in the target write and the store's commit
    committed: float  # when the store's commit returned
    end_id: tuple[int, int]  # the last stream entry the batch took ((0, 0): none yet)
    rows_in: int
    spark_ms: dict[str, int]  # Spark's durationMs of the trigger

    def parts(self, appended: float) -> dict[str, float]:
        """The breakdown (:data:`PARTS`) of an entry appended at ``appended`` and committed by this batch."""
        start, _ = self.callback
        driver = self.committed - start - self.job - self.commit
        return dict(zip(PARTS, (self.trigger - appended, start - self.trigger, self.job, driver, self.commit)))


@dataclass
class Waited:
    """One window's wait: the entry that started it, the batch that committed its row."""

    window_start_ms: int
    entry_id: tuple[int, int]
    batch: Batch
    row_inserted: float | None  # the table's committed_at (min over the window's rows)

    @property
    def seconds(self) -> float:
        return self.batch.committed - self.entry_id[0] / 1000

    @property
    def parts(self) -> dict[str, float]:
        return self.batch.parts(self.entry_id[0] / 1000)


@dataclass
class RunResult:
    label: str
    rate: float
    seconds: float
    producer: dict[str, float]
    engine_cpu: float
    batches: list[Batch]
    closing: list[Waited]
    first_early: list[Waited] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at the start and the end
    load_start: float = 0.0  # when the producer started (epoch s): batches before it are the query's start
    jobs: tuple[int, int] = (0, 0)  # Spark jobs and stages the run submitted
    cpu_by_process: dict[str, float] = field(default_factory=dict)  # the engine's CPU s by process name
    behind: int = 0  # windows whose closing event no batch of the run committed (the query fell behind)
    stages: dict[str, float] = field(default_factory=dict)  # measure.stage_times over the run
    jvm_threads: dict[str, float] = field(default_factory=dict)  # the JVM's CPU s by thread group

    @property
    def loaded(self) -> list[Batch]:
        """The batches that ran once the load started."""
        return [b for b in self.batches if b.trigger >= self.load_start]


def parse_id(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, seq = text.split("-")
    return int(ms), int(seq)


def pipeline_toml(args: argparse.Namespace, stream: str, schema: str, work: Path, mode: str) -> str:
    return tomli_w.dumps({
        "pipeline_name": "latency-bench",
        "sources": [{"name": "events", "kind": "redis_stream", "url": args.url, "streams": [stream],
                     "start": "earliest", "format": "json", "schema": "key BIGINT, amount DOUBLE, ts BIGINT",
                     "event_time_column": "ts", "event_time_unit": "ms"}],
        "transform": {"window": {"kind": "tumbling", "duration_ms": WINDOW_MS, "lateness_ms": 0, "group_by": ["key"],
                                 "max_groups_per_window": 1_000_000, "emit_trigger": mode,
                                 "aggregations": [{"agg": "count", "as": "n"},
                                                  {"agg": "sum", "column": "amount", "as": "total"}]}},
        "target": {"kind": "postgres", "url": args.postgres_url, "table": f"{schema}.windows",
                   "same_transaction": True},
        "state_store": {"kind": "postgres", "url": args.postgres_url, "schema": schema},
        "run": {"trigger": "processing_time", "trigger_interval_ms": 1_000,
                "checkpoint_location": str(work / "checkpoint")}})


def create_target(conn: psycopg.Connection, schema: str, mode: str) -> None:
    """The target table as the engine would create it, plus ``committed_at``: each row's INSERT
    time (an upsert of a key already there keeps it, so under ``every_batch`` it is the first
    ``early`` row's)."""
    emit_kind = sql.SQL("_emit_kind text, ") if mode != "watermark" else sql.SQL("")
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL(
        "CREATE TABLE {}.windows (window_start timestamptz, window_end timestamptz, key bigint, n bigint, "
        "total double precision, {}committed_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
        "UNIQUE NULLS NOT DISTINCT (window_start, key))").format(sql.Identifier(schema), emit_kind))


def batches_of(query, timer: DriverTimer, reports: dict[int, BatchReport], stream: str) -> list[Batch]:
    """Spark's progress of every batch that ran, with our callback's spans inside it."""
    assert timer.spans is not None
    spans = sorted(timer.spans, key=lambda s: s[1])
    callbacks = [s for s in spans if s[0] == CALLBACK]
    progress = sorted((p for p in query.recentProgress if "addBatch" in p.durationMs), key=lambda p: p.batchId)
    out, last_id = [], (0, 0)
    for p in progress:
        trigger = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp()
        done = trigger + p.durationMs["triggerExecution"] / 1000
        inside = [c for c in callbacks if trigger - 0.01 <= c[1] <= done + 0.01]
        if len(inside) != 1 or p.batchId not in reports:
            continue  # the batch a stop abandoned
        _, c0, c1 = inside[0]
        within = [s for s in spans if c0 <= s[1] <= c1]
        commits = [s for s in within if s[0] == COMMIT]
        last_id = stream_end(p, stream) or last_id
        out.append(Batch(
            batch_id=p.batchId, trigger=trigger, callback=(c0, c1),
            job=sum(e - s for label, s, e in within if label == JOB),
            commit=sum(e - s for label, s, e in within if label in (WRITE, COMMIT)),
            committed=commits[-1][2] if commits else c1, end_id=last_id, rows_in=reports[p.batchId].rows_in,
            spark_ms=dict(p.durationMs)))
    return out


def first_at_or_after(client: redis.Redis, stream: str, ts_ms: int) -> tuple[int, int] | None:
    """The id of the first entry whose event time is >= ``ts_ms`` (None: no such entry).

    An entry's id time is never before its event time (the producer reads its clock, then sends),
    so the search starts at the id ``ts_ms-0``.
    """
    start = f"{ts_ms}-0"
    while True:
        page = cast(list, client.xrange(stream, min=start, count=1_000))  # a sync client: no Awaitable
        for entry_id, fields in page:
            if json.loads(fields[b"data"])["ts"] >= ts_ms:
                return parse_id(entry_id)
        if len(page) < 1_000:
            return None
        ms, seq = parse_id(page[-1][0])
        start = f"{ms}-{seq + 1}"


def drained(query, stream: str, client: redis.Redis) -> bool:
    """Whether the query's last finished batch took the stream's last entry."""
    last = cast(list, client.xrevrange(stream, count=1))
    progress = query.lastProgress if query is not None else None
    if not last or progress is None:
        return not last
    end = stream_end(progress, stream)
    return end is not None and end >= parse_id(last[0][0])


def stream_end(progress, stream: str) -> tuple[int, int] | None:
    """The last entry of ``stream`` a batch's progress says it took (None: the progress names none)."""
    for source in progress.sources:
        offset = json.loads(source.endOffset) if source.endOffset and source.endOffset.startswith("{") else {}
        if isinstance(offset.get(stream), dict):
            return parse_id(offset[stream]["id"])
    return None


def holding(batches: list[Batch], entry: tuple[int, int]) -> Batch | None:
    """The batch that took ``entry``: the first whose last entry is at or after it."""
    return next((b for b in batches if b.end_id >= entry), None)


def window_waits(client: redis.Redis, stream: str, batches: list[Batch], inserted: dict[int, float],
                 closing: bool) -> tuple[list[Waited], int]:
    """Per window, the wait of its closing event (``closing``) or of its first event; and how many
    windows had that event in the stream but no batch of the run committed it (a query behind).

    ``inserted``: window start (ms) -> the earliest ``committed_at`` of its rows.
    """
    first, last = cast(list, client.xrange(stream, count=1)), cast(list, client.xrevrange(stream, count=1))
    if not first:
        return [], 0
    first_ts, last_ts = (json.loads(e[0][1][b"data"])["ts"] for e in (first, last))
    starts = range((first_ts // WINDOW_MS) * WINDOW_MS, last_ts + 1, WINDOW_MS)
    out, behind = [], 0
    for start in starts:
        boundary = start + WINDOW_MS if closing else start
        entry = first_at_or_after(client, stream, max(boundary, first_ts))
        if entry is None:
            continue  # the last window: nothing closed it
        batch = holding(batches, entry)
        if batch is None:
            behind += 1
        else:
            out.append(Waited(start, entry, batch, inserted.get(start)))
    return out, behind


def one_run(spark, timer: DriverTimer, client: redis.Redis, args: argparse.Namespace, mode: str, rate: float,
            seconds: float, label: str) -> RunResult:
    stream, schema = f"ematix-latency-{uuid.uuid4().hex[:8]}", f"ematix_latency_{uuid.uuid4().hex[:8]}"
    client.xgroup_create(stream, "create", id="$", mkstream=True)  # an empty stream for the source to start on
    client.xgroup_destroy(stream, "create")
    load0 = os.getloadavg()[0]
    producer: subprocess.Popen[str] | None = None
    with tempfile.TemporaryDirectory(prefix="ematix-latency-") as tmp, \
            psycopg.connect(args.postgres_url, autocommit=True) as conn:
        create_target(conn, schema, mode)
        try:
            spec = load_pipeline_str(pipeline_toml(args, stream, schema, Path(tmp), mode))
            timer.reset()
            runner = PipelineRunner(spec, spark=spark, progress=lambda _: None)
            reports: dict[int, BatchReport] = {}
            stop_at: float | None = None
            produced_until: float | None = None
            load_start = 0.0
            jobs0 = spark_jobs(spark)
            with CpuMeter() as meter:
                for report in runner.events():
                    reports[report.batch_id] = report
                    if producer is None:  # the query runs: the load starts
                        meter.restart()
                        load_start = time.time()
                        producer = subprocess.Popen(
                            [sys.executable, str(PRODUCER), "--url", args.url, "--stream", stream, "--rate", str(rate),
                             "--seconds", str(seconds), "--keys", str(args.keys)], stdout=subprocess.PIPE, text=True)
                    elif stop_at is None and producer.poll() is not None:
                        if produced_until is None:
                            produced_until = time.time()
                        if drained(runner.query, stream, client) or time.time() > produced_until + args.max_drain_s:
                            stop_at = time.time() + args.drain_s
                    elif stop_at is not None and time.time() >= stop_at:
                        runner.request_stop()
                        stop_at = math.inf
            jobs1 = spark_jobs(spark)
            stages = stage_times(spark, jobs0[1])
            jvm_threads = meter.by_jvm_thread()
            assert producer is not None
            out = producer.communicate()[0]
            produced = json.loads(out.strip().splitlines()[-1])
            producer_seen = sum(v - meter.baseline.get(k, 0.0) for k, v in meter.last.items() if k[0] == producer.pid)
            assert runner.query is not None
            batches = batches_of(runner.query, timer, reports, stream)
            rows = conn.execute(sql.SQL("SELECT (extract(epoch FROM window_start) * 1000)::bigint, "
                                        "extract(epoch FROM min(committed_at))::float8 FROM {}.windows GROUP BY 1")
                                .format(sql.Identifier(schema))).fetchall()
            inserted = {int(start): float(at) for start, at in rows}
            closing, behind = window_waits(client, stream, batches, inserted, closing=True)
            early = window_waits(client, stream, batches, inserted, closing=False)[0] if mode != "watermark" else []
        finally:
            if producer is not None and producer.poll() is None:  # the query failed under it
                producer.kill()
                producer.wait()
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            client.delete(stream)
    by_process = meter.by_process()
    by_process["python"] = by_process.get("python", 0.0) - producer_seen  # Spark's Python workers, not the producer
    by_process.pop("meter thread (excluded)", None)
    result = RunResult(label, rate, seconds, produced, meter.cpu - producer_seen, batches, closing, early,
                       (load0, os.getloadavg()[0]), load_start, (jobs1[0] - jobs0[0], jobs1[1] - jobs0[1]),
                       by_process, behind, stages, jvm_threads)
    check(result, mode)
    return result


def retried(run: Callable[[], RunResult], label: str) -> RunResult:
    """``run``, once more after a failure that is not terminal: on a machine this loaded a Spark
    Python worker has been seen to start too slowly to connect back (Spark waits 10 s)."""
    try:
        return run()
    except EmatixError as exc:
        if exc.terminal:
            raise
        print(f"{label}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); once more", flush=True)
        return run()


def check(r: RunResult, mode: str) -> None:
    """Warn where the table's own INSERT time disagrees with the batch the script names."""
    for w in r.first_early if mode != "watermark" else r.closing:
        if w.row_inserted is None:
            print(f"warning: {r.label}: window {w.window_start_ms} has no row in the table", file=sys.stderr)
        elif not w.batch.callback[0] <= w.row_inserted <= w.batch.committed:
            print(f"warning: {r.label}: window {w.window_start_ms}'s first row was inserted at {w.row_inserted:.3f}, "
                  f"outside batch {w.batch.batch_id}'s callback {w.batch.callback[0]:.3f}-{w.batch.committed:.3f}",
                  file=sys.stderr)


def stats(values: list[float]) -> str:
    return f"{percentile(values, .5):.2f} | {percentile(values, .99):.2f} | {max(values, default=float('nan')):.2f}"


def median_parts(waits: list[Waited]) -> str:
    return " | ".join(f"{percentile([w.parts[p] for w in waits], .5):.2f}" for p in PARTS)


def slowest(waits: list[Waited]) -> str:
    if not waits:
        return "-"
    w = max(waits, key=lambda w: w.seconds)
    return ", ".join(f"{p} {v:.2f}" for p, v in w.parts.items()) + f" (batch {w.batch.batch_id}, {w.batch.rows_in:,} rows)"


def report_run(r: RunResult) -> None:
    p = r.producer
    data = [b for b in r.loaded if b.rows_in]
    walls = [b.committed - b.trigger for b in data]
    cpu = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.cpu_by_process.items()) if abs(v) >= 0.05)
    spark = {k: percentile([b.spark_ms.get(k, 0) for b in data], .5)
             for k in ("latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets")}
    print(f"{r.label}: producer sent {p['sent']:,.0f} in {p['seconds']:.1f} s (max {p['max_behind_s'] * 1000:.0f} ms "
          f"behind its pace), CPU {p['loop_cpu_s']:.1f} s in its loop ({p['loop_cpu_s'] / p['seconds']:.0%} of a core), "
          f"{p['process_cpu_s']:.1f} s in all; engine CPU {r.engine_cpu:.1f} s "
          f"({r.engine_cpu / p['seconds']:.2f} cores: {cpu}); Spark jobs {r.jobs[0]}, stages {r.jobs[1]} "
          f"({r.jobs[0] / max(1, len(data)):.1f} / {r.jobs[1] / max(1, len(data)):.1f} per batch with entries); "
          f"{r.behind} windows' closing event never committed; {len(r.loaded)} batches, {len(data)} with entries, rows per batch "
          f"p50 {percentile([float(b.rows_in) for b in data], .5):,.0f}, trigger->commit p50/max "
          f"{percentile(walls, .5):.2f}/{max(walls, default=float('nan')):.2f} s; Spark durationMs p50 {spark}; "
          f"load avg {r.load[0]:.1f} -> {r.load[1]:.1f}", flush=True)
    threads = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.jvm_threads.items(), key=lambda kv: -kv[1]) if v >= 0.05)
    print(f"  Spark stages: {', '.join(f'{k} {v:.1f}' for k, v in r.stages.items())}; JVM CPU s by thread: {threads}",
          flush=True)
    gaps = [w.batch.committed - w.row_inserted for w in (r.first_early or r.closing) if w.row_inserted is not None]
    if gaps:
        print(f"  the rows' INSERT (committed_at) to the commit returning: p50 {percentile(gaps, .5) * 1000:.0f} ms, "
              f"max {max(gaps) * 1000:.0f} ms", flush=True)


def floor_table(r: RunResult) -> None:
    """Trigger start -> commit of the floor run's batches: empty ones and ones with entries."""
    print("| batch | batches | trigger -> commit p50 / p99 / max s | Spark before callback p50 | Spark job p50 | "
          "driver p50 | commit p50 |")
    print("|---|---|---|---|---|---|---|")
    for name, group in (("empty (heartbeat only)", [b for b in r.loaded if not b.rows_in]),
                        ("with entries", [b for b in r.loaded if b.rows_in])):
        if not group:
            continue
        parts = [b.parts(b.trigger) for b in group]
        walls = [b.committed - b.trigger for b in group]
        print(f"| {name} | {len(group)} | {stats(walls).replace(' | ', ' / ')} | "
              + " | ".join(f"{percentile([x[p] for x in parts], .5):.3f}" for p in PARTS[1:]) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[1_000, 10_000], help="entries per second")
    ap.add_argument("--seconds", type=float, default=120, help="how long the producer appends, per run")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--floor-rate", type=float, default=0.5)
    ap.add_argument("--floor-seconds", type=float, default=60, help="0: no floor run")
    ap.add_argument("--warmup-seconds", type=float, default=30, help="an unmeasured run first (0: none)")
    ap.add_argument("--drain-s", type=float, default=3.0,
                    help="the query runs this long after a batch took the stream's last entry")
    ap.add_argument("--max-drain-s", type=float, default=60.0,
                    help="stop this long after the producer ended even if the query has not caught up")
    ap.add_argument("--url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--gc", choices=["parallel", "g1"], default="parallel")
    args = ap.parse_args()
    client = redis.Redis.from_url(args.url)
    spark = start_spark(args)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")  # every batch's progress kept
    timer = install_timers(spans=True)
    print(f"load avg at start {os.getloadavg()}; Redis {cast(dict[str, Any], client.info('server'))['redis_version']}", flush=True)
    if args.warmup_seconds:
        retried(partial(one_run, spark, timer, client, args, MODES[0], args.rates[0], args.warmup_seconds, "warm-up"),
                "warm-up")
    runs: list[tuple[str, RunResult]] = []
    for mode in args.modes:
        for rate in args.rates:
            label = f"{mode} {rate:,.0f}/s"
            r = retried(partial(one_run, spark, timer, client, args, mode, rate, args.seconds, label), label)
            report_run(r)
            runs.append((mode, r))
    floor = None
    if args.floor_seconds:
        label = f"floor {args.floor_rate}/s"
        floor = retried(partial(one_run, spark, timer, client, args, MODES[0], args.floor_rate, args.floor_seconds,
                                label), label)
        report_run(floor)

    print(f"\nclosing event -> window row committed, seconds ({args.seconds:.0f} s per run, {args.keys:,} keys, "
          "10 s tumbling windows, 1 s trigger); breakdown: medians over the windows")
    print("| emit_trigger | rate / s | windows | p50 | p99 | max | " + " | ".join(PARTS) + " | rows / batch p50 | "
          "producer CPU (share of a core) | engine CPU cores | load avg |")
    print("|---|---|---|---|---|---|" + "---|" * len(PARTS) + "---|---|---|---|")
    for mode, r in runs:
        data = [float(b.rows_in) for b in r.loaded if b.rows_in]
        never = f" (+{r.behind} never committed)" if r.behind else ""
        print(f"| {mode} | {r.rate:,.0f} | {len(r.closing)}{never} | {stats([w.seconds for w in r.closing])} | "
              f"{median_parts(r.closing)} | {percentile(data, .5):,.0f} | {r.producer['loop_cpu_s']:.1f} s "
              f"({r.producer['loop_cpu_s'] / r.producer['seconds']:.0%}) | {r.engine_cpu / r.producer['seconds']:.2f} | "
              f"{r.load[0]:.1f}-{r.load[1]:.1f} |")
    early = [(mode, r) for mode, r in runs if r.first_early]
    if early:
        print("\nevery_batch: a window's first event -> its first early row committed, seconds")
        print("| rate / s | windows | p50 | p99 | max | " + " | ".join(PARTS) + " |")
        print("|---|---|---|---|---|" + "---|" * len(PARTS))
        for _, r in early:
            print(f"| {r.rate:,.0f} | {len(r.first_early)} | {stats([w.seconds for w in r.first_early])} | "
                  f"{median_parts(r.first_early)} |")
    print("\nthe slowest window of each run:")
    for _, r in runs:
        print(f"  {r.label} closing: {slowest(r.closing)}")
        if r.first_early:
            print(f"  {r.label} first early: {slowest(r.first_early)}")
    if floor is not None:
        print(f"\nfloor: {args.floor_rate} entries / s for {args.floor_seconds:.0f} s; closing latency p50 / p99 / max "
              f"{stats([w.seconds for w in floor.closing]).replace(' | ', ' / ')} s over {len(floor.closing)} windows")
        floor_table(floor)


if __name__ == "__main__":
    main()
