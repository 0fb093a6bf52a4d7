"""What every reader of a pipeline's SQL shares: the dialect, parsing one statement, and where in
the query a node sits.

The SQL is parsed once, by sqlglot, as Spark 4 runs it with ANSI mode on (:class:`AnsiSpark`), and
printed back in that dialect, so a query rewritten here (``release``) or there (``spark.plans.safe_sql``)
reads the same when the next step parses it again. Every problem is a ``PipelineConfigError`` that
names the key the SQL came from (``transform.sql``, ``emit.sql``).

>>> tree = parse_statement("SELECT a FROM source WHERE b > 0 GROUP BY a", "transform.sql")
>>> [text(s) for s in top_selects(tree, "transform.sql")]
['SELECT a FROM source WHERE b > 0 GROUP BY a']
>>> misplaced(tree.find(exp.GT), list(top_selects(tree, "transform.sql")), ("where",)) is None
True
>>> misplaced(tree.args["group"].expressions[0], [tree], ("where",))
'in GROUP BY'
"""

from __future__ import annotations

from typing import ClassVar, Iterator, cast

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ParseError, TokenError
from sqlglot.parsers.spark import SparkParser  # Spark.Parser, by the name its type checker can follow

from ematix_dagster.errors import PipelineConfigError


class AnsiSpark(Spark):
    """Spark SQL read as Spark 4 runs it with ANSI mode on.

    sqlglot's Spark dialect reads ``CAST`` as Hive's NULL-on-failure cast and turns functions into
    its portable forms, some of which print differently (``PARSE_JSON(j)`` prints as ``j``). Here
    ``CAST`` is the throwing cast and every function stays the call the user wrote.
    """

    class Parser(SparkParser):
        STRICT_CAST = True
        FUNCTIONS: ClassVar[dict] = {}


#: The names of a SELECT's clauses (sqlglot's argument keys) in messages.
CLAUSES = {"expressions": "the SELECT list", "where": "WHERE", "from_": "FROM", "joins": "a JOIN condition",
           "group": "GROUP BY", "having": "HAVING", "order": "ORDER BY", "laterals": "LATERAL VIEW",
           "qualify": "QUALIFY", "windows": "WINDOW", "limit": "LIMIT", "offset": "OFFSET"}


def parse_statement(sql: str, key: str) -> exp.Expr:
    """The one statement ``sql`` holds; a ``PipelineConfigError`` on ``key`` if it does not parse or holds
    more or fewer than one."""
    try:
        statements = [s for s in sqlglot.parse(sql, dialect=AnsiSpark) if s is not None]
    except ParseError as exc:
        e = exc.errors[0]
        raise PipelineConfigError(key, f"does not parse: {e['description']} at line {e['line']}, column {e['col']} "
                                  f"(near {e['highlight']!r})", "fix the SQL (Spark SQL syntax)") from None
    except TokenError as exc:
        raise PipelineConfigError(key, f"does not parse: {exc}", "fix the SQL (Spark SQL syntax)") from None
    if len(statements) != 1:
        raise PipelineConfigError(key, f"holds {len(statements)} statements", "write one SELECT over the view 'source'")
    return statements[0]


def top_selects(node: exp.Expr, key: str) -> Iterator[exp.Select]:
    """The SELECTs whose rows are the output: the query, or each branch of its UNION ALL."""
    if isinstance(node, exp.Select):
        yield node
    elif isinstance(node, exp.SetOperation):
        yield from top_selects(node.left, key)
        yield from top_selects(node.right, key)
    elif isinstance(node, exp.Subquery):
        yield from top_selects(node.this, key)
    else:
        raise PipelineConfigError(key, f"is not a query (it is {type(node).__name__.upper()})",
                                  "write one SELECT over the view 'source'")


def misplaced(node: exp.Expr, tops: list[exp.Select], allowed: tuple[str, ...]) -> str | None:
    """Where ``node`` is (``"in GROUP BY"``, ``"in a subquery (in FROM)"``, ...), or None when it is
    directly in one of the ``allowed`` clauses (argument keys: ``"expressions"``, ``"where"``) of a top
    SELECT. A subquery is placed by the clause of the outer query that holds it."""
    child, parent = node, node.parent
    while parent is not None:
        if any(parent is top for top in tops):
            key = cast(str, child.arg_key)  # set: child has a parent
            if key in allowed:
                return None
            if key == "joins" and not _within(node, child.args.get("on")):
                return "in a JOIN"  # the joined table, not the condition
            return f"in {CLAUSES.get(key, key.upper())}"
        if isinstance(parent, exp.Lambda):
            return "inside a lambda function"
        if isinstance(parent, (exp.Select, exp.Subquery)):
            if parent.find_ancestor(exp.CTE):
                return "in a WITH clause"
            outer = cast(str, misplaced(parent, tops, ()))  # a str: nothing is allowed
            return outer if outer.startswith(("in a subquery", "in a WITH", "inside")) else f"in a subquery ({outer})"
        child, parent = parent, parent.parent
    return "outside the SELECT lists and WHERE clauses"


def _within(node: exp.Expr, root: exp.Expr | None) -> bool:
    """Whether ``node`` is ``root`` or inside it."""
    current: exp.Expr | None = node
    while current is not None and current is not root:
        current = current.parent
    return root is not None and current is root


def text(node: exp.Expr) -> str:
    """``node`` as Spark SQL, the way the next parse reads it."""
    return node.sql(dialect=AnsiSpark)
