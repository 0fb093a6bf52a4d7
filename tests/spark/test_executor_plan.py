"""Window state on the executors (``[run] window_state = "executors"``) against the driver mode, on real
Spark: parquet file sources (file i of a source is micro-batch i), ``availableNow``, the same files through
``PipelineRunner`` in both modes, each with its own checkpoint and parquet target.

The executors' final rows must equal a pandas ground truth written here (Spark's late rule: a row of
batch n counts in a window iff the window ends after the watermark in effect during batch n - 1, the
spike's finding; a window is written iff its end <= the final watermark), and the same files run
through the driver mode must give the same rows, every aggregator, HLL estimates
exactly. Where the two modes differ by design, a test pins the difference down.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pyarrow as pa
import pytest
from datasketches import hll_sketch, hll_union
from pyspark.sql import SparkSession

from ematix_dagster.errors import AggregationOverflow
from tests.conftest import BatchFiles
from tests.e2e.lateness_helpers import files_source, make_spec, read_batch_dirs, run, us
from tests.e2e.windows_helpers import AGG_TRUTH, window_starts

pytestmark = pytest.mark.slow  # ~2 minutes of Spark: both modes over every window kind

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)  # a multiple of every window size and cap below
S = 1_000_000
DDL = "id BIGINT, k STRING, v BIGINT, x DOUBLE, page STRING, ts TIMESTAMP"
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.int64()), ("x", pa.float64()),
                    ("page", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
# every aggregator; x takes multiples of 1/4, so float sums are exact whatever their order
AGGREGATIONS: list[dict[str, Any]] = [
    {"agg": "count", "as": "n"}, {"agg": "count_col", "column": "v", "as": "n_v"},
    {"agg": "sum", "column": "v", "as": "sum_v"}, {"agg": "sum", "column": "x", "as": "sum_x"},
    {"agg": "min", "column": "v", "as": "min_v"}, {"agg": "max", "column": "page", "as": "max_page"},
    {"agg": "avg", "column": "x", "as": "avg_x"}, {"agg": "first", "column": "v", "as": "first_v"},
    {"agg": "last", "column": "page", "as": "last_page"},
    {"agg": "count_distinct", "column": "page", "as": "pages"},
    {"agg": "count_distinct", "column": "v", "as": "exact_v", "mode": "exact", "max_distinct_values_per_group": 100},
]
ALIASES = [a["as"] for a in AGGREGATIONS]


@dataclass(frozen=True)
class Ev:
    """One input row: its micro-batch, source, key, seconds after T0 and values."""

    batch: int
    source: str
    k: str | None
    t: float
    v: int | None = 1
    x: float | None = 0.25
    page: str | None = "p"

    @property
    def us(self) -> int:
        return us(T0) + round(self.t * S)


Key = tuple  # (window start µs, k)
Rows = dict[Key, dict[str, Any]]


# -- running both modes ------------------------------------------------------------------------------



def pipeline(tmp: Path, events: list[Ev], window: dict[str, Any], sources: tuple[str, ...] = ("a", "b"),
             aggregations: list[dict[str, Any]] = AGGREGATIONS):
    """The events as one parquet file per source and batch (empty ones too, so that file i of every
    source is batch i), and a driver-mode spec reading them."""
    files = {name: BatchFiles(tmp / name) for name in sources}
    for batch in range(max(e.batch for e in events) + 1):
        for name, out in files.items():
            out.write([{"id": i, "k": e.k, "v": e.v, "x": e.x, "page": e.page, "ts": T0 + dt.timedelta(seconds=e.t)}
                       for i, e in enumerate(events) if e.batch == batch and e.source == name], SCHEMA)
    return make_spec(tmp, "execplan", [files_source(name, tmp / name, schema=DDL) for name in sources],
                     {"group_by": ["k"], **window, "aggregations": aggregations})


def run_executors(spark: SparkSession, spec, checkpoint: Path) -> tuple[list[str], Rows]:
    """The output columns and final rows of the same pipeline with ``window_state = "executors"`` (its own
    checkpoint and parquet target)."""
    spec = replace(spec, run=replace(spec.run, window_state="executors", checkpoint_location=str(checkpoint)),
                   target=replace(spec.target, path=f"{checkpoint}-out"))
    run(spec, spark)
    batches = read_batch_dirs(spec.target.path)
    for batch in batches.values():  # a batch's rows are numbered from 0 (their order is the sink's)
        assert sorted(row["_emit_seq"] for row in batch) == list(range(len(batch)))
    rows = [row for batch in batches.values() for row in batch]
    assert {row["_emit_kind"] for row in rows} == {"final"}
    return list(rows[0]), keyed(rows)


def run_driver(spark: SparkSession, spec) -> tuple[list[str], Rows]:
    """The driver mode's output columns and final rows (its parquet target)."""
    run(spec, spark)
    rows = [row for batch in read_batch_dirs(spec.target.path).values() for row in batch]
    assert {row["_emit_kind"] for row in rows} == {"final"}
    return list(rows[0]), keyed(rows)


