"""``guard_sql`` on real Spark (ANSI mode): each rewrite keeps clean rows as the original query
returns them, flags the rows the original fails on (proved by running it on each of them), and
does not flag a NULL input or a branch Spark would not evaluate."""

from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from ematix_dagster.columns import SOURCE_ROW, SQL_ERROR
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spark.plans.safe_sql import GuardedSql, SourceRow, guard_sql

SCHEMA = ("id INT, s STRING, t STRING, a BIGINT, b BIGINT, i INT, x DOUBLE, dec DECIMAL(38,0), d DATE, ts TIMESTAMP, "
          "arr ARRAY<INT>, m MAP<STRING,INT>, bin BINARY")
COLUMNS = [c.split()[0] for c in SCHEMA.split(", ")]
MAX, MIN = 2**63 - 1, -2**63
KEY = "0000111122223333"
HELLO = bytes.fromhex("CED6D2C3BC47030E557B33717536FC93")  # aes_encrypt('hello', KEY, 'ECB')
DAY = dt.date(2021, 3, 4)
NOON = dt.datetime(2021, 3, 4, 12, 0)
EXCLUDED_RULES = "spark.sql.optimizer.excludedRules"


@dataclass
class Case:
    """A query over ``source``; ``bad`` rows fail it under ANSI mode with ``error`` and are flagged ``text``."""

    name: str
    sql: str
    clean: list[dict[str, Any]]
    bad: list[tuple[dict[str, Any], str, str]] = field(default_factory=list)  # (row, flagged text, Spark error)


def one(name: str, expr: str, clean: list[dict[str, Any]], bad: Sequence[dict[str, Any]] = (), error: str = "",
        text: str | None = None) -> Case:
    """A case of one guarded expression, flagged as ``text`` (default: ``expr`` as written)."""
    return Case(name, f"SELECT id, {expr} AS v FROM source", clean, [(row, text or expr, error) for row in bad])


