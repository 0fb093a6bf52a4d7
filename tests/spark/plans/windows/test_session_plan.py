"""The Spark half of session windows (docs/contract/windows.md) against an independent pandas sessionizer.

``SessionPlan`` runs on small static DataFrames; its partials are compared with a ground truth
that imports nothing from the engine: per (key, cap bucket ``t // cap``), rows sorted by event
time, a new session where consecutive rows are more than ``gap`` apart; a row is late iff
``t < closed_before``; rows with a pre-SQL ``_reason`` or late rows are counted per class only.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, Callable

import pandas as pd
import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ematix_dagster.columns import CLASS, PRIMARY, ROWS
from ematix_dagster.spark.batch.batch_columns import _source_counts
from ematix_dagster.spark.batch.batch_counts import batch_counts
from ematix_dagster.spark.batch.batch_values import with_batch_values
from ematix_dagster.spark.plans.windows.kind_plan import Aggregates
from ematix_dagster.spark.plans.windows.session_plan import SessionPlan

GAP_MS, CAP_MS = 10, 100
GAP, CAP = GAP_MS * 1_000, CAP_MS * 1_000  # µs
WINDOW = SimpleNamespace(group_by=["k"], late_data="drop", gap_ms=GAP_MS, max_session_duration_ms=CAP_MS,
                         retention_ms=0)
PIPELINE = SimpleNamespace(sources=[SimpleNamespace(name="s1"), SimpleNamespace(name="s2")])
HELPERS = {"_ts", "_bucket", "_new", "_sid", PRIMARY, CLASS}

# (k, v, event time µs or None, source, reason)
Row = tuple[Any, Any, Any, str, Any]
Session = tuple[Any, int, int, int, Any]  # (k, first, last, rows, sum of v)


def aggregates(gate: Column) -> Aggregates:
    return Aggregates([], [F.count(F.lit(1)).alias("_p0"), F.sum(F.when(gate, F.col("v"))).alias("_p1")])


def with_counts(gate: Column) -> Aggregates:
    # the rows whose event time counts towards their source's newest: no reason, or a rejection's
    timed = F.col("_reason").isNull() | F.col("_reason").isin("sql_error", "key_too_large", "out_of_range")
    return Aggregates([], aggregates(gate).columns + _source_counts(PIPELINE, timed))  # type: ignore[arg-type]


def frame(spark: SparkSession, rows: list[Row], with_reason: bool = True) -> DataFrame:
    df = spark.createDataFrame(rows, "k STRING, v BIGINT, us BIGINT, _source STRING, _reason STRING")
    df = df.select("k", "v", F.timestamp_micros("us").alias("_event_ts"), "_source", "_reason")
    return df if with_reason else df.drop("_reason")


# -- the ground truth --------------------------------------------------------------------------

def row_class(row: Row, closed_before: int | None) -> str | None:
    if row[4] is not None:
        return row[4]
    return "late" if closed_before is not None and row[2] < closed_before else None


def expected_sessions(rows: list[Row], closed_before: int | None) -> list[Session]:
    kept = [r for r in rows if row_class(r, closed_before) is None]
    if not kept:
        return []
    df = pd.DataFrame({"k": pd.Series([r[0] for r in kept], dtype=object).fillna("\0null"),
                       "v": pd.Series([r[1] for r in kept], dtype="Int64"), "ts": [r[2] for r in kept]})
    df["bucket"] = df["ts"] // CAP
    out: list[Session] = []
    for (k, _), g in df.groupby(["k", "bucket"], sort=True):
        g = g.sort_values("ts", kind="stable")
        sid = (g["ts"].diff() > GAP).cumsum()
        for _, s in g.groupby(sid.to_numpy()):
            total = s["v"].sum(min_count=1)
            out.append((None if k == "\0null" else k, int(s["ts"].min()), int(s["ts"].max()), len(s),
                        None if pd.isna(total) else int(total)))
    return sorted(out, key=order)


def expected_classes(rows: list[Row], closed_before: int | None) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        c = row_class(r, closed_before)
        if c is not None:
            counts[c] = counts.get(c, 0) + 1
    return counts


def order(s: Session) -> tuple[Any, ...]:
    return (s[0] is None, s[0] or "", s[1])


# -- running the plan --------------------------------------------------------------------------

def planned(spark: SparkSession, rows: list[Row], closed_before: int | None, with_reason: bool = True,
            aggs: Callable[[Column], Aggregates] = aggregates):
    """The plan over ``rows``, with the batch values the engine joins (``closed_before`` one of them)."""
    df = with_batch_values(frame(spark, rows, with_reason), 0, closed_before, None)
    return SessionPlan(WINDOW, aggs, with_reason).frames(df, 7)  # type: ignore[arg-type]


def run(spark: SparkSession, rows: list[Row], closed_before: int | None, with_reason: bool = True,
        aggs: Callable[[Column], Aggregates] = aggregates) -> tuple[list[Session], dict[str, int], list[dict]]:
    frames = planned(spark, rows, closed_before, with_reason, aggs)
    table = frames.partials.toArrow()
    assert table.column_names[:6] == [CLASS, "k", "_bucket", "_sid", "_first", "_last"]
    assert {"_p0", "_p1", ROWS} <= set(table.column_names) and "_ws" not in table.column_names
    sessions: list[Session] = []
    classes: dict[str, int] = {}
    for r in table.to_pylist():
        assert r["_p0"] == r[ROWS]
        if r[CLASS] is None:
            assert r["_first"] // CAP == r["_last"] // CAP == r["_bucket"], r  # a session never crosses a bucket
            sessions.append((r["k"], r["_first"], r["_last"], r[ROWS], r["_p1"]))
        else:
            assert r[CLASS] not in classes, r  # one row per class
            assert (r["k"], r["_bucket"], r["_sid"], r["_first"], r["_last"], r["_p1"]) == (None,) * 6, r
            classes[r[CLASS]] = r[ROWS]
    return sorted(sessions, key=order), classes, table.to_pylist()


def check(spark: SparkSession, rows: list[Row], closed_before: int | None, with_reason: bool = True) -> list[Session]:
    sessions, classes, _ = run(spark, rows, closed_before, with_reason)
    assert sessions == expected_sessions(rows, closed_before)
    assert classes == expected_classes(rows, closed_before)
    return sessions


def windowed(k: Any, v: Any, ts: int, source: str = "s1") -> Row:
    return (k, v, ts, source, None)


BASE = 10 * CAP  # a bucket start


# -- cases --------------------------------------------------------------------------------------

def test_rows_exactly_gap_apart_join_and_one_more_microsecond_splits(spark: SparkSession) -> None:
    rows = [windowed("a", 1, BASE + 1_000), windowed("a", 2, BASE + 1_000 + GAP),
            windowed("a", 3, BASE + 1_000 + 2 * GAP),
            windowed("a", 4, BASE + 1_000 + 3 * GAP + 1), windowed("a", 5, BASE + 1_000 + 3 * GAP + 1)]  # a tie
    sessions = check(spark, rows, None)
    assert sessions == [("a", BASE + 1_000, BASE + 1_000 + 2 * GAP, 3, 6),
                        ("a", BASE + 1_000 + 3 * GAP + 1, BASE + 1_000 + 3 * GAP + 1, 2, 9)]


def test_a_cap_bucket_boundary_cuts_a_session(spark: SparkSession) -> None:
    edge = BASE + CAP
    rows = [windowed("a", 1, edge - GAP), windowed("a", 2, edge - 1), windowed("a", 3, edge),
            windowed("a", 4, edge + GAP),
            windowed("b", 5, -GAP // 2), windowed("b", 6, GAP // 2)]  # before the epoch: floor, not truncation
    sessions = check(spark, rows, None)
    assert sessions == [("a", edge - GAP, edge - 1, 2, 3), ("a", edge, edge + GAP, 2, 7),
                        ("b", -GAP // 2, -GAP // 2, 1, 5), ("b", GAP // 2, GAP // 2, 1, 6)]


def test_late_rows_are_a_class_and_join_no_session(spark: SparkSession) -> None:
    closed = BASE + 50_000
    rows = [windowed("a", 1, closed - GAP), windowed("a", 2, closed - 1),  # late: would bridge to the next row
            windowed("a", 3, closed), windowed("a", 4, closed + GAP), windowed("b", 5, closed - 3 * GAP)]
    sessions, classes, _ = run(spark, rows, closed)
    assert sessions == [("a", closed, closed + GAP, 2, 7)] == expected_sessions(rows, closed)
    assert classes == {"late": 3}
    # without a watermark nothing is late: the same rows make one session
    assert check(spark, rows, None)[0] == ("a", closed - GAP, closed + GAP, 4, 10)


def test_null_keys_are_a_group_of_their_own(spark: SparkSession) -> None:
    rows = [windowed(None, 1, BASE), windowed(None, None, BASE + GAP), windowed("a", 3, BASE + GAP // 2),
            windowed(None, 4, BASE + 3 * GAP)]
    assert check(spark, rows, None) == [("a", BASE + GAP // 2, BASE + GAP // 2, 1, 3),
                                        (None, BASE, BASE + GAP, 2, 1), (None, BASE + 3 * GAP, BASE + 3 * GAP, 1, 4)]


def test_bad_rows_are_class_rows_and_feed_the_batch_counters(spark: SparkSession) -> None:
    closed = BASE + 5 * GAP
    rows = [windowed("a", 1, BASE + 5 * GAP), ("a", 9, None, "s1", "invalid_event_time"),
            ("a", 9, BASE + 6 * GAP, "s2", "future"), ("b", 9, None, "s2", "invalid_event_time"),
            windowed("a", 2, BASE + 6 * GAP, "s2"), windowed("b", 3, BASE, "s2"), windowed("a", 4, BASE + 7 * GAP)]
    sessions, classes, _ = run(spark, rows, closed, aggs=with_counts)
    assert sessions == expected_sessions(rows, closed) == [("a", BASE + 5 * GAP, BASE + 7 * GAP, 3, 7)]
    assert classes == expected_classes(rows, closed) == {"invalid_event_time": 2, "future": 1, "late": 1}
    frames = planned(spark, rows, closed, aggs=with_counts)
    stats, late = batch_counts(PIPELINE, frames.partials.toArrow(), None)  # type: ignore[arg-type]
    assert late == {"late_rows": 1, "late_assignments": 0, "reopened_rows": 0, "rejected": {}, "rows": len(rows)}
    assert stats == {"rows_0": 3, "max_0": BASE + 7 * GAP, "invalid_0": 1, "future_0": 0, "malformed_0": 0,
                     "rows_1": 4, "max_1": BASE + 6 * GAP, "invalid_1": 1, "future_1": 1, "malformed_1": 0}


def test_without_a_reason_column_after_a_sql(spark: SparkSession) -> None:
    rows = [windowed("a", 1, BASE), windowed("a", 2, BASE + GAP), windowed("c", 3, BASE - 1)]
    check(spark, rows, BASE, with_reason=False)


def test_late_rows_frame_holds_the_late_rows_with_batch_id_and_reason(spark: SparkSession) -> None:
    closed = BASE + GAP
    rows = [windowed("a", 1, closed - 1), windowed(None, 2, BASE), windowed("a", 3, closed),
            ("a", 4, None, "s1", "invalid_event_time")]
    frames = planned(spark, rows, closed)
    late = frames.class_rows(["late"]).toArrow()
    assert late.column_names == ["k", "v", "_event_ts", "_source", "_batch_id", "_reason"]
    got = sorted(late.to_pylist(), key=lambda r: r["v"])
    assert [(r["k"], r["v"], r["_source"], r["_batch_id"], r["_reason"]) for r in got] == \
        [("a", 1, "s1", 7, "late"), (None, 2, "s1", 7, "late")]
    assert not HELPERS & set(late.column_names)


def random_rows(seed: int, n: int) -> list[Row]:
    rng = random.Random(seed)
    keys = ["a", "b", "c", None]
    cursors = {k: rng.randrange(-2 * CAP, 2 * CAP) for k in keys}
    rows: list[Row] = []
    for _ in range(n):
        k = rng.choice(keys)
        cursors[k] += rng.choice([0, 1, GAP - 1, GAP, GAP, GAP + 1, GAP + 1, 3 * GAP, rng.randrange(2 * GAP)])
        ts = cursors[k] if rng.random() < 0.9 else cursors[k] - rng.randrange(3 * CAP)  # disorder
        v = None if rng.random() < 0.1 else rng.randrange(-100, 100)
        source = rng.choice(["s1", "s2"])
        reason = rng.choice([None] * 17 + ["invalid_event_time", "future", "malformed"])
        rows.append((k, v, None if reason == "invalid_event_time" else ts, source, reason))
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_batches_match_the_pandas_sessionizer(spark: SparkSession, seed: int) -> None:
    rows = random_rows(seed, 300)
    times = sorted(r[2] for r in rows if r[2] is not None)
    closed = times[len(times) // 4] if seed != 3 else None
    sessions = check(spark, rows, closed)
    assert len(sessions) > 20 and any(s[3] > 2 for s in sessions)  # the case is not degenerate
