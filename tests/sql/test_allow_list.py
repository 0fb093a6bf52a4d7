"""The allow-list walk (``sql.grammar``) over every predicate the contract restricts: the ``[emit] sql``
predicate and a row pipeline's ``WATERMARK_TS()`` WHERE. A fixed corpus of known bypasses, each refused
with its key and the offending text, and ``validate`` exiting 2 on one; then generated predicates, accepted
ones and near-misses holding exactly one forbidden node. The generators keep their own small lists of
columns, literals, operators and functions, written from docs/contract/delayed-windows.md, not from the
grammar module's tables."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.errors import PySparkException

from ematix_dagster.cli import main
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.sql.emit_query import emit_plan
from ematix_dagster.sql.release_plan import release_plan
from ematix_dagster.streaming.release_times import ReleaseTimes, RowFailed
from tests.spec.toml_samples import ROW_TOML, mutated_toml

COLUMNS = ("window_start", "window_end", "user_id", "page")
BOUND = "window_end <= WATERMARK_TS()"


def _emit_sql(predicate: str) -> str:
    return f"SELECT * FROM windows WHERE ({predicate}) AND {BOUND}"


def _row_sql(predicate: str) -> str:
    return f"SELECT user_id, page FROM source WHERE ({predicate}) AND _event_ts <= WATERMARK_TS()"


def _refused(call, sql: str, key: str) -> PipelineConfigError:
    with pytest.raises(PipelineConfigError) as err:
        call(sql)
    assert err.value.key == key and err.value.fix and "does not parse" not in str(err.value), err.value
    return err.value


def _emit(sql: str) -> object:
    return emit_plan(sql, COLUMNS)


def _row(sql: str) -> object:
    return release_plan(sql, "transform.sql")


# (predicate, a piece of the offending node's text the message must quote)
SUBQUERIES = [
    ("EXISTS (SELECT 1 FROM windows WHERE page = 'buy')", "EXISTS(SELECT 1 FROM windows"),
    ("NOT EXISTS (SELECT 1 FROM windows w WHERE w.user_id = user_id)", "EXISTS(SELECT 1 FROM windows"),
    ("user_id IN (SELECT user_id FROM windows)", "IN (SELECT user_id FROM windows)"),
    ("user_id NOT IN (SELECT w.user_id FROM windows AS w WHERE w.page = 'buy')", "IN (SELECT w.user_id"),
    ("user_id > (SELECT 1)", "(SELECT 1)"),
    ("user_id = (SELECT max(w.user_id) FROM windows AS w)", "(SELECT MAX(w.user_id)"),
    ("window_end <= (SELECT min(window_start) FROM other)", "(SELECT MIN(window_start) FROM other)"),
]
BANNED = ["rand()", "rand(7)", "randn()", "uuid()", "shuffle(user_id)", "now()", "current_date()", "current_date",
          "current_timestamp()", "current_timestamp", "current_timezone()", "current_user()", "input_file_name()",
          "monotonically_increasing_id()", "spark_partition_id()", "reflect('java.util.UUID', 'randomUUID')",
          "java_method('java.util.UUID', 'randomUUID')"]
OTHERS = [
    ("my_udf(user_id) > 0", "MY_UDF(user_id)"),  # a UDF, or any function sqlglot does not know
    ("exists(page, x -> x > 1)", "EXISTS(page, x -> x > 1)"),
    ("transform(page, x -> x + 1) IS NULL", "TRANSFORM(page, x -> x + 1)"),
    ("filter(page, x -> x > 1) IS NULL", "FILTER(page, x -> x > 1)"),
    ("row_number() OVER (ORDER BY window_end) > 1", "ROW_NUMBER() OVER (ORDER BY window_end)"),
    ("sum(user_id) OVER (PARTITION BY page) > 1", "SUM(user_id) OVER (PARTITION BY page)"),
    ("count(*) > 1", "COUNT(*)"),
    ("max(user_id) > 1", "MAX(user_id)"),
    ("user_id IN (1, user_id)", "IN (1, user_id)"),
]
CORPUS = SUBQUERIES + [(f"{call} IS NOT NULL", call.split("(")[0].upper()) for call in BANNED] + OTHERS


@pytest.mark.parametrize(("predicate", "quoted"), CORPUS)
def test_a_known_bypass_is_refused_in_emit_sql(predicate: str, quoted: str) -> None:
    error = _refused(_emit, _emit_sql(predicate), "emit.sql")
    assert quoted in str(error), error


@pytest.mark.parametrize(("predicate", "quoted"), CORPUS)
def test_a_known_bypass_is_refused_in_a_row_pipelines_release_where(predicate: str, quoted: str) -> None:
    error = _refused(_row, _row_sql(predicate), "transform.sql")
    assert quoted in str(error), error


@pytest.mark.parametrize("where", [
    "EXISTS (SELECT 1 FROM windows WHERE page = 'buy') AND window_end <= WATERMARK_TS()",
    "window_end <= WATERMARK_TS() OR EXISTS (SELECT 1 FROM windows WHERE page = 'buy')",
    "(SELECT max(user_id) FROM windows) > 3 AND window_end <= WATERMARK_TS()",
])
def test_an_unqualified_subquery_beside_the_bound_is_refused(where: str) -> None:
    error = _refused(_emit, f"SELECT * FROM windows WHERE {where}", "emit.sql")
    assert "subquery" in str(error), error


@pytest.mark.parametrize("clause", ["SORT BY user_id", "DISTRIBUTE BY user_id", "CLUSTER BY user_id",
                                    "ORDER BY user_id", "LIMIT 3", "GROUP BY user_id, page"])
def test_a_clause_outside_the_shape_is_refused(clause: str) -> None:
    error = _refused(_emit, f"SELECT * FROM windows WHERE {BOUND} {clause}", "emit.sql")
    assert "only a WHERE may follow FROM windows" in str(error), error
    error = _refused(_row, f"SELECT user_id, page FROM source WHERE _event_ts <= WATERMARK_TS() {clause}",
                     "transform.sql")
    assert "which is not row by row" in str(error), error


def test_a_row_pipeline_without_watermark_ts_is_an_ordinary_filter() -> None:
    assert release_plan("SELECT id FROM source WHERE id IN (SELECT id FROM source) AND rand() < 0.5") is None


@pytest.mark.parametrize(("section", "sql"), [
    ("emit", "SELECT * FROM windows WHERE EXISTS (SELECT 1 FROM windows WHERE page = 'buy') "
             "AND window_end <= WATERMARK_TS()"),
    ("emit", "SELECT * FROM windows WHERE rand() < 0.5 AND window_end <= WATERMARK_TS()"),
    ("transform", "SELECT user_id, page, _event_ts FROM source WHERE page IN (SELECT page FROM source) "
                  "AND _event_ts <= WATERMARK_TS()"),
    ("transform", "SELECT user_id, page, _event_ts FROM source WHERE uuid() IS NOT NULL AND "
                  "_event_ts <= WATERMARK_TS()"),
])
def test_validate_exits_2(section: str, sql: str, tmp_path, capsys) -> None:
    if section == "emit":
        text = mutated_toml({"emit": {"sql": sql, "max_buffered_rows": 1000}})
    else:
        text = mutated_toml({"transform.sql": sql}, ROW_TOML)
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{section}.sql: " in err and "fix:" in err and "Traceback" not in err, err


# ---- generated predicates -------------------------------------------------------------------------------

_INT_COLUMNS = ["user_id"]
_STAMP_COLUMNS = ["window_start", "window_end"]
_INTS = ["0", "1", "-3", "42", "NULL"]


def _ints(hole: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[str]:
    """Integer expressions; with ``hole``, exactly one of them in each drawn expression."""
    leaf = st.sampled_from(_INT_COLUMNS + _INTS)
    plain = st.recursive(leaf, lambda inner: st.one_of(
        st.builds("({} {} {})".format, inner, st.sampled_from(["+", "-", "*", "%", "DIV"]), inner),
        st.builds("abs({})".format, inner),
        st.builds("(- {})".format, inner),
        st.builds("coalesce({}, {})".format, inner, inner),
        st.builds("greatest({}, {})".format, inner, inner),
        st.builds("hour({})".format, st.sampled_from(_STAMP_COLUMNS)),
        st.builds("length({})".format, st.sampled_from(["page", "lower(page)", "upper(page)"])),
    ), max_leaves=4)
    if hole is None:
        return plain
    return st.recursive(hole, lambda inner: st.one_of(
        st.builds(lambda a, op, b, swap: f"({b} {op} {a})" if swap else f"({a} {op} {b})",
                  inner, st.sampled_from(["+", "-", "*"]), plain, st.booleans()),
        st.builds("abs({})".format, inner),
        st.builds("least({}, {})".format, inner, plain),
    ), max_leaves=3)


def _bools(hole_int: st.SearchStrategy[str] | None = None,
           hole_bool: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[str]:
    """Conditions; with holes, exactly one forbidden node in each drawn condition."""
    stamp = st.one_of(st.sampled_from(_STAMP_COLUMNS + ["TIMESTAMP '2024-01-01 00:00:00'"]),
                      st.builds("({} + INTERVAL {} {})".format, st.sampled_from(_STAMP_COLUMNS), st.integers(0, 90),
                                st.sampled_from(["SECONDS", "MINUTE", "HOURS", "DAY"])))
    ints = _ints()
    cmp = st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">=", "<=>"])
    leaf = st.one_of(
        st.builds("{} {} {}".format, ints, cmp, ints),
        st.builds("{} {} {}".format, stamp, cmp, stamp),
        st.builds("page {} {}".format, cmp, st.sampled_from(["'buy'", "'view'", "NULL"])),
        st.builds("({} IS {}NULL)".format, st.sampled_from(list(COLUMNS)), st.sampled_from(["", "NOT "])),
        st.builds("(user_id {}IN ({}, {}))".format, st.sampled_from(["", "NOT "]), st.integers(-5, 5),
                  st.integers(-5, 5)),
        st.builds("(user_id BETWEEN {} AND {})".format, ints, ints),
        st.sampled_from(["TRUE", "FALSE"]),
    )
    plain = st.recursive(leaf, lambda inner: st.one_of(
        st.builds("({} AND {})".format, inner, inner),
        st.builds("({} OR {})".format, inner, inner),
        st.builds("(NOT {})".format, inner),
        st.builds("(CASE WHEN {} THEN {} ELSE {} END)".format, inner, inner, inner),
    ), max_leaves=4)
    if hole_int is None and hole_bool is None:
        return plain
    holed = []
    if hole_int is not None:
        holed.append(st.builds(lambda a, op, b, swap: f"{b} {op} {a}" if swap else f"{a} {op} {b}",
                               _ints(hole_int), cmp, ints, st.booleans()))
        holed.append(st.builds("(CASE WHEN {} THEN {} ELSE 0 END) > 1".format, plain, _ints(hole_int)))
    if hole_bool is not None:
        holed.append(hole_bool)
    base = st.one_of(*holed)
    return st.recursive(base, lambda inner: st.one_of(
        st.builds(lambda a, b, swap: f"({b} AND {a})" if swap else f"({a} AND {b})", inner, plain, st.booleans()),
        st.builds(lambda a, b, swap: f"({b} OR {a})" if swap else f"({a} OR {b})", inner, plain, st.booleans()),
        st.builds("(NOT {})".format, inner),
        st.builds("(CASE WHEN {} THEN TRUE ELSE {} END)".format, inner, plain),
    ), max_leaves=3)


# one forbidden node each: refused in both places
_FORBIDDEN_INTS = st.sampled_from([
    "rand()", "randn(1)", "length(uuid())", "hour(now())", "hour(current_timestamp())", "dayofweek(current_date)",
    "length(input_file_name())", "monotonically_increasing_id()", "spark_partition_id()",
    "length(reflect('java.util.UUID', 'randomUUID'))", "length(java_method('java.util.UUID', 'randomUUID'))",
    "length(shuffle(page))", "my_udf(user_id)", "count(user_id)", "max(user_id)", "sum(user_id) OVER (PARTITION BY page)",
    "row_number() OVER (ORDER BY window_end)", "(SELECT max(user_id) FROM windows)", "(SELECT 1)",
    "length(transform(page, x -> x + 1))", "aggregate(page, 0, (acc, x) -> acc + x)", "page[0]",
])
_FORBIDDEN_BOOLS = st.sampled_from([
    "EXISTS (SELECT 1 FROM windows WHERE page = 'buy')", "user_id IN (SELECT user_id FROM windows)",
    "exists(page, x -> x > 1)", "(user_id IN (1, user_id))", "(page LIKE 'b%')", "(user_id IS TRUE)",
])
# refused where the engine evaluates the predicate ([emit]) only
_EMIT_ONLY_INTS = st.sampled_from(["clicks", "w.user_id", "CAST(page AS INT)", "to_timestamp(page)"])

_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(_bools())
def test_generated_predicates_are_accepted(predicate: str) -> None:
    assert emit_plan(_emit_sql(predicate), COLUMNS) is not None
    assert release_plan(_row_sql(predicate)) is not None


@_SETTINGS
@given(_bools(_FORBIDDEN_INTS, _FORBIDDEN_BOOLS))
def test_one_forbidden_node_is_refused(predicate: str) -> None:
    _refused(_emit, _emit_sql(predicate), "emit.sql")
    _refused(_row, _row_sql(predicate), "transform.sql")


@_SETTINGS
@given(_bools(_EMIT_ONLY_INTS))
def test_one_node_outside_the_emit_grammar_is_refused_there(predicate: str) -> None:
    _refused(_emit, _emit_sql(predicate), "emit.sql")


def _emitted_rows():
    stamp = pa.timestamp("us", tz="UTC")
    return pa.table({"window_start": pa.array([0, 3_600_000_000, None], stamp),
                     "window_end": pa.array([3_600_000_000, 7_200_000_000, 10], stamp),
                     "user_id": pa.array([1, None, -3], pa.int64()), "page": pa.array(["buy", "view", None])})


@_SETTINGS
@given(_bools())
def test_what_the_walk_accepts_the_engine_evaluates(predicate: str) -> None:
    """Every accepted [emit] predicate is one the driver's evaluator (streaming.release_times) computes: the
    walk accepts nothing the engine would find outside the grammar on the rows."""
    plan = emit_plan(_emit_sql(predicate), COLUMNS)
    try:
        ReleaseTimes(plan.branches, COLUMNS).of(_emitted_rows())
    except RowFailed as failed:  # a value of the rows (an overflow, a zero divisor), not of the grammar
        assert "outside the predicate's grammar" not in str(failed), failed


def test_a_null_operand_makes_a_null_value() -> None:
    stamp = pa.timestamp("us", tz="UTC")
    rows = pa.table({"window_start": pa.array([0, 1], stamp), "window_end": pa.array([5, 6], stamp),
                     "user_id": pa.array([1, 2], pa.int64()), "page": ["a", "b"]})
    plan = emit_plan("SELECT * FROM windows WHERE (CASE WHEN page = 'a' THEN window_end END) + INTERVAL 1 HOUR "
                     "<= WATERMARK_TS()", COLUMNS)
    assert ReleaseTimes(plan.branches, COLUMNS).of(rows).to_pylist() == [3_600_000_005, None]
    plan = emit_plan(f"SELECT * FROM windows WHERE (- coalesce(NULL, NULL)) <= NULL * 42 OR {BOUND}", COLUMNS)
    assert ReleaseTimes(plan.branches, COLUMNS).of(rows).to_pylist() == [5, 6]
    for op in ("%", "DIV", "/"):  # a NULL divisor is NULL, not a zero divisor
        plan = emit_plan(f"SELECT * FROM windows WHERE (user_id {op} NULL) = 1 OR {BOUND}", COLUMNS)
        assert ReleaseTimes(plan.branches, COLUMNS).of(rows).to_pylist() == [5, 6]



# ---- alone or in a batch: the same value ------------------------------------------------------------------

#: a batch of emitted rows (id, window_start, window_end, user_id, page): NULLs in every column, bounds at
#: and around midnight, a zero user_id
_BATCH = [(0, "2024-01-01 00:00:00", "2024-01-01 01:00:00", 1, "buy"),
          (1, "2024-01-01 01:00:00", "2024-01-01 02:00:00", None, "view"),
          (2, None, "2024-01-01 00:00:10", -3, None),
          (3, "2023-12-31 23:59:00", "2024-01-01 00:00:00", 42, "buy"),
          (4, "2024-01-01 00:30:00", None, 0, "b")]
_IDS = [row[0] for row in _BATCH]
_VIEW = "allow_list_batch"


def _stamp(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def batch_view(spark):
    """The batch as a view of the shared session: literal rows, which Spark evaluates on the driver."""
    def stamp(text: str | None) -> str:
        return "CAST(NULL AS TIMESTAMP)" if text is None else f"TIMESTAMP '{text}'"

    rows = ", ".join(f"({i}, {stamp(start)}, {stamp(end)}, CAST({'NULL' if user is None else user} AS BIGINT), "
                     f"CAST({'NULL' if page is None else repr(page)} AS STRING))" for i, start, end, user, page in _BATCH)
    spark.sql(f"CREATE OR REPLACE TEMP VIEW {_VIEW} AS SELECT * FROM VALUES {rows} "
              "AS t(id, window_start, window_end, user_id, page)")
    yield _VIEW
    spark.catalog.dropTempView(_VIEW)


def _values(spark, predicates: list[str], alone: list[int | None]) -> dict[tuple[int | None, int], tuple]:
    """Each predicate's value per row, in one Spark job, keyed by (the row alone or None, the row): over the
    whole batch as ``windows`` (None) and over each row of ``alone`` as the only row of ``windows``."""
    columns = ", ".join(f"({p}) AS p{i}" for i, p in enumerate(predicates))
    branches = [f"SELECT * FROM (WITH windows AS (SELECT * FROM {_VIEW}{'' if i is None else f' WHERE id = {i}'}) "
                f"SELECT {'NULL' if i is None else i} AS alone, id, {columns} FROM windows)" for i in alone]
    return {(row["alone"], row["id"]): tuple(row)[2:] for row in spark.sql(" UNION ALL ".join(branches)).collect()}


def _fails_alone(spark, predicate: str, condition: str | None) -> bool:
    """Whether Spark fails with ``condition`` on the predicate over one row of the batch alone."""
    for i in _IDS:
        try:
            _values(spark, [predicate], [i])
        except PySparkException as failed:
            if failed.getCondition() == condition:
                return True
    return False


def _arrow_batch() -> pa.Table:
    """The batch as the driver's evaluator reads it."""
    stamp = pa.timestamp("us", tz="UTC")
    return pa.table({"window_start": pa.array([_stamp(r[1]) for r in _BATCH], stamp),
                     "window_end": pa.array([_stamp(r[2]) for r in _BATCH], stamp),
                     "user_id": pa.array([r[3] for r in _BATCH], pa.int64()), "page": [r[4] for r in _BATCH]})