CASES = [
    # CAST and the cast functions -> TRY_CAST
    one("cast", "CAST(s AS BIGINT)", [{"s": "12"}, {"s": " -7 "}], [{"s": "abc"}, {"s": "1.5e99"}],
        "CAST_INVALID_INPUT"),
    one("cast-colon", "s::int", [{"s": "12"}], [{"s": "3000000000"}], "CAST_INVALID_INPUT", "CAST(s AS INT)"),
    one("cast-overflow", "CAST(a AS INT)", [{"a": 5}], [{"a": 2**40}], "CAST_OVERFLOW"),
    one("cast-date", "CAST(s AS DATE)", [{"s": "2021-02-28"}], [{"s": "2021-02-30"}], "CAST_INVALID_INPUT"),
    one("cast-timestamp", "CAST(s AS TIMESTAMP)", [{"s": "2021-02-28 10:00:00"}], [{"s": "noon"}],
        "CAST_INVALID_INPUT"),
    one("cast-decimal", "CAST(s AS DECIMAL(5, 2))", [{"s": "123.45"}], [{"s": "12345.6"}],
        "NUMERIC_VALUE_OUT_OF_RANGE"),
    one("cast-boolean", "CAST(s AS BOOLEAN)", [{"s": "true"}], [{"s": "maybe"}], "CAST_INVALID_INPUT"),
    one("int()", "int(s)", [{"s": "12"}], [{"s": "x"}], "CAST_INVALID_INPUT", "INT(s)"),
    one("smallint()", "smallint(s)", [{"s": "12"}], [{"s": "40000"}], "CAST_INVALID_INPUT", "SMALLINT(s)"),
    one("double()", "double(s)", [{"s": "1.5"}], [{"s": "x"}], "CAST_INVALID_INPUT", "DOUBLE(s)"),
    one("decimal()", "decimal(s)", [{"s": "12"}], [{"s": "x"}], "CAST_INVALID_INPUT", "DECIMAL(s)"),
    one("date()", "date(s)", [{"s": "2021-01-02"}], [{"s": "x"}], "CAST_INVALID_INPUT", "DATE(s)"),
    one("timestamp()", "timestamp(s)", [{"s": "2021-01-02 03:04:05"}], [{"s": "x"}], "CAST_INVALID_INPUT",
        "TIMESTAMP(s)"),
    one("boolean()", "boolean(s)", [{"s": "false"}], [{"s": "x"}], "CAST_INVALID_INPUT", "BOOLEAN(s)"),
    # arithmetic -> try_add / try_subtract / try_multiply / try_divide / try_mod
    one("add", "a + b", [{"a": 1, "b": 2}, {"a": MAX, "b": -1}], [{"a": MAX, "b": 1}], "ARITHMETIC_OVERFLOW"),
    one("subtract", "a - b", [{"a": 1, "b": 2}], [{"a": MIN, "b": 1}], "ARITHMETIC_OVERFLOW"),
    one("multiply", "a * b", [{"a": 3, "b": -2}], [{"a": 2**62, "b": 4}], "ARITHMETIC_OVERFLOW"),
    one("int-add", "i + 1", [{"i": 1}], [{"i": 2**31 - 1}], "ARITHMETIC_OVERFLOW"),
    one("decimal-multiply", "dec * 10", [{"dec": Decimal(12)}], [{"dec": Decimal(10**37)}],
        "NUMERIC_VALUE_OUT_OF_RANGE"),
    one("divide", "a / b", [{"a": 7, "b": 2}], [{"a": 7, "b": 0}], "DIVIDE_BY_ZERO"),
    one("double-divide", "x / b", [{"x": 1.5, "b": 2}], [{"x": 1.5, "b": 0}], "DIVIDE_BY_ZERO"),
    one("remainder", "a % b", [{"a": 7, "b": 2}, {"a": -7, "b": 2}], [{"a": 7, "b": 0}], "REMAINDER_BY_ZERO"),
    one("mod", "mod(a, b)", [{"a": 7, "b": 2}], [{"a": 7, "b": 0}], "REMAINDER_BY_ZERO", "MOD(a, b)"),
    one("div", "a DIV b", [{"a": 7, "b": 2}, {"a": -7, "b": 2}], [{"a": 7, "b": 0}], "DIVIDE_BY_ZERO"),
    one("pmod", "pmod(a, b)", [{"a": -7, "b": 2}], [{"a": 7, "b": 0}], "REMAINDER_BY_ZERO", "PMOD(a, b)"),
    one("string-add", "s + 1", [{"s": "41"}], [{"s": "x"}], "CAST_INVALID_INPUT"),  # implicit cast, inside try_add
    # +/- on dates, timestamps and intervals: try_add / try_subtract take them as the operators do
    Case("datetime-arithmetic", "SELECT id, d + i AS d1, d - i AS d2, d + INTERVAL 1 MONTH AS d3, "
         "ts + INTERVAL 1 DAY AS t1, ts - INTERVAL '2' HOUR AS t2, d - DATE'2020-01-01' AS dd, ts - ts AS tt, "
         "INTERVAL 3 DAY * i AS di, INTERVAL 3 DAY / i AS dv FROM source",
         [{"d": DAY, "ts": NOON, "i": 2}]),
    one("timestamp-overflow", "ts + make_interval(i)", [{"ts": NOON, "i": 1}], [{"ts": NOON, "i": 300_000}],
        "ArithmeticException: long overflow", "ts + MAKE_INTERVAL(i)"),
    # functions with a try_ twin
    one("to_timestamp", "to_timestamp(s)", [{"s": "2021-01-02 03:04:05"}], [{"s": "abc"}], "CAST_INVALID_INPUT",
        "TO_TIMESTAMP(s)"),
    one("to_timestamp-format", "to_timestamp(s, 'yyyy-MM-dd HH:mm')", [{"s": "2021-01-02 03:04"}],
        [{"s": "2021-13-01 00:00"}], "CANNOT_PARSE_TIMESTAMP", "TO_TIMESTAMP(s, 'yyyy-MM-dd HH:mm')"),
    one("to_date", "to_date(s)", [{"s": "2021-01-02"}], [{"s": "abc"}], "CAST_INVALID_INPUT", "TO_DATE(s)"),
    one("to_date-format", "to_date(s, 'dd/MM/yyyy')", [{"s": "28/02/2021"}], [{"s": "31/02/2021"}],
        "CANNOT_PARSE_TIMESTAMP", "TO_DATE(s, 'dd/MM/yyyy')"),
    one("to_date-timestamp", "to_date(ts)", [{"ts": NOON}], text="TO_DATE(ts)"),
    one("to_number", "to_number(s, '999.99')", [{"s": "12.5"}], [{"s": "abc"}], "INVALID_FORMAT",
        "TO_NUMBER(s, '999.99')"),
    one("to_binary", "to_binary(s, 'hex')", [{"s": "0AFF"}], [{"s": "zz"}], "CONVERSION_INVALID_INPUT",
        "TO_BINARY(s, 'hex')"),
    one("url_decode", "url_decode(s)", [{"s": "a%20b"}], [{"s": "%zz"}], "CANNOT_DECODE_URL", "URL_DECODE(s)"),
    one("parse_url", "parse_url(s, 'QUERY')", [{"s": "http://h/p?q=1"}, {"s": "http://h/p"}, {"s": "mailto:x@y"}],
        [{"s": "http://a b/"}, {"s": "http://h/%zz"}], "INVALID_URL", "PARSE_URL(s, 'QUERY')"),
    one("parse_url-key", "parse_url(s, 'QUERY', 'k')", [{"s": "http://h/p?k=1"}, {"s": "http://h/p?z=1"}],
        [{"s": "http://a b/?k=1"}], "INVALID_URL", "PARSE_URL(s, 'QUERY', 'k')"),
    one("parse_json", "to_json(parse_json(s))", [{"s": '{"a": 1}'}, {"s": "null"}], [{"s": "{"}],
        "MALFORMED_RECORD_IN_PARSING", "PARSE_JSON(s)"),
    one("variant_get", "variant_get(parse_json(s), '$.a', 'int')",
        [{"s": '{"a": 1}'}, {"s": '{"b": 1}'}, {"s": '{"a": null}'}], [{"s": '{"a": "x"}'}], "INVALID_VARIANT_CAST",
        "VARIANT_GET(PARSE_JSON(s), '$.a', 'int')"),
    one("variant_insert", "to_json(variant_insert(parse_json(s), '$.a', 1))", [{"s": '{"b": 2}'}],
        [{"s": '{"a": 2}'}], "VARIANT_DUPLICATE_KEY", "VARIANT_INSERT(PARSE_JSON(s), '$.a', 1)"),
    one("variant_set", "to_json(variant_set(parse_json(s), '$.a.b', 1))", [{"s": '{"a": {"b": 2}}'}],
        [{"s": '{"a": 2}'}], "VARIANT_PATH_TYPE_MISMATCH", "VARIANT_SET(PARSE_JSON(s), '$.a.b', 1)"),
    one("variant_array_append", "to_json(variant_array_append(parse_json(s), '$.a', 1))",
        [{"s": '{"a": [0]}'}, {"s": '{"b": 2}'}], [{"s": '{"a": 2}'}], "VARIANT_PATH_TYPE_MISMATCH",
        "VARIANT_ARRAY_APPEND(PARSE_JSON(s), '$.a', 1)"),
    one("make_timestamp", "make_timestamp(2021, i, 1, 0, 0, 0)", [{"i": 12}], [{"i": 13}],
        "DATETIME_FIELD_OUT_OF_BOUNDS", "MAKE_TIMESTAMP(2021, i, 1, 0, 0, 0)"),
    one("make_timestamp_ntz", "make_timestamp_ntz(2021, 2, i, 0, 0, 0)", [{"i": 28}], [{"i": 30}],
        "DATETIME_FIELD_OUT_OF_BOUNDS", "MAKE_TIMESTAMP_NTZ(2021, 2, i, 0, 0, 0)"),
    one("make_timestamp_ltz", "make_timestamp_ltz(2021, 1, 1, i, 0, 0)", [{"i": 23}], [{"i": 25}],
        "DATETIME_FIELD_OUT_OF_BOUNDS", "MAKE_TIMESTAMP_LTZ(2021, 1, 1, i, 0, 0)"),
    one("make_interval", "CAST(make_interval(i, 1) AS STRING)", [{"i": 2}], [{"i": 2**31 - 1}],
        "ARITHMETIC_OVERFLOW", "MAKE_INTERVAL(i, 1)"),
    one("validate_utf8", "validate_utf8(CAST(bin AS STRING))", [{"bin": b"ok"}], [{"bin": b"\xff"}],
        "INVALID_UTF8_STRING", "VALIDATE_UTF8(CAST(bin AS STRING))"),
    one("aes_decrypt", f"CAST(aes_decrypt(bin, '{KEY}', 'ECB') AS STRING)", [{"bin": HELLO}], [{"bin": b"\x00"}],
        "AES_CRYPTO_ERROR", f"AES_DECRYPT(bin, '{KEY}', 'ECB')"),
    # element_at and [] on arrays: an index out of range (a NULL element is not a failure); maps never throw
    one("element_at", "element_at(arr, i)", [{"arr": [1, None, 3], "i": 2}, {"arr": [1, None, 3], "i": -1}],
        [{"arr": [1], "i": 5}, {"arr": [1], "i": -2}], "INVALID_ARRAY_INDEX_IN_ELEMENT_AT", "ELEMENT_AT(arr, i)"),
    one("element_at-zero", "element_at(arr, i)", [], [{"arr": [1], "i": 0}], "INVALID_INDEX_OF_ZERO",
        "ELEMENT_AT(arr, i)"),
    one("element_at-map", "element_at(m, s)", [{"m": {"k": 1}, "s": "k"}, {"m": {"k": 1}, "s": "zz"}]),
    one("subscript", "arr[i]", [{"arr": [1, None, 3], "i": 1}, {"arr": [1, None, 3], "i": 2}],
        [{"arr": [1, None, 3], "i": 3}, {"arr": [1], "i": -1}], "INVALID_ARRAY_INDEX"),
    one("subscript-split", "split(s, ',')[1]", [{"s": "a,b"}], [{"s": "a"}], "INVALID_ARRAY_INDEX",
        "SPLIT(s, ',')[1]"),
    one("subscript-map", "m[s] + m['k']", [{"m": {"k": 1}, "s": "k"}, {"m": {"k": 1}, "s": "zz"}]),
    # a branch Spark does not evaluate does not count
    one("case", "CASE WHEN s RLIKE '^-?[0-9]+$' THEN CAST(s AS INT) ELSE -1 END", [{"s": "12"}, {"s": "n/a"}],
        [{"s": "99999999999"}], "CAST_INVALID_INPUT", "CAST(s AS INT)"),
    one("case-operand", "CASE s WHEN 'n/a' THEN NULL ELSE CAST(s AS INT) END", [{"s": "n/a"}, {"s": "5"}],
        [{"s": "x"}], "CAST_INVALID_INPUT", "CAST(s AS INT)"),
    one("if", "IF(s RLIKE '^[0-9]+$', CAST(s AS INT), CAST(t AS INT))", [{"s": "5", "t": "x"}, {"s": "x", "t": "6"}],
        [{"s": "x", "t": "y"}], "CAST_INVALID_INPUT", "CAST(t AS INT)"),
    one("coalesce", "COALESCE(TRY_CAST(s AS INT), CAST(t AS INT))", [{"s": "5", "t": "x"}, {"s": "x", "t": "6"}],
        [{"s": "x", "t": "y"}], "CAST_INVALID_INPUT", "CAST(t AS INT)"),
    one("nvl2", "nvl2(s, CAST(s AS INT), CAST(t AS INT))", [{"s": "5", "t": "x"}, {"t": "6"}],
        [{"s": "x", "t": "1"}], "CAST_INVALID_INPUT", "CAST(s AS INT)"),
    one("and", "s RLIKE '^[0-9]+$' AND CAST(s AS INT) > 3", [{"s": "5"}, {"s": "x"}], [{"s": "99999999999"}],
        "CAST_INVALID_INPUT", "CAST(s AS INT)"),
    one("or", "s IS NULL OR CAST(s AS INT) > 3", [{"s": "5"}], [{"s": "x"}], "CAST_INVALID_INPUT", "CAST(s AS INT)"),
    # nested: the innermost failure is named (the outer expression then has a NULL input)
    Case("nested", "SELECT id, CAST(s AS INT) * 2 + a AS v FROM source", [{"s": "5", "a": 1}],
         [({"s": "x", "a": 1}, "CAST(s AS INT)", "CAST_INVALID_INPUT"),
          ({"s": "2000000000", "a": 1}, "CAST(s AS INT) * 2", "ARITHMETIC_OVERFLOW"),
          ({"s": "1", "a": MAX}, "CAST(s AS INT) * 2 + a", "ARITHMETIC_OVERFLOW")]),
    # the first failure in evaluation order: the WHERE, then the SELECT list left to right
    Case("order", "SELECT id, CAST(s AS INT) AS v, a / b AS w FROM source WHERE CAST(t AS INT) >= 0",
         [{"s": "1", "t": "0", "a": 1, "b": 1}, {"s": "x", "t": "-1", "b": 0}],
         [({"s": "x", "t": "x", "a": 1, "b": 0}, "CAST(t AS INT)", "CAST_INVALID_INPUT"),
          ({"s": "x", "t": "1", "a": 1, "b": 0}, "CAST(s AS INT)", "CAST_INVALID_INPUT"),
          ({"s": "1", "t": "1", "a": 1, "b": 0}, "a / b", "DIVIDE_BY_ZERO")]),
    # WHERE: a row the condition fails on is kept (and flagged), not filtered out
    Case("where", "SELECT id, s FROM source WHERE CAST(s AS INT) > 3", [{"s": "5"}, {"s": "1"}],
         [({"s": "x"}, "CAST(s AS INT)", "CAST_INVALID_INPUT")]),
    Case("where-guarded", "SELECT id FROM source WHERE s RLIKE '^[0-9]+$' AND CAST(s AS INT) > 3",
         [{"s": "5"}, {"s": "1"}, {"s": "x"}], [({"s": "99999999999"}, "CAST(s AS INT)", "CAST_INVALID_INPUT")]),
    # SELECT *: the flag comes after every column
    Case("star", "SELECT *, CAST(s AS INT) AS v FROM source WHERE a / b > 0", [{"s": "1", "a": 1, "b": 1}],
         [({"s": "1", "a": 1, "b": 0}, "a / b", "DIVIDE_BY_ZERO"),
          ({"s": "x", "a": 1, "b": 1}, "CAST(s AS INT)", "CAST_INVALID_INPUT")]),
    # a later SELECT item may name an earlier one (lateral column alias)
    Case("lateral-alias", "SELECT id, CAST(s AS INT) AS v, v * 1000 AS w FROM source", [{"s": "5"}],
         [({"s": "x"}, "CAST(s AS INT)", "CAST_INVALID_INPUT"),
          ({"s": "2000000000"}, "v * 1000", "ARITHMETIC_OVERFLOW")]),
    Case("union-all", "SELECT id, CAST(s AS INT) AS v FROM source WHERE id > 0 "
         "UNION ALL SELECT -id AS id, CAST(t AS INT) AS v FROM source",
         [{"s": "1", "t": "2"}],
         [({"s": "x", "t": "2"}, "CAST(s AS INT)", "CAST_INVALID_INPUT")]),
    Case("join", "SELECT s.id, CAST(s.s AS INT) + l.n AS v FROM source s JOIN (SELECT 1 AS n) l ON s.i = l.n",
         [{"s": "5", "i": 1}, {"s": "x", "i": 2}], [({"s": "x", "i": 1}, "CAST(s.s AS INT)", "CAST_INVALID_INPUT")]),
]


