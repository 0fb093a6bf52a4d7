"""``sql.parsing``: one statement or a ``PipelineConfigError`` naming the key, and where in a query a
node sits (the place ``guard_sql`` and ``release_plan`` name in their messages)."""

from __future__ import annotations

import pytest
from sqlglot import exp

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.sql.parsing import misplaced, parse_statement, text, top_selects

PLACES = [
    ("SELECT mark() AS a FROM source", ("where",), "in the SELECT list"),
    ("SELECT a FROM source WHERE mark() > 0", ("where",), None),
    ("SELECT a FROM source WHERE mark() > 0", (), "in WHERE"),
    ("SELECT a FROM (SELECT mark() AS a FROM source)", ("expressions",), "in a subquery (in FROM)"),
    ("SELECT a FROM source WHERE a IN (SELECT b FROM t WHERE mark())", ("where",), "in a subquery (in WHERE)"),
    ("SELECT (SELECT max(b) FROM t WHERE mark()) AS a FROM source", ("expressions",), "in a subquery (in the SELECT list)"),
    ("SELECT * FROM (SELECT * FROM (SELECT mark() AS a))", (), "in a subquery (in FROM)"),
    ("WITH c AS (SELECT mark() AS a) SELECT a FROM c", ("expressions",), "in a WITH clause"),
    ("SELECT s.a FROM source s JOIN t ON s.a = mark()", ("where",), "in a JOIN condition"),
    ("SELECT s.a FROM source s JOIN (SELECT mark() AS a) x ON s.a = x.a", ("where",), "in a subquery (in a JOIN)"),
    ("SELECT max(a) AS m FROM source GROUP BY mark()", ("expressions",), "in GROUP BY"),
    ("SELECT a FROM source ORDER BY mark()", ("expressions",), "in ORDER BY"),
    ("SELECT transform(arr, e -> mark(e)) AS a FROM source", ("expressions",), "inside a lambda function"),
]


@pytest.mark.parametrize("sql,allowed,place", PLACES, ids=[p or "allowed" for _, _, p in PLACES])
def test_misplaced(sql, allowed, place):
    tree = parse_statement(sql, "k")
    (node,) = [n for n in tree.walk() if isinstance(n, exp.Anonymous) and n.name == "mark"]
    assert misplaced(node, list(top_selects(tree, "k")), allowed) == place


def test_parse_errors_name_the_key():
    with pytest.raises(PipelineConfigError, match=r"^emit\.sql: holds 2 statements"):
        parse_statement("SELECT 1; SELECT 2", "emit.sql")
    with pytest.raises(PipelineConfigError, match=r"^emit\.sql: is not a query \(it is INSERT\)"):
        list(top_selects(parse_statement("INSERT INTO t SELECT 1", "emit.sql"), "emit.sql"))


def test_casts_stay_ansi_and_functions_stay_as_written():
    tree = parse_statement("SELECT CAST(s AS INT) AS a, parse_json(j) AS b FROM source", "k")
    assert type(tree.find(exp.Cast)) is exp.Cast  # the throwing cast, not sqlglot's Hive TRY_CAST
    assert text(tree) == "SELECT CAST(s AS INT) AS a, PARSE_JSON(j) AS b FROM source"
