"""Read a ``WATERMARK_TS()`` filter into a release plan, and the query Spark runs instead
(docs/contract/row-pipelines.md).

``WHERE t + INTERVAL 15 MINUTES <= WATERMARK_TS()`` does not filter: the watermark only grows, so a
row that fails it now passes it later. The engine keeps such a row until the watermark reaches its
*release time* and writes it then. That time is a value of the row alone, computed once, when the
row arrives: the WHERE is read here, at load time, into OR branches, each a *guard* (its static
conditions) and at most one upper bound ``expr <= WATERMARK_TS()``; the row's release time is the
least ``expr`` over the branches whose guard is TRUE (SQL's OR is true as soon as one branch is).

The query Spark runs is the same query without its WHERE (no row is filtered in Spark by it) and
with one column appended, :data:`RELEASE_COLUMN`: the release time in µs since the epoch,
:data:`RELEASE_NOW` for "in this batch, whatever the watermark", NULL for "never". A strict bound
(``<``) releases once the watermark is past ``expr``, so its time is ``expr`` + 1 µs. Spark's
``least()`` skips NULLs, and ``CASE WHEN guard`` is NULL where the guard is not TRUE (FALSE or
NULL), so a branch that does not apply, or whose ``expr`` is NULL, never decides the minimum.

>>> plan = release_plan("SELECT id, t FROM source "
...                     "WHERE (tier = 'delayed' AND t + INTERVAL 15 MINUTES <= WATERMARK_TS()) OR tier = 'realtime'")
>>> plan.branches  # doctest: +NORMALIZE_WHITESPACE
(ReleaseBranch(guard="tier = 'delayed'", release_at="t + INTERVAL '15' MINUTES", strict=False),
 ReleaseBranch(guard="tier = 'realtime'", release_at=None, strict=False))
>>> print(plan.sql)  # doctest: +NORMALIZE_WHITESPACE
SELECT id, t, LEAST(CASE WHEN tier = 'delayed' THEN UNIX_MICROS(t + INTERVAL '15' MINUTES) END,
                    CASE WHEN tier = 'realtime' THEN -9223372036854775808 END) AS _release_us FROM source

Why the rules are what they are: an upper bound is the only use of a growing value that means
"wait" (a lower bound is true at first and false for good later: the row could never wait for it);
one per branch, because a row has one release time per branch; alone on its side, so ``expr`` is a
value of the row and not an equation to solve; only in the top-level WHERE of a single SELECT,
because elsewhere (the SELECT list, a subquery, a JOIN, GROUP BY, a UNION branch) it would change a
value or a row set instead of a row's release. For the same reason the query must be row by row:
no DISTINCT, GROUP BY, HAVING, ORDER BY, LIMIT, window functions (their rows would no longer be
the filtered ones): the SELECT holds only a SELECT list, FROM, JOINs, LATERAL VIEWs, WITH and the
WHERE. The WHERE itself, guards and bounds, is held to the predicate grammar (``sql.grammar``, in its
Spark-evaluated form): a release time is a value of the row alone, so no subquery, aggregate, window
function, lambda, unknown or non-deterministic function. Aggregate functions without GROUP BY in the
SELECT list are left to the run-time row-wise check
(``spark.plans.window_plan.analyse``), which sees the analysed plan. ``expr`` must be a TIMESTAMP (``unix_micros``
takes no DATE or STRING: cast it), checked when Spark analyses the query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from sqlglot import exp

from ematix_dagster.columns import RELEASE_COLUMN
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.sql.grammar import check_predicate
from ematix_dagster.sql.parsing import CLAUSES, misplaced, parse_statement, text, top_selects

#: the value of :data:`RELEASE_COLUMN` meaning "release in this batch, whatever the watermark is"
RELEASE_NOW = -(2**63)
#: the marker function's name (matched case-insensitively)
WATERMARK_TS = "WATERMARK_TS"
_CALL = f"{WATERMARK_TS}()"
_KEY = "transform.sql"
_UPPER_BOUND = f"expr <= {_CALL} (or expr < {_CALL}, strictly after expr; or mirrored: {_CALL} >= expr)"
#: what a query calling WATERMARK_TS() may hold (sqlglot's argument keys of its SELECT): any other clause
#: works on the rows the WHERE leaves, and without the WHERE it would see every row
_ROW_WISE = ("with_", "hint", "expressions", "from_", "laterals", "joins", "where")
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg)

__all__ = ["RELEASE_COLUMN", "RELEASE_NOW", "WATERMARK_TS", "ReleaseBranch", "ReleasePlan", "release_plan",
           "uses_watermark_ts"]


@dataclass(frozen=True)
class ReleaseBranch:
    """One OR branch of the WHERE, as SQL text: a row it applies to is released when the watermark reaches
    ``release_at``."""

    guard: str | None  # the branch's static conditions, ANDed (None: always true)
    release_at: str | None  # the expression WATERMARK_TS() must reach (None: release now)
    strict: bool  # ``<``: released only once the watermark is past release_at


@dataclass(frozen=True)
class ReleasePlan:
    """The WHERE's branches, in the order written (the result does not depend on it), and the query Spark
    runs: the original without its WHERE, with :data:`RELEASE_COLUMN` appended to the SELECT list."""

    branches: tuple[ReleaseBranch, ...]
    sql: str


def uses_watermark_ts(sql: str, key: str = _KEY) -> bool:
    """Whether ``sql`` calls ``WATERMARK_TS()`` anywhere (a ``PipelineConfigError`` on ``key`` if it does not
    parse). A column named ``watermark_ts`` is not a call."""
    return bool(_calls(parse_statement(sql, key)))


def release_plan(sql: str, key: str = _KEY) -> ReleasePlan | None:
    """The release plan of ``sql``: None when it does not call ``WATERMARK_TS()``.

    Raises ``PipelineConfigError`` on ``key`` for a query that does not parse, or calls ``WATERMARK_TS()``
    anywhere but as an upper bound in its top-level WHERE (see the module doc); the message names the
    place or the OR branch (1-based, with its text) and says how to write it.
    """
    tree = parse_statement(sql, key)
    calls = _calls(tree)
    if not calls:
        return None
    for call in calls:
        if call.expressions:
            _fail(key, f"calls {text(call)}, with arguments", f"write {_CALL}: it takes none and is the "
                  "pipeline's watermark after the batch's advance")
    tops = list(top_selects(tree, key))
    if len(tops) != 1:
        kind = type(tree.this if isinstance(tree, exp.Subquery) else tree).__name__.upper()
        place = "in a UNION branch" if kind == "UNION" else f"in a query with {kind}"
        _fail(key, f"calls {_CALL} {place}; it may appear only in the WHERE of a single SELECT",
              "write one SELECT whose WHERE has an OR branch per kind of row")
    (select,) = tops
    for node in tree.walk():
        if isinstance(node, exp.Identifier) and node.name.lower() == RELEASE_COLUMN:
            _fail(key, f"names {RELEASE_COLUMN}, the column that carries a row's release time",
                  f"rename it: {RELEASE_COLUMN} is added to the SELECT list")
    for call in calls:
        found = misplaced(call, tops, ("where",))
        if found:
            _fail(key, f"calls {_CALL} {found}; it may appear only in the top-level WHERE, as an upper bound",
                  f"write the WHERE as OR branches of static conditions and at most one {_UPPER_BOUND}")
    for clause, value in select.args.items():
        if value and clause not in _ROW_WISE:
            _fail(key, f"calls {_CALL} in a query with {CLAUSES.get(clause, clause.rstrip('_').upper())}, which is not "
                  "row by row: the WHERE becomes each row's release time, so it no longer filters the rows that clause "
                  "sees", "keep the query to projections and a WHERE"
                  + (" (aggregate with [transform.window])" if key == _KEY else ""))
    if any(e.find(exp.Window) for e in select.expressions):
        _fail(key, f"calls {_CALL} in a query with a window function (OVER), which is not row by row",
              "keep the query to projections and a WHERE")
    branches = [_Branch(i, node, key) for i, node in enumerate(_split(select.args["where"].this, exp.Or), start=1)]
    check_predicate(select.args["where"].this, key, spark_only=True)
    select.set("where", None)
    values = [b.value() for b in branches]
    release = values[0] if len(values) == 1 else exp.Anonymous(this="LEAST", expressions=values)
    select.set("expressions", [*select.expressions, exp.alias_(release, RELEASE_COLUMN)])
    return ReleasePlan(tuple(b.plan for b in branches), text(tree))


class _Branch:
    """One OR branch: its guard and its upper bound, checked."""

    def __init__(self, number: int, node: exp.Expr, key: str) -> None:
        self.number, self.key, self.text = number, key, text(node)
        conjuncts = _split(node, exp.And)
        self.guard = [c for c in conjuncts if not _calls(c)]
        timed = [c for c in conjuncts if _calls(c)]
        if len(timed) > 1:
            self.fail(f"has {len(timed)} time-varying conditions ({'; '.join(text(c) for c in timed)})",
                      "a row has one release time per branch: keep one upper bound here, or put each in its own "
                      "OR branch with the static conditions repeated (the row is released at the earlier)")
        self.release_at: exp.Expr | None = None
        self.strict = False
        if timed:
            self.release_at, self.strict = self.bound(timed[0], [c for c in conjuncts if c is not timed[0]])
        self.plan = ReleaseBranch(text(exp.and_(*self.guard)) if self.guard else None,
                                  None if self.release_at is None else text(self.release_at), self.strict)

    def fail(self, problem: str, fix: str) -> NoReturn:
        _fail(self.key, f"branch {self.number} of the WHERE, `{self.text}`, {problem}", fix)

    def bound(self, cond: exp.Expr, others: list[exp.Expr]) -> tuple[exp.Expr, bool]:
        """``expr`` and whether the bound is strict, from ``cond`` (refused unless an upper bound)."""
        shown = "" if text(cond) == self.text else f" ({text(cond)})"
        if isinstance(cond, exp.Or):
            alternatives = " OR ".join(f"({text(exp.and_(*others, alt))})" for alt in _split(cond, exp.Or))
            self.fail(f"has {_CALL} under an OR inside an AND{shown}",
                      f"distribute it into top-level OR branches: {alternatives}")
        if isinstance(cond, (exp.LT, exp.LTE, exp.GT, exp.GTE)):
            left, right = _unparen(cond.this), _unparen(cond.expression)
            if _is_call(left) or _is_call(right):
                call_left = _is_call(left)
                expr = right if call_left else left
                if _calls(expr):
                    self.fail(f"compares {_CALL} with an expression that itself calls it{shown}",
                              f"release at an expression of the row's columns: {_UPPER_BOUND}")
                if call_left != isinstance(cond, (exp.GT, exp.GTE)):
                    self.fail(f"has {_CALL} as a lower bound{shown}: true at first and false for good once the "
                              "watermark passes it, so the row could never wait for it",
                              f"release when the watermark reaches expr: {_UPPER_BOUND}")
                return expr, isinstance(cond, (exp.LT, exp.GT))
            side = left if _calls(left) else right
            self.fail(f"has {_CALL} {_inside(side)}{shown}", _move_fix(side, whole=False))
        if _is_call(cond):
            self.fail(f"uses {_CALL} by itself as a condition", f"compare it with the release time: {_UPPER_BOUND}")
        if isinstance(cond, exp.Not):
            self.fail(f"has {_CALL} inside NOT{shown}", f"write the comparison without NOT: {_UPPER_BOUND}")
        if isinstance(cond, (exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.Between, exp.In)):
            what = {exp.Between: "BETWEEN", exp.In: "IN"}.get(type(cond), "an equality or inequality")
            self.fail(f"compares {_CALL} with {what}{shown}; the watermark only grows, so only an upper bound "
                      "means 'wait until'", f"write {_UPPER_BOUND}")
        self.fail(f"has {_CALL} {_inside(cond)}{shown}, not in a comparison of its own", _move_fix(cond, whole=True))

    def value(self) -> exp.Expr:
        """The branch's release time in µs, NULL where its guard is not TRUE."""
        if self.release_at is None:
            value: exp.Expr = exp.Literal.number(RELEASE_NOW)
        else:
            value = exp.Anonymous(this="UNIX_MICROS", expressions=[self.release_at.copy()])
            if self.strict:
                value = exp.Add(this=value, expression=exp.Literal.number(1))
        if not self.guard:
            return value
        return exp.Case(ifs=[exp.If(this=exp.and_(*(g.copy() for g in self.guard)), true=value)])