@pytest.fixture(scope="module", autouse=True)
def evaluated_in_tasks(spark) -> Iterator[None]:
    """Every query of this module runs as Spark tasks, as a pipeline's batch does: over the local
    relation ``_rows`` makes, Spark's optimizer would otherwise evaluate a SELECT on the driver."""
    before = spark.conf.get(EXCLUDED_RULES, None)
    spark.conf.set(EXCLUDED_RULES, "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation")
    yield
    if before is None:
        spark.conf.unset(EXCLUDED_RULES)
    else:
        spark.conf.set(EXCLUDED_RULES, before)


@functools.cache  # parsed by the session's JVM: once, not for each of the module's ~220 views
def _arrow_schema() -> pa.Schema:
    return to_arrow_schema(T.StructType.fromDDL(SCHEMA), timezone="UTC")


def _rows(spark, rows: list[dict[str, Any]]):
    """The view ``source`` of ``rows``, built through Arrow: a query over it runs in a third of the time
    one over a DataFrame of Python rows (an RDD of pickled rows) takes."""
    table = pa.Table.from_pylist([{c: row.get(c) for c in COLUMNS} for row in rows], schema=_arrow_schema())
    spark.createDataFrame(table).createOrReplaceTempView("source")


def test_ansi_mode_is_on(spark):
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_guard(spark, case: Case):
    guarded = guard_sql(case.sql)
    null = {c: None for c in COLUMNS if c != "id"}
    clean = [{**row, "id": n} for n, row in enumerate([*case.clean, null], start=1)]
    bad = [({**row, "id": n}, text, error) for n, (row, text, error) in enumerate(case.bad, start=len(clean) + 1)]

    _rows(spark, clean)  # clean rows (and one of NULLs) come out as the original query returns them
    want, out = spark.sql(case.sql), spark.sql(guarded.sql)
    assert [(f.name, f.dataType) for f in out.schema.fields] == \
        [(f.name, f.dataType) for f in want.schema.fields] + [(SQL_ERROR, T.StringType())]
    # both queries in one job (a UNION ALL evaluates each side on its own), told apart by a last column
    both = out.select("*", F.lit(0).alias("side")).union(
        want.select("*", F.lit(None).cast("string"), F.lit(1).alias("side"))).collect()
    assert sorted(repr(tuple(row)[:-1]) for row in both if row[-1] == 0) == \
        sorted(repr(tuple(row)[:-1]) for row in both if row[-1] == 1)

    _rows(spark, clean + [row for row, _, _ in bad])
    got = {r["id"]: r[SQL_ERROR] for r in spark.sql(guarded.sql).collect()}
    for row, text, _ in bad:
        assert got[row["id"]] == text, f"row {row} is kept and flagged with its first failing expression"
    assert {text for _, text, _ in bad} <= set(guarded.expressions)

    for row, _, error in bad:  # the guard is needed: the original query fails on each bad row
        _rows(spark, [row])
        with pytest.raises(Exception) as failure:
            spark.sql(case.sql).collect()
        assert error in str(failure.value), row


