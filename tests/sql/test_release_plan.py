"""``release_plan``: every accepted form of ``WATERMARK_TS()`` read into its branches, every refused one
named with its fix (no Spark), and the rewritten query run on a local SparkSession, its ``_release_us``
compared with release times worked out here by hand (and under ``guard_sql``, a failing cast in a
release time flagged as ``_sql_error``, not taken for "never")."""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable

import pytest

from ematix_dagster.columns import RELEASE_COLUMN, RESERVED_COLUMNS, SQL_ERROR
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.sql import release_plan as release
from ematix_dagster.sql.release_plan import RELEASE_NOW, ReleaseBranch, ReleasePlan, release_plan, uses_watermark_ts

W = "WATERMARK_TS()"
FROM = "SELECT id, tier FROM source WHERE "


def test_the_names():
    assert release.RELEASE_COLUMN == RELEASE_COLUMN == "_release_us" and RELEASE_COLUMN in RESERVED_COLUMNS
    assert RELEASE_NOW == -(2**63)


@pytest.mark.parametrize("sql,uses", [
    (f"SELECT * FROM source WHERE t <= {W}", True),
    ("SELECT * FROM source WHERE t <= Watermark_Ts()", True),
    (f"SELECT {W} AS w FROM source", True),  # anywhere (release_plan then refuses it)
    ("SELECT * FROM source WHERE t <= watermark_ts", False),  # a column of that name
    ("SELECT 'WATERMARK_TS()' AS s FROM source", False),
    ("SELECT * FROM source WHERE t <= current_timestamp()", False),
])
def test_uses_watermark_ts(sql, uses):
    assert uses_watermark_ts(sql) is uses


def test_uses_watermark_ts_names_the_key_of_sql_that_does_not_parse():
    with pytest.raises(PipelineConfigError, match=r"^emit\.sql: does not parse"):
        uses_watermark_ts("SELECT FROM WHERE (", "emit.sql")


@pytest.mark.parametrize("sql", ["SELECT * FROM source", "SELECT * FROM source WHERE t <= current_timestamp()",
                                 "SELECT a, b FROM source WHERE a > 0 UNION ALL SELECT a, b FROM source"])
def test_no_watermark_ts_no_plan(sql):
    assert release_plan(sql) is None


def b(guard: str | None, release_at: str | None, strict: bool = False) -> ReleaseBranch:
    return ReleaseBranch(guard, release_at, strict)


ACCEPTED = [
    ("lte", f"t <= {W}", [b(None, "t")]),
    ("lt-strict", f"t < {W}", [b(None, "t", True)]),
    ("mirrored-gte", f"{W} >= t", [b(None, "t")]),
    ("mirrored-gt-strict", f"{W} > t", [b(None, "t", True)]),
    ("lower-case", "t <= watermark_ts()", [b(None, "t")]),
    ("call-in-parens", f"t <= ({W})", [b(None, "t")]),
    ("interval", f"t + INTERVAL 15 MINUTES <= {W}", [b(None, "t + INTERVAL '15' MINUTES")]),
    ("function-of-columns", f"{W} >= coalesce(embargo, to_timestamp(s)) + INTERVAL 1 HOUR",
     [b(None, "COALESCE(embargo, TO_TIMESTAMP(s)) + INTERVAL '1' HOUR")]),
    ("guard", f"tier = 'delayed' AND t <= {W}", [b("tier = 'delayed'", "t")]),
    ("guard-after", f"t <= {W} AND tier = 'delayed' AND amount > 0", [b("tier = 'delayed' AND amount > 0", "t")]),
    ("case-guard", f"CASE WHEN tier = 'realtime' THEN FALSE ELSE amount > 0 END AND t <= {W}",
     [b("CASE WHEN tier = 'realtime' THEN FALSE ELSE amount > 0 END", "t")]),
    ("two-branches", f"(tier = 'a' AND t <= {W}) OR (tier = 'b' AND {W} > t + INTERVAL 1 HOUR)",
     [b("tier = 'a'", "t"), b("tier = 'b'", "t + INTERVAL '1' HOUR", True)]),
    ("guard-only-branch", f"(tier = 'delayed' AND t <= {W}) OR tier = 'realtime'",
     [b("tier = 'delayed'", "t"), b("tier = 'realtime'", None)]),
    ("nested-ors-flattened", f"(a OR (t <= {W})) OR ((b AND c))", [b("a", None), b(None, "t"), b("b AND c", None)]),
    ("static-or-in-a-guard", f"(a OR b) AND t <= {W}", [b("a OR b", "t")]),
    ("static-or-and-more", f"(a OR b) AND t <= {W} AND c", [b("(a OR b) AND c", "t")]),
    ("nested-ands-flattened", f"a AND (b AND (t <= {W}))", [b("a AND b", "t")]),
    ("null-release-at", f"NULL <= {W} OR a", [b(None, "NULL"), b("a", None)]),
]