def _fail(key: str, problem: str, fix: str) -> NoReturn:
    raise PipelineConfigError(key, problem, fix)


def _calls(node: exp.Expr) -> list[exp.Anonymous]:
    return [n for n in node.walk() if isinstance(n, exp.Anonymous) and n.name.upper() == WATERMARK_TS]


def _is_call(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.upper() == WATERMARK_TS


def _unparen(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _split(node: exp.Expr, connector: type[exp.Connector]) -> list[exp.Expr]:
    """``a OR (b OR c)`` -> ``[a, b, c]`` (parentheses dropped), likewise for AND."""
    node = _unparen(node)
    if isinstance(node, connector):
        return _split(node.this, connector) + _split(node.expression, connector)
    return [node]


def _inside(node: exp.Expr) -> str:
    """What holds WATERMARK_TS() in ``node``, for a message."""
    node = _unparen(node)
    if isinstance(node, (exp.Case, exp.If)):
        return "inside CASE"
    if isinstance(node, _ARITHMETIC):
        return "inside arithmetic"
    if isinstance(node, exp.Func):
        return f"inside a function ({(node.name if isinstance(node, exp.Anonymous) else node.sql_name()).upper()})"
    return f"inside {type(node).__name__.upper()}"


def _move_fix(node: exp.Expr, whole: bool) -> str:
    """The fix for WATERMARK_TS() inside ``node``: the whole condition, or one side of a comparison."""
    node = _unparen(node)
    if isinstance(node, (exp.Case, exp.If)):
        return (f"put each case in its own OR branch: (tier = 'a' AND t <= {_CALL}) OR "
                f"(tier = 'b' AND t + INTERVAL 1 HOUR <= {_CALL})")
    if whole:
        return f"make the condition itself the comparison: {_UPPER_BOUND}"
    return (f"leave {_CALL} alone on its side and move the arithmetic or function to the other: "
            f"{_CALL} - INTERVAL 5 MINUTES >= t is t + INTERVAL 5 MINUTES <= {_CALL}")