def test_expressions_in_evaluation_order_and_the_sql_stays_as_written():
    guarded = guard_sql("SELECT CAST(a AS INT) + 1 AS x, element_at(arr, 2) AS y FROM source WHERE b / c > 0")
    assert guarded == GuardedSql(guarded.sql, ("b / c", "CAST(a AS INT)", "CAST(a AS INT) + 1", "ELEMENT_AT(arr, 2)"))
    assert guarded.sql.startswith("SELECT TRY_ADD(TRY_CAST(a AS INT), 1) AS x, TRY_ELEMENT_AT(arr, ")
    assert " FROM source WHERE (TRY_DIVIDE(b, c) > 0) OR (" in guarded.sql


def test_nothing_to_guard_still_adds_the_column(spark):
    """The user's own try_ forms, casts to STRING, map lookups and expressions over literals alone
    (they fail on every row or none: a spec error, not a bad row) are left as written."""
    sql = ("SELECT TRY_CAST(s AS INT) AS a, CAST(i AS STRING) AS b, m['k'] AS c, 1L + 2 AS d, try_to_date(s) AS e "
           "FROM source")
    guarded = guard_sql(sql)
    assert guarded.expressions == ()
    assert guarded.sql == ("SELECT TRY_CAST(s AS INT) AS a, CAST(i AS STRING) AS b, m['k'] AS c, "
                           "CAST(1 AS BIGINT) + 2 AS d, TRY_TO_DATE(s) AS e, CAST(NULL AS STRING) AS _sql_error "
                           "FROM source")
    _rows(spark, [{"id": 1, "s": "x", "i": 1, "m": {"k": 2}}])
    assert spark.sql(guarded.sql).collect()[0].asDict() == {"a": None, "b": "1", "c": 2, "d": 3, "e": None,
                                                            SQL_ERROR: None}


