"""Executors mode's batch input (``ematix_dagster/spark/batch/executor_input.py``) on real Spark.

A real executors-mode query (``executor_aggregation`` over ``aggregation_rows``, parquet file sources
with ``maxFilesPerTrigger = 1``, ``availableNow``, on a session holding ``EXECUTOR_STATE_CONF``) calls
``ExecutorInput.read`` for each batch in its ``foreachBatch``. Every batch's rows in, dead letters, SQL
filtered rows, late rows (Spark's rule: a tumbling row is dropped iff its window ends at or before the
watermark in effect during the batch before; a session row iff its own session ends there) and
watermarks must equal a pandas ground truth, and account for every input row.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from ematix_dagster.columns import REASON, SOURCE
from ematix_dagster.spark.batch.executor_input import ExecutorBatch, ExecutorInput
from ematix_dagster.spark.plans.executor_plan import executor_aggregation
from ematix_dagster.spark.plans.executor_rows import aggregation_rows
from ematix_dagster.spark.plans.window_plan import analyse
from ematix_dagster.spark.sources.readers import with_engine_columns
from tests.conftest import BatchFiles
from tests.e2e.lateness_helpers import files_source, make_spec, us

pytestmark = pytest.mark.slow  # two executors-mode queries, each batch read again: ~40 s of Spark

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
S = 1_000_000
FUTURE = 10 ** 8  # seconds after T0: beyond any batch time plus the default skew
DDL = "id BIGINT, k STRING, v BIGINT, page STRING, ts TIMESTAMP"
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.int64()), ("page", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC"))])
# v = 0 fails the division (a sql_error row), page "skip" is filtered out by the WHERE
SQL = "SELECT *, 10 / v AS r FROM source WHERE page <> 'skip'"


@dataclass(frozen=True)
class Ev:
    """One input row: its micro-batch, source, key, seconds after T0 (None: no event time), v, page."""

    batch: int
    source: str
    k: str
    t: float | None
    v: int = 1
    page: str = "p"

    @property
    def us(self) -> int:
        assert self.t is not None
        return us(T0) + round(self.t * S)

    @property
    def reason(self) -> str | None:
        """Why the driver's classification keeps the row from every window (None: it reaches one)."""
        if self.t is None:
            return "invalid_event_time"
        if self.t >= FUTURE:
            return "future"
        if self.page == "skip":
            return "filtered"
        return "sql_error" if self.v == 0 else None



def pipeline(tmp: Path, events: list[Ev], window: dict[str, Any], sources: tuple[str, ...]):
    """One parquet file per source and batch (file i of each source is batch i) and the spec."""
    files = {name: BatchFiles(tmp / name) for name in sources}
    for batch in range(max(e.batch for e in events) + 1):
        for name, out in files.items():
            out.write([{"id": i, "k": e.k, "v": e.v, "page": e.page,
                        "ts": None if e.t is None else T0 + dt.timedelta(seconds=e.t)}
                       for i, e in enumerate(events) if e.batch == batch and e.source == name], SCHEMA)
    return make_spec(tmp, "execinput", [files_source(name, tmp / name, schema=DDL) for name in sources],
                     {"group_by": ["k"], **window, "aggregations": [{"agg": "count", "as": "n"}]}, sql=SQL,
                     dead_letter=True)


@dataclass
class Seen:
    """What one batch's foreachBatch saw: its input read again, and the rows Spark wrote."""

    batch: ExecutorBatch
    valid: int
    late: int
    written: int


def run_executors(session: SparkSession, spec) -> dict[int, Seen]:
    """The executors-mode query, ``ExecutorInput.read`` called for each batch inside its foreachBatch."""
    streams = {s.name: with_engine_columns(session.readStream.schema(DDL).option("maxFilesPerTrigger", 1)
                                           .parquet(s.path), spec, i) for i, s in enumerate(spec.sources)}
    union = list(streams.values())[0]
    for other in list(streams.values())[1:]:
        union = union.unionByName(other, allowMissingColumns=True)
    plan = analyse(session, spec, union)
    reader = ExecutorInput(plan)
    frame = executor_aggregation(spec, {name: aggregation_rows(session, plan, s) for name, s in streams.items()})
    seen: dict[int, Seen] = {}

    def sink(windows: DataFrame, batch_id: int) -> None:
        batch = reader.read(windows.sparkSession, batch_id)
        written = sum(row["n"] for row in windows.collect())
        seen[batch_id] = Seen(batch, batch.valid.count(), batch.late.count(), written)

    query = (frame.writeStream.outputMode("append").foreachBatch(sink)
             .option("checkpointLocation", spec.run.checkpoint_location).trigger(availableNow=True).start())
    query.awaitTermination()
    return seen


