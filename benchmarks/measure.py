"""What the benchmarks measure with: process-tree CPU and RSS, driver-function timers, percentiles.

Kept apart from the workloads so every benchmark script measures the same way. CPU is psutil's
user + system over this process and every descendant (the JVM, Python workers), sampled on a
background thread so processes that exit mid-run keep their last seen times; the sampler's own
thread CPU is subtracted. Peak RSS is the largest sampled driver + JVM resident set. The JVM's
CPU is also split by what its threads do (:data:`JVM_THREADS`), threads that exit mid-run
included, :func:`spark_jobs` counts the Spark jobs and stages a run submitted and :func:`stage_times`
sums their task time.
"""

from __future__ import annotations

import cProfile
import functools
import os
import sys
import threading
import time
from collections import defaultdict
from typing import Callable, Self

import psutil

#: JVM thread name prefix -> what the thread's CPU is spent on
JVM_THREADS = {
    "C1 CompilerThre": "JIT", "C2 CompilerThre": "JIT",
    "Executor task": "tasks",
    # the streaming query's thread runs the foreachBatch call, and with it every Python call into
    # the JVM (py4j pins them to the calling thread): planning, job submission, result collection
    "stream execution thread": "query thread",
    "GC Thread": "GC", "G1 ": "GC", "VM Thread": "GC",
}
_TICKS = os.sysconf("SC_CLK_TCK")
MB = 1 << 20  # bytes in a MiB, as RSS and data sizes are reported
#: JVM threads are read every this many samples (a hundred files each time)
THREAD_EVERY = 5


