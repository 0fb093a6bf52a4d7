"""The expressions an ``[emit]`` predicate and a row pipeline's ``WATERMARK_TS()`` WHERE are made of: a
grammar of allowed nodes, not a list of bad ones (docs/contract/delayed-windows.md, row-pipelines.md).

A row's release time must be a value of the row alone, the same whatever else its batch holds, and
the engine computes it in the batch's driver callback over the Arrow rows it writes, exactly as Spark
(ANSI, session time zone UTC) evaluates the same text (``streaming.release_times``). So a predicate
may use only what both read the same way:

- references to the allowed columns, and literals: numbers, strings, TRUE/FALSE, NULL,
  ``TIMESTAMP '<ISO 8601>'`` and day-time intervals (``INTERVAL 15 MINUTES``; units from
  microseconds to weeks: a month has no fixed length);
- comparisons (``= <> != < <= > >= <=>``), ``AND``, ``OR``, ``NOT``, ``IS [NOT] NULL``,
  ``[NOT] BETWEEN``, ``[NOT] IN`` over literals, ``CASE``, ``IF``;
- arithmetic ``+ - * / % DIV`` and unary minus;
- the deterministic functions in :data:`FUNCTIONS`.

Anything else (a subquery, an aggregate, a window function, a lambda, a cast other than a timestamp
literal, a function not listed, one whose value changes from call to call: ``rand``, ``uuid``,
``current_timestamp``, ``input_file_name``, ``reflect``, a UDF, ...) is refused at load time with its
text, and ``validate`` exits 2. The walk also holds which columns the predicate may name
(:class:`Columns`). A row pipeline's WHERE calling ``WATERMARK_TS()`` is read by the same walk over
any column of its query; Spark alone evaluates it, so it may also cast and call
:data:`SPARK_FUNCTIONS`.

>>> from ematix_dagster.sql.parsing import parse_statement
>>> check_predicate(parse_statement("SELECT * FROM windows WHERE rand() < 0.5", "k").args["where"].this, "k")
Traceback (most recent call last):
...
ematix_dagster.errors.PipelineConfigError: k: uses RAND(): a function outside the predicate's grammar (fix: ...)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import NoReturn

from sqlglot import exp

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.sql.parsing import text

__all__ = ["FUNCTIONS", "SPARK_FUNCTIONS", "Columns", "INTERVAL_US", "check_predicate", "interval_us", "timestamp_literal"]

#: function name (lower case) -> (fewest, most arguments; None: any number)
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "coalesce": (1, None), "greatest": (2, None), "least": (2, None), "abs": (1, 1), "lower": (1, 1),
    "upper": (1, 1), "length": (1, 1), "hour": (1, 1), "minute": (1, 1), "dayofweek": (1, 1),
}
#: besides :data:`FUNCTIONS`, where Spark alone evaluates the predicate (a row pipeline's WHERE calling
#: ``WATERMARK_TS()``): deterministic scalar functions of their arguments
SPARK_FUNCTIONS: dict[str, tuple[int, int | None]] = {
    **FUNCTIONS, "to_timestamp": (1, 2), "to_date": (1, 2), "date_trunc": (2, 2), "date_add": (2, 2),
    "date_sub": (2, 2), "timestamp_seconds": (1, 1), "timestamp_millis": (1, 1), "timestamp_micros": (1, 1),
    "unix_seconds": (1, 1), "unix_millis": (1, 1), "unix_micros": (1, 1), "from_utc_timestamp": (2, 2),
    "to_utc_timestamp": (2, 2), "make_timestamp": (6, 7), "year": (1, 1), "month": (1, 1), "day": (1, 1),
    "dayofmonth": (1, 1), "second": (1, 1), "nvl": (2, 2), "ifnull": (2, 2), "nullif": (2, 2), "concat": (1, None),
    "substring": (2, 3), "substr": (2, 3), "trim": (1, 1), "ltrim": (1, 1), "rtrim": (1, 1), "round": (1, 2),
    "floor": (1, 1), "ceil": (1, 1), "sign": (1, 1),
}
#: an interval unit (singular, upper case) -> its length in µs
INTERVAL_US = {"MICROSECOND": 1, "MILLISECOND": 1_000, "SECOND": 1_000_000, "MINUTE": 60_000_000,
               "HOUR": 3_600_000_000, "DAY": 86_400_000_000, "WEEK": 604_800_000_000}
#: nodes allowed with whatever children are allowed themselves (these types exactly, not their subclasses)
_OPERATORS = frozenset({exp.Paren, exp.Neg, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.EQ, exp.NEQ,
              exp.LT, exp.LTE, exp.GT, exp.GTE, exp.NullSafeEQ, exp.And, exp.Or, exp.Not, exp.Between, exp.Case,
              exp.If, exp.Literal, exp.Boolean, exp.Null})
_GRAMMAR = ("columns, literals, day-time intervals, TIMESTAMP '...', comparisons, AND/OR/NOT, IS [NOT] NULL, "
            f"BETWEEN, IN (literals), CASE, IF, + - * / % DIV and the functions {', '.join(sorted(FUNCTIONS))}")


@dataclass(frozen=True)
class Columns:
    """The columns a predicate may name: ``names`` (compared as Spark does, ignoring case), unqualified or
    qualified by ``view``; ``why`` says, in a refusal, why no other column is allowed."""

    names: tuple[str, ...]
    view: str
    why: str


def check_predicate(node: exp.Expr, key: str, columns: Columns | None = None, *, spark_only: bool = False,
                    allowed_calls: tuple[str, ...] = ("watermark_ts",)) -> None:
    """Refuse (``PipelineConfigError`` on ``key``, naming the node's text) anything in ``node`` outside the
    grammar. ``columns``: the columns it may name (None: any column); ``spark_only``: Spark alone evaluates
    the predicate (a row pipeline's WHERE), so ``CAST`` to any type and :data:`SPARK_FUNCTIONS` are allowed
    too; ``allowed_calls``: functions of no arguments the caller handles itself (``WATERMARK_TS()``)."""
    allowed = set() if columns is None else {c.lower() for c in columns.names}
    for child in node.walk():
        if type(child) in _OPERATORS:
            continue
        if isinstance(child, exp.Column):
            if columns is not None and (
                    child.name.lower() not in allowed or child.args.get("db") or child.args.get("catalog")
                    or (child.table and child.table.lower() != columns.view)):
                raise PipelineConfigError(key, f"the predicate names {text(child)}, {columns.why}",
                                          f"use only {', '.join(columns.names)}")
        elif isinstance(child, exp.Identifier) and isinstance(child.parent, exp.Column):
            continue
        elif type(child) is exp.Anonymous:
            _check_call(child, key, allowed_calls, SPARK_FUNCTIONS if spark_only else FUNCTIONS)
        elif type(child) is exp.Interval:
            interval_us(child, key)
        elif type(child) is exp.Var and isinstance(child.parent, exp.Interval):
            continue
        elif type(child) is exp.Is:
            if not isinstance(child.expression, exp.Null):
                _refuse(key, child, "IS compares with NULL only", "write x = TRUE, or IS NULL / IS NOT NULL")
        elif type(child) is exp.In:
            if child.args.get("query"):
                _refuse(key, child, _outside(child.args["query"]), "write x IN (1, 2, 3)")
            if child.args.get("unnest") or child.args.get("field") or not all(
                    isinstance(e, (exp.Literal, exp.Boolean, exp.Null))
                    or (isinstance(e, exp.Neg) and isinstance(e.this, exp.Literal)) for e in child.expressions):
                _refuse(key, child, "IN takes a list of literals", "write x IN (1, 2, 3)")
        elif type(child) is exp.Cast:
            if not spark_only or _is_timestamp_literal(child):
                timestamp_literal(child, key)
        elif type(child) is exp.DataType and isinstance(child.parent, exp.Cast):
            continue
        else:
            _refuse(key, child, _outside(child), f"use only {_GRAMMAR}")


def _outside(node: exp.Expr) -> str:
    """Why ``node`` is refused, by its kind."""
    if isinstance(node, (exp.Query, exp.Subquery, exp.Exists, exp.Table, exp.From)):
        return "a subquery, outside the predicate's grammar: a release time is a value of the row alone"
    if isinstance(node, exp.Window):
        return "a window function, outside the predicate's grammar: its value depends on other rows"
    if isinstance(node, exp.Lambda) or any(isinstance(v, exp.Lambda) for v in node.iter_expressions()):
        return "a lambda function, outside the predicate's grammar"
    if isinstance(node, exp.AggFunc):
        return "an aggregate, outside the predicate's grammar: its value depends on other rows"
    return "it is outside the predicate's grammar"


def interval_us(node: exp.Interval, key: str) -> int:
    """The length of a day-time interval literal in µs."""
    unit = node.unit.name.upper().removesuffix("S") if node.unit is not None else ""
    value = node.this.name if isinstance(node.this, exp.Literal) else None
    if unit not in INTERVAL_US or value is None or not value.lstrip("-").isdigit():
        _refuse(key, node, "not a day-time interval of a whole number of units",
                f"write INTERVAL <integer> <unit>, the unit one of {', '.join(INTERVAL_US)} (a month has no fixed "
                "length: write days)")
    return int(value) * INTERVAL_US[unit]


def timestamp_literal(node: exp.Cast, key: str) -> datetime:
    """The moment ``TIMESTAMP '...'`` names, the one cast the grammar holds: ISO 8601, in UTC (the session
    time zone) unless it says otherwise."""
    if not _is_timestamp_literal(node):
        _refuse(key, node, "a cast; the grammar holds only TIMESTAMP '<ISO 8601>' literals",
                "compare values of the same type: a window bound with a TIMESTAMP literal or an interval sum")
    try:
        moment = datetime.fromisoformat(node.this.name)
    except ValueError:
        _refuse(key, node, "not an ISO 8601 date or date-time", "write TIMESTAMP '2024-01-01 00:00:00'")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _is_timestamp_literal(node: exp.Cast) -> bool:
    return isinstance(node.this, exp.Literal) and node.this.is_string and node.to.this in (
        exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ)


def _check_call(node: exp.Anonymous, key: str, allowed_calls: tuple[str, ...],
                functions: dict[str, tuple[int, int | None]]) -> None:
    name = node.name.lower()
    if name in allowed_calls and not node.expressions:
        return
    if name not in functions:
        if any(isinstance(e, exp.Lambda) for e in node.expressions):
            _refuse(key, node, "a lambda function, outside the predicate's grammar", f"use only {_GRAMMAR}")
        _refuse(key, node, "a function outside the predicate's grammar",
                f"use one of {', '.join(sorted(functions))}: deterministic, and computed exactly as Spark does")
    least, most = functions[name]
    if len(node.expressions) < least or (most is not None and len(node.expressions) > most):
        _refuse(key, node, f"calls {name} with {len(node.expressions)} arguments",
                f"{name} takes {least}" + ("" if most == least else f" to {most}" if most else " or more"))


def _refuse(key: str, node: exp.Expr, problem: str, fix: str) -> NoReturn:
    raise PipelineConfigError(key, f"uses {text(node)}: {problem}", fix)
