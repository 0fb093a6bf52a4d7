"""A benchmark run's result (one engine, one workload), its report lines and the median of runs."""

from __future__ import annotations

import dataclasses
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import MB, percentile  # noqa: E402


@dataclass
class Result:
    engine: str
    workload: str
    cpu: float
    wall: float
    peak_rss: int
    batches: int
    rows_in: int
    rows_out: int
    by_process: dict[str, float]
    latencies: list[float] = field(default_factory=list)  # seconds per batch
    merge_cpu: float = 0.0
    splits: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    jvm: dict[str, float] = field(default_factory=dict)  # JVM CPU by thread group (measure.JVM_THREADS)
    jobs: int = 0  # Spark jobs and stages the run submitted
    stages: int = 0
    rows_by_kind: dict[str, int] = field(default_factory=dict)  # ours: the target's rows by _emit_kind
    #: a row pipeline's batches: (rows in, rows released, rows held back after the batch)
    row_batches: list[tuple[int, int, int]] = field(default_factory=list)
    extra_cpu: float = 0.0  # CPU outside the process tree counted besides (PostgreSQL backends serving it)
    extra: dict[str, float] = field(default_factory=dict)  # a benchmark's own figures, read after the run

    @property
    def cpu_per_batch(self) -> float:
        return self.cpu / self.batches if self.batches else float("nan")

    @property
    def wall_per_batch(self) -> float:
        return self.wall / self.batches if self.batches else float("nan")

    def line(self) -> str:
        procs = ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.by_process.items()) if abs(v) >= 0.05)
        return (f"{self.engine:>6} {self.workload:<6}: CPU {self.cpu:6.1f} s, wall {self.wall:6.1f} s, "
                f"per batch CPU {self.cpu_per_batch:.3f} s wall {self.wall_per_batch:.3f} s, p50/p95 "
                f"{percentile(self.latencies, .5):.3f}/{percentile(self.latencies, .95):.3f} s, batches {self.batches}, "
                f"rows in {self.rows_in}, out {self.rows_out}, peak RSS {self.peak_rss / MB:.0f} MB [{procs}]")

    def jvm_line(self) -> str:
        threads = ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.jvm.items(), key=lambda kv: -kv[1]) if v >= 0.05)
        per = f", per batch {self.jobs / self.batches:.1f} jobs / {self.stages / self.batches:.1f} stages" \
            if self.batches else ""
        return f"JVM CPU s by thread: {threads}; Spark jobs {self.jobs}, stages {self.stages}{per}"


def median_result(results: list[Result]) -> Result:
    """A result whose numbers are the medians of ``results`` (latencies pooled)."""
    first = results[0]
    return dataclasses.replace(
        first, cpu=statistics.median(r.cpu for r in results), wall=statistics.median(r.wall for r in results),
        peak_rss=int(statistics.median(r.peak_rss for r in results)),
        merge_cpu=statistics.median(r.merge_cpu for r in results),
        extra_cpu=statistics.median(r.extra_cpu for r in results),
        latencies=[x for r in results for x in r.latencies])


def print_splits(r: Result) -> None:
    for label, (calls, cpu, wall) in r.splits.items():
        print(f"          {label:<40} calls {calls:3d}  thread CPU {cpu:7.2f} s  wall {wall:7.2f} s")