def naive_us(value: Any) -> Any:
    """A TIMESTAMP Spark collected (naive, in the session's UTC) as µs since the epoch."""
    return us(value.replace(tzinfo=dt.timezone.utc)) if isinstance(value, dt.datetime) else value


def keyed(rows: list[dict[str, Any]]) -> Rows:
    out: Rows = {}
    for row in rows:
        key = (row["window_start"], row["k"])
        assert key not in out, f"{key} written twice"
        out[key] = row
    return out


# -- ground truth --------------------------------------------------------------------------------------


def watermarks(events: list[Ev], lateness_s: float) -> list[float]:
    """The watermark in effect during each batch and one more (the trailing no-data batch), in µs:
    min over the sources that have had rows of (newest event time - lateness), never moving back."""
    newest: dict[str, int] = {}
    marks = [-math.inf]
    for batch in range(max(e.batch for e in events) + 1):
        for e in events:
            if e.batch == batch:
                newest[e.source] = max(newest.get(e.source, e.us), e.us)
        marks.append(max(marks[-1], min(newest.values()) - lateness_s * S))
    return marks


def fixed_truth(events: list[Ev], duration_s: int, hop_s: int, lateness_s: float) -> Rows:
    """Tumbling / hopping windows: a (row, window) assignment counts iff the window ends after the
    watermark in effect during the batch before the row's; windows ending <= the final watermark."""
    marks = watermarks(events, lateness_s)
    assigned = [(start, start + duration_s * S, e) for e in events
                for start in window_starts(e.us, duration_s * S, hop_s * S)
                if e.batch == 0 or start + duration_s * S > marks[e.batch - 1]]
    return aggregated(assigned, marks[-1])


