"""``[emit] sql``'s release times computed over Arrow (streaming/release_times.py) against Spark SQL evaluating
the same text: generated predicates of the grammar (docs/contract/delayed-windows.md) over generated rows,
NULLs, zero divisors and overflows included. The ground truth is Spark itself (ANSI, session time zone UTC)
running ``CASE WHEN <guard> THEN UNIX_MICROS(<bound>) END`` over the same rows: equal values, or both fail.
The generator below is written from Spark's SQL reference, not from the grammar module's tables."""

from __future__ import annotations

import functools
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ematix_dagster.sql.release_plan import ReleaseBranch
from ematix_dagster.streaming.release_times import ReleaseTimes, RowFailed

UTC = pa.timestamp("us", tz="UTC")
HOUR = 3_600_000_000
COLUMNS = ("window_start", "window_end", "k", "n", "m", "d")
VIEW = "release_times_rows"


def _rows() -> pa.Table:
    base = int(datetime(2024, 3, 2, 22, 30, tzinfo=timezone.utc).timestamp() * 1_000_000)
    starts = [base + i * HOUR // 2 for i in range(8)]
    return pa.table({
        "window_start": pa.array(starts, UTC),
        "window_end": pa.array([s + (i % 3 + 1) * HOUR for i, s in enumerate(starts)], UTC),
        "k": pa.array(["a", "B", None, "ab", "É", "", "b", "a"]),
        "n": pa.array([0, 3, -7, None, 2**62, 12, -1, 100], pa.int64()),
        "m": pa.array([5, None, 2**31 - 1, -2, 0, 7, 1, -3], pa.int32()),
        "d": pa.array([1.5, -2.25, None, 0.0, 7.0, -0.5, 3.75, 1e10], pa.float64()),
    })


ROWS = _rows()

#: how deeply the generated expressions nest: the grammar is recursive, and without a bound most draws
#: grow until Hypothesis gives them up (four in five, each after its own generation time)
DEPTH = 3


@functools.cache
def ints(depth: int = DEPTH) -> st.SearchStrategy[str]:
    leaves = st.one_of(
        st.sampled_from(["n", "m", "0", "1", "2", "3", "-1", "100", "2147483647", "4611686018427387904"]),
        st.builds("length(k)".format),
    )
    if depth == 0:
        return leaves
    i, b, s = ints(depth - 1), bools(depth - 1), stamps(depth - 1)
    return st.one_of(
        leaves,
        st.builds("({} {} {})".format, i, st.sampled_from(["+", "-", "*", "%", "DIV"]), i),
        st.builds("abs({})".format, i),
        st.builds("coalesce({}, {})".format, i, i),
        st.builds("greatest({}, {})".format, i, i),
        st.builds("least({}, {}, NULL)".format, i, i),
        st.builds("CASE WHEN {} THEN {} ELSE {} END".format, b, i, i),
        st.builds("hour({})".format, s),
        st.builds("dayofweek({})".format, s),
    )


def numbers(depth: int) -> st.SearchStrategy[str]:
    i = ints(depth)
    return st.one_of(i, st.sampled_from(["d", "1.5", "0.25"]), st.builds("({} / {})".format, i, i),
                     st.builds("(d % {})".format, i))


strings = st.sampled_from(["k", "'a'", "'b'", "lower(k)", "upper(k)", "coalesce(k, 'z')", "NULL"])


@functools.cache
def stamps(depth: int = DEPTH) -> st.SearchStrategy[str]:
    leaves = st.sampled_from(["window_start", "window_end", "TIMESTAMP '2024-03-03 00:00:00'"])
    if depth == 0:
        return leaves
    b, s = bools(depth - 1), stamps(depth - 1)
    return st.one_of(
        leaves,
        st.builds("({} {} INTERVAL {} {})".format, s, st.sampled_from(["+", "-"]), st.integers(-3, 90),
                  st.sampled_from(["MICROSECONDS", "SECONDS", "MINUTE", "HOURS", "DAY", "WEEK"])),
        st.builds("greatest({}, {})".format, s, s),
        st.builds("coalesce(CASE WHEN {} THEN {} END, {})".format, b, s, s),
        st.builds("IF({}, {}, {})".format, b, s, s),
    )


@functools.cache
def bools(depth: int = DEPTH) -> st.SearchStrategy[str]:
    leaves = st.one_of(
        st.builds("{} {} {}".format, strings, st.sampled_from(["=", "<>", "<", ">=", "<=>"]), strings),
        st.builds("(window_end - window_start) >= INTERVAL {} HOURS".format, st.integers(1, 3)),
        st.builds("(k IN ('a', 'b'))".format),
        st.sampled_from(["TRUE", "FALSE", "NULL"]),
    )
    if depth == 0:
        return leaves
    b, i, s, n = bools(depth - 1), ints(depth - 1), stamps(depth - 1), numbers(depth - 1)
    return st.one_of(
        leaves,
        st.builds("{} {} {}".format, n, st.sampled_from(["=", "<>", "<", "<=", ">", ">=", "<=>"]), n),
        st.builds("{} {} {}".format, s, st.sampled_from(["<", ">=", "="]), s),
        st.builds("({} AND {})".format, b, b),
        st.builds("({} OR {})".format, b, b),
        st.builds("(NOT {})".format, b),
        st.builds("({} IS NULL)".format, st.one_of(i, strings)),
        st.builds("({} IS NOT NULL)".format, i),
        st.builds("({} {}IN ({}, {}, NULL))".format, i, st.sampled_from(["", "NOT "]), st.integers(-2, 5),
                  st.integers(-2, 5)),
        st.builds("({} BETWEEN {} AND {})".format, i, i, i),
    )


@pytest.fixture(scope="module")
def view(spark):
    spark.createDataFrame(ROWS).createOrReplaceTempView(VIEW)
    return spark


def _spark(spark, guard: str, bound: str, strict: bool) -> list[int | None] | None:
    """Spark's release times (None: Spark failed on a row)."""
    sql = f"SELECT CASE WHEN {guard} THEN UNIX_MICROS({bound}){' + 1' if strict else ''} END AS r FROM {VIEW}"
    try:
        return [row.r for row in spark.sql(sql).collect()]
    except Exception as exc:  # noqa: BLE001 - Spark's errors have no common public type
        if "DATATYPE_MISMATCH" in str(exc) or "UNRESOLVED" in str(exc) or "CAST" in str(exc):
            assume(False)  # Spark refuses the text itself (an analysis error, not a row's)
        return None


def _arrow(guard: str, bound: str, strict: bool) -> list[int | None] | None:
    try:
        return ReleaseTimes([ReleaseBranch(guard, bound, strict)], COLUMNS).of(ROWS).to_pylist()
    except RowFailed:
        return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(guard=bools(), bound=stamps(), strict=st.booleans())
def test_arrow_computes_what_spark_computes(view, guard, bound, strict) -> None:
    want = _spark(view, guard, bound, strict)
    assert _arrow(guard, bound, strict) == want, (guard, bound, strict)


@pytest.mark.parametrize(("guard", "bound", "want"), [
    ("n <> 0 AND 10 / n > 1", "window_end", "values"),  # the right side only where the left is not FALSE
    ("CASE WHEN m = 0 THEN FALSE ELSE 10 % m = 0 END", "window_end", "values"),
    ("n * 4 > 0", "window_end", "fails"),  # 2**62 * 4 overflows BIGINT
    ("m + 1 > 0", "window_end", "fails"),  # 2**31 - 1 + 1 overflows INT
    ("n / 0 > 1", "window_end", "fails"),
    ("d % 2 = -0.25", "window_start", "values"),  # the sign of the dividend
    ("-7 % 3 = -1 AND n % -3 = n - (n DIV -3) * -3", "window_start - INTERVAL 1 WEEK", "values"),
])
def test_hand_picked_cases_agree_with_spark(view, guard, bound, want) -> None:
    expected = _spark(view, guard, bound, False)
    assert (expected is None) == (want == "fails")
    assert _arrow(guard, bound, False) == expected