# -- ground truth ----------------------------------------------------------------------------------------


def watermarks(events: list[Ev], lateness_s: float, batches: int) -> list[int]:
    """The watermark (ms) in effect during each batch: min over the sources that had rows with a valid
    event time (filtered and failing rows too: the watermark is measured before the SQL) of (newest
    event time - lateness), from the batches before; Spark's 0 before any."""
    newest: dict[str, int] = {}
    marks = [0]
    for batch in range(batches - 1):
        for e in events:
            if e.batch == batch and e.reason not in ("invalid_event_time", "future"):
                newest[e.source] = max(newest.get(e.source, e.us), e.us)
        now = (min(newest.values()) - round(lateness_s * S)) // 1000 if newest else 0
        marks.append(max(marks[-1], now))
    return marks


def fixed_late(e: Ev, duration_s: int, late_ms: int) -> bool:
    """A tumbling row's window ends at or before the watermark: Spark drops it."""
    end = (e.us - (e.us % (duration_s * S))) + duration_s * S
    return end <= late_ms * 1000


def session_late(events: list[Ev], gap_s: int, cap_s: int, late_ms: int) -> set[Ev]:
    """Rows whose own session (its gap cut at its cap bucket's end) ends at or before the watermark."""
    gap, cap = gap_s * S, cap_s * S
    return {e for e in events if min(e.us + gap, (e.us // cap + 1) * cap) <= late_ms * 1000}


def assert_batches(seen: dict[int, Seen], events: list[Ev], marks: list[int], late: dict[int, set[Ev]],
                   sources: tuple[str, ...]) -> None:
    """Each batch's counters, dead letters, late rows and watermarks against the ground truth, and
    every input row accounted for once."""
    assert sorted(seen) == list(range(len(marks)))
    for n, got in seen.items():
        rows = [e for e in events if e.batch == n]
        batch = got.batch
        assert (batch.watermarks.late_ms, batch.watermarks.current_ms) == (marks[max(n - 1, 0)], marks[n])
        dead = [e for e in rows if e.reason not in (None, "filtered")]
        filtered = [e for e in rows if e.reason == "filtered"]
        valid = [e for e in rows if e.reason is None]
        counters = batch.counters
        for name in sources:
            mine = [e for e in rows if e.source == name]
            assert counters[f"rows_consumed:{name}"] == len(mine)
            assert counters[f"invalid_event_time_rows:{name}"] == sum(e.reason == "invalid_event_time" for e in mine)
            assert counters[f"future_rows:{name}"] == sum(e.reason == "future" for e in mine)
        reasons = {r: sum(e.reason == r for e in dead) for r in {e.reason for e in dead}}
        assert {k: v for k, v in counters.items() if k.startswith("dead_letter_rows:")} == \
            {f"dead_letter_rows:{r}": c for r, c in reasons.items()}
        assert counters.get("rejected_rows:sql_error", 0) == reasons.get("sql_error", 0)
        assert counters["filtered_rows:where"] == len(filtered)
        assert counters["late_rows_dropped"] == got.late == len(late.get(n, set()))
        letters = batch.dead_letters
        assert sorted(zip(letters.column(SOURCE).to_pylist(), letters.column(REASON).to_pylist())) if letters \
            else [] == sorted((e.source, e.reason) for e in dead)
        assert got.valid == len(valid) - got.late
        assert got.valid + got.late + len(dead) + counters["filtered_rows:where"] == \
            sum(counters[f"rows_consumed:{name}"] for name in sources)


# -- tumbling, two sources -----------------------------------------------------------------------------

# 1-minute windows, lateness 10 s. Watermarks in effect (s after T0): [epoch, 20, 60, 65, 120]; b's newest row
# of batch 0 is the failing one at 50, filtered and failing rows count towards it.
TUMBLING = [
    Ev(0, "a", "k1", 5), Ev(0, "a", "k1", 30), Ev(0, "a", "k1", None),
    Ev(0, "b", "k1", 10), Ev(0, "b", "k2", 50, v=0), Ev(0, "b", "k1", 20, page="skip"),
    Ev(1, "a", "k1", 70), Ev(1, "a", "k1", FUTURE), Ev(1, "b", "k1", 75),
    Ev(1, "b", "k1", 2),  # behind the watermark of batch 1 (20), its window [0, 60) open: counts
    Ev(2, "a", "k1", 130), Ev(2, "a", "k2", 61), Ev(2, "a", "k2", 62, v=0),
    Ev(2, "b", "k1", -5),  # [-60, 0) ends before the watermark of batch 1 (20): late
    Ev(2, "b", "k1", 59),  # [0, 60) ends after 20: counts, though batch 2 runs under 60 (the driver drops it)
    Ev(3, "a", "k1", 59.999), Ev(3, "a", "k1", 45, page="skip"),  # [0, 60) ended at 60: late
    Ev(3, "a", "k1", 119), Ev(3, "b", "k2", 131),
]


def test_a_tumbling_batch_input_is_the_driver_classification_with_sparks_late_rule(
        session: SparkSession, tmp_path: Path) -> None:
    spec = pipeline(tmp_path, TUMBLING, {"kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 10_000}, ("a", "b"))
    seen = run_executors(session, spec)
    marks = watermarks(TUMBLING, 10, 5)
    assert [(m * 1000 - us(T0)) / S for m in marks[1:]] == [20, 60, 65, 120]
    late = {n: {e for e in TUMBLING if e.batch == n and e.reason is None and fixed_late(e, 60, marks[max(n - 1, 0)])}
            for n in range(5)}
    assert {n: len(rows) for n, rows in late.items() if rows} == {2: 1, 3: 1}
    assert_batches(seen, TUMBLING, marks, late, ("a", "b"))
    # the rows counted valid are those Spark's count(*) wrote, but for the 2 in [120, 180), still open
    assert sum(s.written for s in seen.values()) == sum(s.valid for s in seen.values()) - 2


# -- sessions, one source --------------------------------------------------------------------------------

# gap 10 s, cap 60 s, lateness 0. Batch 2 runs its late rule under the watermark of batch 1 (40 s).
SESSIONS = [
    Ev(0, "a", "u", 5), Ev(0, "a", "u", 30), Ev(0, "a", "v", 40),
    Ev(1, "a", "u", 50), Ev(1, "a", "u", None),
    Ev(2, "a", "u", 12),  # session [12, 22] ends before 40: late
    # the batch's session [25, 43] ends after 40, but Spark judges each row's own: 25 ([25, 35]) is late, 33 not
    Ev(2, "a", "u", 25), Ev(2, "a", "u", 33),
    Ev(2, "a", "v", 20), Ev(2, "a", "v", 28, v=0), Ev(2, "a", "v", 29),  # [20, 39] late (the sql_error row joins none)
    Ev(2, "a", "w", 45), Ev(2, "a", "w", 38, page="skip"),
    Ev(3, "a", "u", 58), Ev(3, "a", "u", 55),  # [55, 60]: the bucket's end cuts the gap; after 50: counts
]


def test_a_session_batch_input_drops_the_rows_whose_own_session_ends_at_the_watermark(
        session: SparkSession, tmp_path: Path) -> None:
    spec = pipeline(tmp_path, SESSIONS, {"kind": "session", "gap_ms": 10_000, "max_session_duration_ms": 60_000},
                    ("a",))
    seen = run_executors(session, spec)
    marks = watermarks(SESSIONS, 0, 5)
    assert [(m * 1000 - us(T0)) / S for m in marks[1:]] == [40, 50, 50, 58]
    late = {n: session_late([e for e in SESSIONS if e.batch == n and e.reason is None], 10, 60, marks[max(n - 1, 0)])
            for n in range(5)}
    assert {n: len(rows) for n, rows in late.items() if rows} == {2: 4}
    assert_batches(seen, SESSIONS, marks, late, ("a",))
    # the rows counted valid are those Spark's count(*) wrote, but for u's session [50, 60], still open
    assert sum(s.written for s in seen.values()) == sum(s.valid for s in seen.values()) - 3