def test_a_failed_row_carries_the_row_as_read(spark):
    """With ``source_row`` the value that failed ('abc', NULL after TRY_CAST) is in ``_source_row``, with
    every column of the view (NULLs too) under any alias; a clean row carries nothing (or, with
    ``every_row``, itself); a SELECT that reads the view only through a subquery carries NULL."""
    _rows(spark, [{"id": 1, "s": "abc", "a": 7}, {"id": 2, "s": "12"}])
    sql = "SELECT q.id, CAST(q.s AS BIGINT) AS v FROM source AS q"
    got = {r["id"]: r for r in spark.sql(guard_sql(sql, SourceRow("source")).sql).collect()}
    assert got[1]["v"] is None and got[1][SQL_ERROR] == "CAST(q.s AS BIGINT)"
    row = json.loads(got[1][SOURCE_ROW])
    assert list(row) == COLUMNS and (row["id"], row["s"], row["a"], row["t"]) == (1, "abc", 7, None)
    assert got[2][SOURCE_ROW] is None
    every = {r["id"]: r[SOURCE_ROW] for r in spark.sql(guard_sql(sql, SourceRow("source", every_row=True)).sql).collect()}
    assert json.loads(every[2])["s"] == "12"
    nested = "SELECT CAST(s AS BIGINT) AS v FROM (SELECT s FROM source) WHERE TRUE"
    with pytest.raises(PipelineConfigError):  # a failing expression must read the view directly
        guard_sql("SELECT v FROM (SELECT CAST(s AS BIGINT) AS v FROM source)", SourceRow("source"))
    assert [r[SOURCE_ROW] for r in spark.sql(guard_sql(nested, SourceRow("source")).sql).collect()] == [None, None]