def _jvm_threads(pid: int) -> dict[int, tuple[str, float]]:
    """Thread id -> (group, user + system CPU s) of a JVM's live threads, from /proc."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        group = next((g for prefix, g in JVM_THREADS.items() if name.startswith(prefix[:15])), "other")
        out[int(tid)] = (group, (int(fields[11]) + int(fields[12])) / _TICKS)
    return out


def spark_jobs(spark) -> tuple[int, int]:
    """(jobs, stages) the Spark application has run so far: one more than the newest ids in its
    status store (which keeps only the latest thousand of each)."""
    jvm = spark.sparkContext._jvm
    store = spark.sparkContext._jsc.sc().statusStore()
    stages = store.stageList(jvm.java.util.ArrayList(), False, False,
                             spark.sparkContext._gateway.new_array(jvm.double, 0), jvm.java.util.ArrayList())
    return _newest(store.jobsList(jvm.java.util.ArrayList()), "jobId") + 1, _newest(stages, "stageId") + 1


def stage_times(spark, since_stage: int) -> dict[str, float]:
    """The stages from id ``since_stage`` on, summed: how many, their wall (submission to
    completion), their tasks' run time and CPU time, and deserialization, in seconds. Task run
    time well above task CPU is time a task waited for a core or on I/O (the Redis read)."""
    jvm = spark.sparkContext._jvm
    store = spark.sparkContext._jsc.sc().statusStore()
    stages = store.stageList(jvm.java.util.ArrayList(), False, False,
                             spark.sparkContext._gateway.new_array(jvm.double, 0), jvm.java.util.ArrayList())
    out: dict[str, float] = defaultdict(float)
    it = stages.iterator()
    while it.hasNext():
        stage = it.next()
        if stage.stageId() < since_stage:
            continue
        out["stages"] += 1
        out["task run s"] += stage.executorRunTime() / 1e3
        out["task CPU s"] += stage.executorCpuTime() / 1e9
        out["deserialize s"] += stage.executorDeserializeTime() / 1e3
        submitted, completed = stage.submissionTime(), stage.completionTime()
        if submitted.isDefined() and completed.isDefined():
            out["stage wall s"] += (completed.get().getTime() - submitted.get().getTime()) / 1e3
    return dict(out)


def _newest(items, id_name: str) -> int:
    """The largest id in a Scala sequence of status records (-1: none)."""
    newest, it = -1, items.iterator()
    while it.hasNext():
        newest = max(newest, getattr(it.next(), id_name)())
    return newest


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class PostgresBackends:
    """The PostgreSQL server processes serving this process's connections to ``url``'s server.

    Called by :class:`CpuMeter`'s sampler: it lists this process's TCP connections to the server's
    port and, when that set changed, asks ``pg_stat_activity`` (on a connection of its own, whose
    backend is left out) which backends serve them. A backend that ends between samples keeps the
    CPU last seen, so its last fraction of a sampling interval is missed; the server's shared
    processes (WAL writer, checkpointer, autovacuum) are not counted.
    """

    def __init__(self, url: str) -> None:
        import psycopg

        self._conn = psycopg.connect(url, autocommit=True, application_name="ematix-bench cpu meter")
        self.port = self._conn.info.port
        self._ports: frozenset[int] = frozenset()
        self._pids: list[int] = []

    def __call__(self) -> list[int]:
        ports = frozenset(c.laddr.port for c in psutil.Process().net_connections("tcp")
                          if c.raddr and c.raddr.port == self.port and c.status == psutil.CONN_ESTABLISHED)
        if ports != self._ports:
            self._ports = ports
            rows = self._conn.execute("SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s) "
                                      "AND pid <> pg_backend_pid()", (list(ports),)).fetchall()
            self._pids = [pid for (pid,) in rows]
        return self._pids

    def close(self) -> None:
        self._conn.close()


class CpuMeter:
    """User+system CPU of this process and every descendant, plus peak driver+JVM RSS.

    ``extra_pids`` (e.g. :class:`PostgresBackends`) names processes outside the tree whose CPU is
    counted apart (:attr:`extra_cpu`, and by name in :meth:`by_process`), never in :attr:`cpu`.
    """

    def __init__(self, interval: float = 0.2, extra_pids: Callable[[], list[int]] | None = None) -> None:
        self.interval = interval
        self.extra_pids = extra_pids
        self._extra: dict[int, psutil.Process] = {}
        self.extra_keys: set[tuple[int, float]] = set()
        self.root = psutil.Process()
        self._stop = threading.Event()
        self.baseline: dict[tuple[int, float], float] = {}
        self.last: dict[tuple[int, float], float] = {}
        self.names: dict[tuple[int, float], str] = {}
        self.peak_rss = 0
        self.sampler_cpu = 0.0
        self.thread_baseline: dict[tuple[int, int], tuple[str, float]] = {}
        self.threads: dict[tuple[int, int], tuple[str, float]] = {}
        self._ticks = 0

    def _procs(self) -> list[psutil.Process]:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            procs = [self.root]
        return procs + self._extra_procs()

    def _extra_procs(self) -> list[psutil.Process]:
        if self.extra_pids is None:
            return []
        for pid in self.extra_pids():
            if pid not in self._extra:
                try:
                    proc = self._extra[pid] = psutil.Process(pid)
                    self.extra_keys.add((pid, proc.create_time()))
                except psutil.Error:
                    continue
        return list(self._extra.values())

    def _sample(self, into: dict[tuple[int, float], float]) -> None:
        rss = 0
        for p in self._procs():
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    t = p.cpu_times()
                    into[key] = t.user + t.system
                    self.names[key] = p.name()  # read each time: a launcher script may exec the JVM
                    if key in self.extra_keys:
                        continue
                    if p.pid == self.root.pid or self.names[key] == "java":
                        rss += p.memory_info().rss
                    if self.names[key] == "java" and (into is not self.last or self._ticks % THREAD_EVERY == 0):
                        for tid, seen in _jvm_threads(p.pid).items():
                            (self.threads if into is not self.baseline else self.thread_baseline)[(p.pid, tid)] = seen
            except psutil.Error:  # exited between listing and reading: keep its last seen times
                continue
        self.peak_rss = max(self.peak_rss, rss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._ticks += 1
            started = time.thread_time()
            self._sample(self.last)
            self.sampler_cpu += time.thread_time() - started

    def sample(self) -> float:
        """:attr:`cpu` as of now: a sample taken on the caller's thread (a child's start, say)."""
        self._sample(self.last)
        return self.cpu

    def restart(self) -> None:
        """Count CPU from now on (a streaming query's start is not what its batches cost)."""
        self.baseline, self.thread_baseline, self.threads = {}, {}, {}
        self._sample(self.baseline)
        self.sampler_cpu = 0.0

    def __enter__(self) -> Self:
        self._sample(self.baseline)
        self.last = dict(self.baseline)
        self._thread = threading.Thread(target=self._loop, name="cpu-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(self.last)

    @property
    def cpu(self) -> float:
        # a copy first: :meth:`sample` may read while the sampler thread adds a process
        total = sum(v - self.baseline.get(k, 0.0) for k, v in list(self.last.items()) if k not in self.extra_keys)
        return total - self.sampler_cpu

    @property
    def extra_cpu(self) -> float:
        """CPU of the ``extra_pids`` processes (outside :attr:`cpu`)."""
        return sum(v - self.baseline.get(k, 0.0) for k, v in self.last.items() if k in self.extra_keys)

    def by_process(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for k, v in self.last.items():
            label = "driver" if k[0] == self.root.pid else self.names.get(k, "?")
            out[label] += v - self.baseline.get(k, 0.0)
        out["driver"] -= self.sampler_cpu
        out["meter thread (excluded)"] = self.sampler_cpu
        return dict(out)

    def by_jvm_thread(self) -> dict[str, float]:
        """The JVM's CPU by thread group (:data:`JVM_THREADS`)."""
        out: dict[str, float] = defaultdict(float)
        for key, (group, cpu) in self.threads.items():
            out[group] += cpu - self.thread_baseline.get(key, (group, 0.0))[1]
        return dict(out)


class DriverTimer:
    """Thread CPU and wall time inside chosen driver functions (patched here, not in the engine).

    With ``spans`` every call is also kept as (label, start, end) in epoch seconds, so a benchmark
    can place each call on the same clock as Redis entry ids and Spark's trigger times.
    """

    def __init__(self, spans: bool = False) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.spans: list[tuple[str, float, float]] | None = [] if spans else None
        self.profiler: cProfile.Profile | None = None
        self._patched: list[tuple[object, str, object]] = []

    def reset(self) -> None:
        self.cpu.clear()
        self.wall.clear()
        self.calls.clear()
        if self.spans is not None:
            self.spans.clear()

    def wrap(self, owner: object, attr: str, label: str, profile: bool = False) -> None:
        original = getattr(owner, attr, None)
        if original is None:  # the engine moved on: time what still exists
            print(f"note: {getattr(owner, '__name__', owner)}.{attr} not found, not timed", file=sys.stderr)
            return
        timer = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            prof = timer.profiler if profile else None
            c0, w0, e0 = time.thread_time(), time.perf_counter(), time.time()
            if prof is not None:
                prof.enable()
            try:
                return original(*args, **kwargs)
            finally:
                if prof is not None:
                    prof.disable()
                timer.cpu[label] += time.thread_time() - c0
                timer.wall[label] += time.perf_counter() - w0
                timer.calls[label] += 1
                if timer.spans is not None:
                    timer.spans.append((label, e0, time.time()))

        self._patched.append((owner, attr, original))
        setattr(owner, attr, timed)