@pytest.mark.parametrize("name,where,branches", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted(name, where, branches):
    plan = release_plan(FROM + where)
    assert isinstance(plan, ReleasePlan)
    assert plan.branches == tuple(branches)
    assert plan.sql.startswith("SELECT id, tier, ") and plan.sql.endswith(f" AS {RELEASE_COLUMN} FROM source")
    assert " WHERE " not in plan.sql and "WATERMARK_TS" not in plan.sql.upper()


def test_the_rewritten_sql():
    """Each branch is its guard's CASE (none without a guard) around its release time in µs, the least
    taken over several; the SELECT list stays as written, * included."""
    sql = release_plan(f"SELECT *, amount * 2 AS twice FROM source s WHERE (tier = 'a' AND t < {W}) OR "
                       f"{W} >= u OR tier = 'now'")
    assert sql is not None and sql.sql == (
        "SELECT *, amount * 2 AS twice, LEAST(CASE WHEN tier = 'a' THEN UNIX_MICROS(t) + 1 END, UNIX_MICROS(u), "
        "CASE WHEN tier = 'now' THEN -9223372036854775808 END) AS _release_us FROM source AS s")
    one = release_plan(f"WITH c AS (SELECT * FROM source) SELECT a FROM c WHERE t <= {W}")
    assert one is not None and one.sql == "WITH c AS (SELECT * FROM source) SELECT a, UNIX_MICROS(t) AS _release_us FROM c"


REFUSED = [
    # where it is
    ("select-list", f"SELECT {W} AS w FROM source", ("in the SELECT list", "only in the top-level WHERE")),
    ("subquery-in-from", f"SELECT * FROM (SELECT * FROM source WHERE t <= {W})", ("in a subquery (in FROM)",)),
    ("subquery-in-where", f"SELECT * FROM source WHERE id IN (SELECT id FROM source WHERE t <= {W})",
     ("in a subquery (in WHERE)",)),
    ("cte", f"WITH c AS (SELECT * FROM source WHERE t <= {W}) SELECT * FROM c", ("in a WITH clause",)),
    ("join-condition", f"SELECT a.id FROM source a JOIN source b ON a.t <= {W}", ("in a JOIN condition",)),
    ("group-by", f"SELECT max(id) AS m FROM source GROUP BY {W}", ("in GROUP BY",)),
    ("having", f"SELECT tier FROM source GROUP BY tier HAVING max(t) <= {W}", ("in HAVING",)),
    ("order-by", f"SELECT id FROM source ORDER BY {W}", ("in ORDER BY",)),
    ("union-branch", f"SELECT id FROM source WHERE t <= {W} UNION ALL SELECT id FROM source", ("in a UNION branch",)),
    ("arguments", "SELECT * FROM source WHERE t <= WATERMARK_TS('x')", ("WATERMARK_TS('x'), with arguments",)),
    # the query around it is not row by row
    ("with-group-by", f"SELECT tier FROM source WHERE t <= {W} GROUP BY tier", ("with GROUP BY", "not row by row")),
    ("with-distinct", f"SELECT DISTINCT tier FROM source WHERE t <= {W}", ("with DISTINCT",)),
    ("with-limit", f"SELECT tier FROM source WHERE t <= {W} LIMIT 5", ("with LIMIT",)),
    ("with-window-function", f"SELECT row_number() OVER (ORDER BY t) AS n FROM source WHERE t <= {W}",
     ("window function",)),
    ("names-the-column", f"SELECT id AS _release_us FROM source WHERE t <= {W}", ("names _release_us", "rename")),
    # the branches
    ("two-time-varying", f"a OR (tier = 'x' AND t <= {W} AND {W} >= u)",
     ("branch 2 of the WHERE", f"`tier = 'x' AND t <= {W} AND {W} >= u`", "2 time-varying conditions",
      "one release time per branch")),
    ("lower-bound", f"{W} <= t", ("branch 1 of the WHERE, `WATERMARK_TS() <= t`", "lower bound",
                                  "expr <= WATERMARK_TS()")),
    ("lower-bound-strict", f"a OR t > {W}", ("branch 2", "`t > WATERMARK_TS()`", "lower bound")),
    ("lower-bound-mirrored", f"{W} < t AND a", ("branch 1", "lower bound (WATERMARK_TS() < t)")),
    ("equality", f"t = {W}", ("equality or inequality",)),
    ("inequality", f"t <> {W}", ("equality or inequality",)),
    ("null-safe-equality", f"t <=> {W}", ("equality or inequality",)),
    ("between", f"{W} BETWEEN t AND u", ("BETWEEN", "expr <= WATERMARK_TS()")),
    ("in", f"{W} IN (t, u)", ("IN",)),
    ("not", f"NOT (t > {W})", ("inside NOT", "without NOT")),
    ("arithmetic", f"{W} - INTERVAL 5 MINUTES >= t",
     ("inside arithmetic", "move the arithmetic", "t + INTERVAL 5 MINUTES <= WATERMARK_TS()")),
    ("function", f"t <= date_trunc('HOUR', {W})", ("inside a function (DATE_TRUNC)", "alone on its side")),
    ("cast", f"d <= CAST({W} AS DATE)", ("inside a function (CAST)",)),
    ("function-around-the-condition", f"coalesce(t <= {W}, FALSE)",
     ("inside a function (COALESCE)", "make the condition itself the comparison")),
    ("case-around-the-condition", f"CASE WHEN tier = 'x' THEN t <= {W} ELSE TRUE END",
     ("inside CASE", "its own OR branch")),
    ("case-on-a-side", f"t <= CASE WHEN a THEN {W} END", ("inside CASE",)),
    ("if-on-a-side", f"t <= IF(a, {W}, u)", ("inside CASE",)),
    ("or-inside-and", f"a AND (b OR t <= {W})",
     ("under an OR inside an AND", "distribute it into top-level OR branches",
      f"(a AND b) OR (a AND t <= {W})")),
    ("expr-calls-it", f"{W} - INTERVAL 1 HOUR <= {W}", ("an expression that itself calls it",)),
    ("expr-calls-it-alone", f"{W} >= coalesce(t, {W})", ("an expression that itself calls it",)),
    ("by-itself", W, ("by itself as a condition",)),
    ("is-null", f"{W} IS NULL OR a", ("branch 1", "inside IS")),
]


@pytest.mark.parametrize("name,sql,words", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused(name, sql, words):
    if not sql.startswith(("SELECT", "WITH")):
        sql = FROM + sql
    with pytest.raises(PipelineConfigError) as err:
        release_plan(sql, "emit.sql")
    assert err.value.key == "emit.sql" and err.value.fix
    for word in words:
        assert word in str(err.value), f"{word!r} not in {err.value}"


# --- on Spark ------------------------------------------------------------------------------------

SCHEMA = "id INT, tier STRING, flag BOOLEAN, t TIMESTAMP, u TIMESTAMP, s STRING"
UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
T1 = dt.datetime(2024, 5, 1, 12, 5, tzinfo=UTC)
MIN15 = dt.timedelta(minutes=15)
#: (id, tier, flag, t, u, s): NULL release times, NULL guards, ties, several TRUE guards, none
ROWS = [
    (1, "delayed", None, T0, None, "2024-05-01 12:00:00"),
    (2, "delayed", None, None, None, None),  # NULL release_at: never
    (3, "strict", None, T0, None, None),  # strict: 1 µs after t
    (4, "realtime", None, None, None, None),  # guard-only: now
    (5, None, None, T0, T1, None),  # every guard NULL: never
    (6, "other", False, T0, T1, None),  # no guard TRUE: never
    (7, "delayed", True, T0, T0 + MIN15, None),  # two branches tie
    (8, "delayed", True, T0, T1, None),  # the earlier of two branches
    (9, "realtime", True, T0, T1, None),  # now beats any time
    (10, "delayed", True, None, T1, None),  # a NULL release time in one branch does not block another
    (11, "strict", True, T1, T1, None),  # strict and not strict at the same time: the non-strict wins
]


def micros(t: dt.datetime) -> int:
    return (t - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


def earliest(*times: int | None) -> int | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


def _view(spark, rows: list[tuple]) -> None:
    from ematix_dagster.spark.plans.window_plan import VIEW

    spark.createDataFrame(rows, SCHEMA).createOrReplaceTempView(VIEW)


def _four_branches(row: tuple) -> int | None:
    _, tier, flag, t, u, _ = row
    return earliest(micros(t + MIN15) if tier == "delayed" and t is not None else None,
                    micros(t) + 1 if tier == "strict" and t is not None else None,
                    RELEASE_NOW if tier == "realtime" else None,
                    micros(u) if flag is True and u is not None else None)


def _case_guard(row: tuple) -> int | None:
    _, tier, flag, t, _, _ = row
    applies = False if tier == "realtime" else flag  # CASE: FALSE for realtime, else flag (NULL stays NULL)
    return micros(t) if applies is True and t is not None else None


ON_SPARK: list[tuple[str, str, Callable[[tuple], Any]]] = [
    ("four-branches", f"SELECT id, tier FROM source WHERE (tier = 'delayed' AND t + INTERVAL 15 MINUTES <= {W}) "
     f"OR (tier = 'strict' AND {W} > t) OR tier = 'realtime' OR (flag AND u <= {W})", _four_branches),
    ("select-star-no-guard", f"SELECT * FROM source WHERE {W} >= coalesce(u, t)",
     lambda r: earliest(micros(r[4] or r[3]) if (r[4] or r[3]) else None)),
    ("case-guard", f"SELECT id, tier FROM source WHERE CASE WHEN tier = 'realtime' THEN FALSE ELSE flag END "
     f"AND t <= {W}", _case_guard),
]


@pytest.mark.parametrize("name,sql,expected", ON_SPARK, ids=[c[0] for c in ON_SPARK])
def test_release_times_on_spark(spark, name, sql, expected):
    plan = release_plan(sql)
    assert plan is not None
    _view(spark, ROWS)
    out = spark.sql(plan.sql)
    written = spark.sql(sql.split(" WHERE ")[0])  # the query as written, without its WHERE
    assert out.columns == [*written.columns, RELEASE_COLUMN]
    assert out.schema[RELEASE_COLUMN].dataType.simpleString() == "bigint"
    got = {row["id"]: row[RELEASE_COLUMN] for row in out.collect()}
    assert got == {row[0]: expected(row) for row in ROWS}  # every row is there: the WHERE filters nothing


def test_the_hand_worked_times_cover_every_case():
    """The expectations of ``four-branches`` hold each case the rows were written for."""
    times = {row[0]: _four_branches(row) for row in ROWS}
    assert times[1] == times[7] == micros(T0) + 15 * 60 * 1_000_000
    assert times[2] is None and times[5] is None and times[6] is None
    assert times[3] == micros(T0) + 1 and times[11] == micros(T1)
    assert times[4] == times[9] == RELEASE_NOW
    assert times[8] == times[10] == micros(T1)


def test_guarded_a_failing_cast_in_a_release_time_is_an_sql_error(spark):
    """Under ``guard_sql`` a release time that cannot be computed flags the row (it goes to the dead
    letters as ``sql_error``) instead of reading as NULL, "never"; a branch whose guard is not TRUE
    is not evaluated and flags nothing. Without the guard, ANSI mode fails the whole query."""
    from ematix_dagster.spark.plans.safe_sql import guard_sql

    plan = release_plan(f"SELECT id FROM source WHERE (tier = 'delayed' AND CAST(s AS TIMESTAMP) <= {W}) "
                        "OR tier = 'realtime'")
    assert plan is not None
    guarded = guard_sql(plan.sql)
    assert guarded.expressions == ("CAST(s AS TIMESTAMP)",)
    rows = [(1, "delayed", None, None, None, "2024-05-01 12:00:00"), (2, "delayed", None, None, None, "noon"),
            (3, "realtime", None, None, None, "noon"), (4, "delayed", None, None, None, None),
            (5, "other", None, None, None, "noon")]
    _view(spark, rows)
    got = {r["id"]: (r[RELEASE_COLUMN], r[SQL_ERROR]) for r in spark.sql(guarded.sql).collect()}
    assert got == {1: (micros(dt.datetime(2024, 5, 1, 12, tzinfo=UTC)), None), 2: (None, "CAST(s AS TIMESTAMP)"),
                   3: (RELEASE_NOW, None), 4: (None, None), 5: (None, None)}
    with pytest.raises(Exception, match="CAST_INVALID_INPUT"):
        spark.sql(plan.sql).collect()