REFUSED = [
    ("SELECT FROM WHERE (", "does not parse"),
    ("SELECT 'abc FROM source", "does not parse"),
    ("SELECT 1 AS a FROM source; SELECT 2 AS a FROM source", "holds 2 statements"),
    ("INSERT INTO t SELECT * FROM source", "is not a query"),
    ("SELECT id, 1 AS _sql_error FROM source", "names _sql_error"),
    ("SELECT * FROM source WHERE _SQL_ERROR IS NULL", "names _sql_error"),
    ("SELECT id, 1 AS _source_row FROM source", "names _source_row"),
    ("SELECT * FROM (SELECT CAST(s AS INT) AS v FROM source)", "CAST(s AS INT) in a subquery"),
    ("SELECT * FROM source WHERE id IN (SELECT CAST(s AS INT) FROM source)", "in a subquery"),
    ("WITH t AS (SELECT a + b AS v FROM source) SELECT * FROM t", "a + b in a WITH clause"),
    ("SELECT source.* FROM source JOIN lookup ON CAST(source.s AS INT) = lookup.id", "in a JOIN condition"),
    ("SELECT transform(arr, e -> CAST(e AS INT)) AS v FROM source", "inside a lambda function"),
    ("SELECT max(id) AS id FROM source GROUP BY CAST(s AS INT)", "in GROUP BY"),
]


@pytest.mark.parametrize("sql,words", REFUSED, ids=[w for _, w in REFUSED])
def test_refused(sql, words):
    with pytest.raises(PipelineConfigError) as err:
        guard_sql(sql)
    assert err.value.key == "transform.sql"
    assert words in str(err.value)