def _release_times(times: ReleaseTimes, table: pa.Table) -> list | None:
    """The driver's release times of the rows, None where a row's value fails."""
    try:
        return times.of(table).to_pylist()
    except RowFailed:
        return None


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_bools(), min_size=3, max_size=6))
def test_an_accepted_predicate_has_the_same_value_alone_as_in_a_batch(spark, batch_view, predicates) -> None:
    """Spark's value of each accepted predicate on a row alone is its value on that row in a batch, and so
    is the driver's release time: what the walk accepts reads nothing but the row. A value that fails in the
    batch fails on one of its rows alone."""
    everything = [None, *_IDS]
    try:
        values = _values(spark, predicates, everything)
    except PySparkException:  # a row's value fails (a zero divisor): one predicate at a time
        for predicate in predicates:
            try:
                one = _values(spark, [predicate], everything)
            except PySparkException as failed:
                assert _fails_alone(spark, predicate, failed.getCondition()), (predicate, failed.getCondition())
                continue
            assert all(one[(None, i)] == one[(i, i)] for i in _IDS), (predicate, one)
    else:
        assert all(values[(None, i)] == values[(i, i)] for i in _IDS), (predicates, values)
    table = _arrow_batch()
    for predicate in predicates:
        times = ReleaseTimes(emit_plan(_emit_sql(predicate), COLUMNS).branches, COLUMNS)
        rows = [_release_times(times, table.slice(i, 1)) for i in range(table.num_rows)]
        together = _release_times(times, table)
        if together is None:
            assert None in rows, predicate
        else:
            assert together == [row[0] for row in rows], predicate