def session_truth(events: list[Ev], gap_s: int, cap_s: int, lateness_s: float) -> Rows:
    """Sessions of rows no rule makes late, none ending at a watermark (both checked: the modes differ
    there, see executor_refusals): per key and cap bucket, rows at most the gap apart join; a session
    ends at min(last + gap, its bucket's end); written iff end <= the final watermark."""
    marks = watermarks(events, lateness_s)
    assert all(e.us >= marks[e.batch] for e in events), "a row late by the driver's rule"
    gap, cap = gap_s * S, cap_s * S
    assigned: list[tuple[int, int, Ev]] = []
    by_key: dict[tuple, list[Ev]] = {}
    for e in sorted(events, key=lambda e: e.us):
        by_key.setdefault((e.k, e.us // cap), []).append(e)
    for (_, bucket), rows in by_key.items():
        session: list[Ev] = []
        for e in [*rows, None]:
            if session and (e is None or e.us - session[-1].us > gap):
                end = min(session[-1].us + gap, (bucket + 1) * cap)
                assigned += [(session[0].us, end, member) for member in session]
                session = []
            if e is not None:
                session.append(e)
    assert not {end for _, end, _ in assigned} & set(marks), "a session ends at a watermark: the modes differ there"
    return aggregated(assigned, marks[-1])


def aggregated(assigned: list[tuple[int, int, Ev]], final_watermark: float) -> Rows:
    """windows_helpers' aggregator ground truth per (window, key), for the windows written."""
    groups: dict[Key, list[tuple[int, Ev]]] = {}
    for start, end, e in assigned:
        if end <= final_watermark:
            groups.setdefault((start, e.k), []).append((end, e))
    out: Rows = {}
    for (start, k), members in groups.items():
        frame = pd.DataFrame([{"_t": e.us, "v": e.v, "x": e.x, "page": e.page} for _, e in members], dtype=object)
        out[(start, k)] = {"window_start": start, "window_end": members[0][0], "k": k,
                           **{a["as"]: AGG_TRUTH[a["agg"]](frame, a.get("column")) for a in AGGREGATIONS}}
    return out


def assert_rows(got: Rows, want: Rows, columns: list[str], close: Callable[[str], bool] = lambda _: False) -> None:
    """The same keys and, per key, the same values of ``columns`` (same type too); ``close`` names
    the columns compared within 50 % instead (an HLL estimate past its exact range)."""
    assert sorted(got, key=repr) == sorted(want, key=repr)
    for key, row in want.items():
        for column in columns:
            g, w = got[key][column], row[column]
            if close(column):
                assert abs(g - w) <= w / 2, (key, column, g, w)
            else:
                assert g == w and type(g) is type(w), (key, column, g, w)


COLUMNS = ["window_start", "window_end", "k", *ALIASES]


def assert_both_modes(spark: SparkSession, tmp: Path, spec, truth: Rows,
                      hll_close: bool = False) -> Rows:
    """The executors' rows, checked against the ground truth and the driver's (every column both write)."""
    columns, executors = run_executors(spark, spec, tmp / "executors-checkpoint")
    driver_columns, driver = run_driver(spark, spec)
    assert columns == driver_columns
    assert_rows(executors, truth, COLUMNS, close=lambda c: hll_close and c == "pages")
    assert_rows(executors, driver, [c for c in columns if c != "_emit_seq"])
    return executors


# -- 1. tumbling, two sources --------------------------------------------------------------------------

# lateness 10 s, 1-minute windows; marks in effect: [-inf, 20, 65, 65, 120] s. No row falls between the
# late rules of the two modes (test 4 has one): a window the driver closed gets no row afterwards.
PAGES = [f"q{i}" for i in range(18)]  # window [60, 120) of k1 leaves HLL's exact range at lgK 4
TUMBLING = [
    Ev(0, "a", "k1", 5, 1, 0.5, "p1"), Ev(0, "a", "k1", 10, 2, 1.25, "p2"), Ev(0, "a", None, 30, 3, 0.25, "p1"),
    Ev(0, "b", "k1", 10, 7, 2.0, "p0"), Ev(0, "b", "k1", 20, None, None, None), Ev(0, "b", "k2", 50, 5, 0.75, "p3"),
    Ev(1, "a", "k1", 70, 6, 1.5, "p1"), Ev(1, "a", "k2", 80, 4, 0.5, "p2"), Ev(1, "b", "k1", 75, 8, 0.25, "p3"),
    Ev(1, "b", "k1", 2, 9, 1.0, "p9"),  # behind W (20) but its window is open: counts
    *[Ev(1, "a", "k1", 61 + i, i, 0.25, PAGES[i]) for i in range(6)],
    *[Ev(1, "b", "k1", 70 + i, i, 0.5, PAGES[6 + i]) for i in range(6)],
    Ev(2, "a", "k1", 130, 10, 0.25, "p1"), Ev(2, "a", "k2", 61, 13, 0.5, "p5"),  # k2@61: [60, 120) still open
    Ev(2, "b", "k1", -5, 11, 0.5, "p4"),  # [-60, 0) ended before 20: late in both modes
    *[Ev(2, "a", "k1", 100 + i, i, 0.75, PAGES[12 + i]) for i in range(6)],
    Ev(3, "a", "k1", 59.999, 12, 0.5, "p5"),  # [0, 60) ended before 65: late in both modes
    Ev(3, "a", "k1", 119, 3, 0.5, "p8"), Ev(3, "a", "k1", 119, 30, 0.5, "p7"),  # last: the largest at the tie
    Ev(3, "b", "k2", 131, 14, 0.25, "p1"),
]


def test_tumbling_windows_of_two_sources_are_the_driver_modes_with_every_aggregator(
        spark: SparkSession, tmp_path: Path) -> None:
    spec = pipeline(tmp_path, TUMBLING, {"kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 10_000,
                                         "hll_precision": 4})
    truth = fixed_truth(TUMBLING, 60, 60, 10)
    assert [m / S - us(T0) / S for m in watermarks(TUMBLING, 10)[1:]] == [20, 65, 65, 120]
    assert {k for k in truth} == {(us(T0), "k1"), (us(T0), None), (us(T0), "k2"), (us(T0) + 60 * S, "k1"),
                                  (us(T0) + 60 * S, "k2")}
    assert truth[(us(T0), "k1")]["first_v"] == 9 and truth[(us(T0) + 60 * S, "k1")]["last_page"] == "p8"
    executors = assert_both_modes(spark, tmp_path, spec, truth, hll_close=True)
    many = (us(T0) + 60 * S, "k1")  # 22 pages: the estimate is HLL's (both modes alike), not the count
    assert (executors[many]["pages"], truth[many]["pages"]) == (20, 22)


# -- 2. hopping, one source ------------------------------------------------------------------------------

# 90-second windows every minute (the duration not a multiple of the hop), lateness 0; marks in effect
# [-inf, 65, 65, 140, 200] s: batch 2 runs under the same watermark in both modes' late rules.
HOPPING = [
    Ev(0, "a", "k1", 5, 1, 0.5, "p1"), Ev(0, "a", "k1", 30, 2, 0.25, "p2"), Ev(0, "a", "k2", 65, 3, 1.0, "p1"),
    Ev(1, "a", "k1", 50, 4, 0.5, "p3"), Ev(1, "a", "k2", 60, None, 0.5, "p1"),
    Ev(2, "a", "k1", 20, 5, 0.75, "p4"),  # [-60, 30) closed: dropped there; [0, 90) open: counts
    Ev(2, "a", "k1", -40, 6, 0.5, "p5"),  # both its windows closed: late
    Ev(2, "a", "k2", 140, 7, 0.25, "p2"),
    Ev(3, "a", "k1", 100, 8, 0.5, "p6"), Ev(3, "a", "k2", 200, 9, 0.5, "p7"),
]


def test_hopping_windows_of_one_source_are_the_driver_modes(
        spark: SparkSession, tmp_path: Path) -> None:
    spec = pipeline(tmp_path, HOPPING, {"kind": "hopping", "duration_ms": 90_000, "hop_ms": 60_000}, sources=("a",))
    truth = fixed_truth(HOPPING, 90, 60, 0)
    assert truth[(us(T0), "k1")]["n"] == 4  # 5, 30, 50 and 20 (whose other window was closed)
    assert_both_modes(spark, tmp_path, spec, truth)


# -- 3. sessions, two sources -------------------------------------------------------------------------------

# gap 10 s, cap 60 s, lateness 30 s; marks in effect [-inf, 25, 61, 120] s. Every row is at or after the
# watermark before its batch (late by no rule) and no session ends exactly at a watermark.
SESSIONS = [
    Ev(0, "a", "k1", 0, 1, 0.5, "p1"), Ev(0, "a", "k1", 10, 2, 0.25, "p2"),  # exactly the gap apart: one session
    Ev(0, "a", "k2", 55, 3, 1.0, "p1"), Ev(0, "a", None, 3, 4, 0.5, "p3"),
    Ev(0, "b", "k1", 20.001, 5, 0.5, "p1"),  # 10.001 s after 10: a new session
    Ev(0, "b", "k2", 62, 6, 0.75, "p2"),  # the next cap bucket: k2@55's session is cut at 60
    Ev(1, "a", "k1", 25, 7, 0.5, "p4"), Ev(1, "a", "k3", 100, 8, 0.25, "p1"),
    Ev(1, "b", "k2", 70, None, 0.5, None), Ev(1, "b", "k1", 90, 9, 0.5, "p5"), Ev(1, "b", "k4", 91, 10, 0.5, "p1"),
    Ev(2, "a", "k1", 92, 11, 0.25, "p6"), Ev(2, "a", "k2", 200, 12, 0.5, "p1"),
    Ev(2, "b", "k3", 105, 13, 0.5, "p2"), Ev(2, "b", "k1", 150, 14, 0.5, "p1"),
]


def test_sessions_of_two_sources_are_the_driver_modes(
        spark: SparkSession, tmp_path: Path) -> None:
    spec = pipeline(tmp_path, SESSIONS, {"kind": "session", "gap_ms": 10_000, "max_session_duration_ms": 60_000,
                                         "lateness_ms": 30_000})
    truth = session_truth(SESSIONS, 10, 60, 30)
    t0 = us(T0)
    ends = {(start - t0) / S: (row["window_end"] - t0) / S for (start, _), row in truth.items()}
    assert ends == {0: 20, 3: 13, 20.001: 35, 55: 60, 62: 80, 91: 101, 90: 102, 100: 115}
    assert_both_modes(spark, tmp_path, spec, truth)


# -- each kind with the other number of sources -----------------------------------------------------------


def one_source(events: list[Ev]) -> list[Ev]:
    return [replace(e, source="a") for e in events]


def two_sources(events: list[Ev]) -> list[Ev]:
    """Every other row of each batch from a second source."""
    return [replace(e, source="ab"[i % 2]) for i, e in enumerate(events)]


def agreed(events: list[Ev], duration_s: int, hop_s: int, lateness_s: float) -> list[Ev]:
    """``events`` without the rows the two late rules judge apart (a window of theirs ends after the
    watermark of the batch before theirs, at or before their batch's own: Spark counts them, the
    driver drops them), removed until none is left, since each removal moves the watermarks."""
    while True:
        marks = watermarks(events, lateness_s)
        apart = {e for e in events for start in window_starts(e.us, duration_s * S, hop_s * S)
                 if e.batch > 0 and marks[e.batch - 1] < start + duration_s * S <= marks[e.batch]}
        if not apart:
            return events
        events = [e for e in events if e not in apart]


@pytest.mark.parametrize("kind", ["tumbling", "hopping", "session"])
def test_each_kind_with_the_other_number_of_sources_is_the_driver_modes(
        spark: SparkSession, tmp_path: Path, kind: str) -> None:
    """Tumbling and sessions of one source, hopping windows of two: the truth's watermark is then
    another, so other rows are late and other windows written, by both modes alike (rows the two late
    rules judge apart are left out of the input: test 4 pins that difference down)."""
    if kind == "tumbling":
        events = agreed(one_source(TUMBLING), 60, 60, 10)
        window = {"kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 10_000}
        truth = fixed_truth(events, 60, 60, 10)
    elif kind == "hopping":
        events = agreed(two_sources(HOPPING), 90, 60, 0)
        window = {"kind": "hopping", "duration_ms": 90_000, "hop_ms": 60_000}
        truth = fixed_truth(events, 90, 60, 0)
    else:
        events = one_source(SESSIONS)
        while late := {e for e in events if e.us < watermarks(events, 30)[e.batch]}:  # late by the driver's rule
            events = [e for e in events if e not in late]
        window = {"kind": "session", "gap_ms": 10_000, "max_session_duration_ms": 60_000, "lateness_ms": 30_000}
        truth = session_truth(events, 10, 60, 30)
    sources = tuple(sorted({e.source for e in events}))
    assert len(sources) == (2 if kind == "hopping" else 1)
    spec = pipeline(tmp_path, events, {**window, "hll_precision": 4}, sources=sources)
    assert_both_modes(spark, tmp_path, spec, truth, hll_close=True)


# -- 4. where the modes differ ---------------------------------------------------------------------------------


def test_a_row_for_a_window_the_previous_batch_closed_counts_here_but_is_late_in_driver_mode(
        spark: SparkSession, tmp_path: Path) -> None:
    """Spark judges batch n's rows by the watermark in effect during batch n - 1 and writes the window
    a batch later than the driver, so a row of a window the previous batch closed still counts in it.
    The driver wrote [0, 60) after batch 1 (W = 70) and drops u@40 of batch 2 as late."""
    events = [Ev(0, "a", "u", 30), Ev(1, "a", "u", 70), Ev(2, "a", "u", 40), Ev(2, "a", "u", 135)]
    spec = pipeline(tmp_path, events, {"kind": "tumbling", "duration_ms": 60_000}, sources=("a",))
    _, executors = run_executors(spark, spec, tmp_path / "executors-checkpoint")
    _, driver = run_driver(spark, spec)
    assert_rows(executors, fixed_truth(events, 60, 60, 0), COLUMNS)
    first = (us(T0), "u")
    assert (executors[first]["n"], driver[first]["n"]) == (2, 1)
    assert {key: row["n"] for key, row in executors.items() if key != first} == \
        {key: row["n"] for key, row in driver.items() if key != first}


def test_an_integer_sum_leaving_bigint_fails_the_query_naming_the_window_and_group(
        spark: SparkSession, tmp_path: Path) -> None:
    events = [Ev(0, "a", "u", 5, 2**62), Ev(0, "a", "u", 6, 2**62), Ev(1, "a", "u", 70)]
    spec = pipeline(tmp_path, events, {"kind": "tumbling", "duration_ms": 60_000}, sources=("a",),
                    aggregations=[{"agg": "sum", "column": "v", "as": "sum_v"}])
    with pytest.raises(AggregationOverflow) as failed:
        run_executors(spark, spec, tmp_path / "checkpoint")
    assert failed.value.terminal
    assert str(failed.value) == ("pipeline execplan: integer sum left the BIGINT range in sum_v, pipeline 'execplan', "
                                 'window starting 2024-01-01 00:00:00, group {"k":"u"}')


def test_an_hll_estimate_past_the_exact_range_depends_on_how_its_sketches_were_merged() -> None:
    """Not a function of the distinct values alone: a sketch built in one pass keeps its HIP estimate,
    one unioned from two sketches past their exact range takes the composite estimate. Both modes
    union the same partial sketches (per batch, per input partition), so they agree (tests 1-3); a
    value differs once one mode's partials differ (another batch split, or a batch's files in other
    partitions)."""
    lg_k, values = 12, range(1000)
    whole, halves = hll_sketch(lg_k), [hll_sketch(lg_k), hll_sketch(lg_k)]
    union = hll_union(lg_k)
    for value in values:
        whole.update(value)
        halves[value % 2].update(value)
    for half in halves:
        union.update(half)
    assert (round(whole.get_estimate()), round(union.get_result().get_estimate())) == (996, 988)
