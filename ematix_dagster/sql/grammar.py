"""The expressions an ``[emit]`` predicate is made of: a grammar of allowed nodes, not a list of bad ones
(docs/contract/delayed-windows.md).

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
literal, a function not listed, one whose value changes from call to call) is refused at load time
with its text, and ``validate`` exits 2.

>>> from ematix_dagster.sql.parsing import parse_statement
>>> check_predicate(parse_statement("SELECT * FROM windows WHERE rand() < 0.5", "k").args["where"].this, "k")
Traceback (most recent call last):
...
ematix_dagster.errors.PipelineConfigError: k: uses RAND(): a function outside the predicate's grammar (fix: ...)
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import NoReturn

from sqlglot import exp

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.sql.parsing import text

__all__ = ["FUNCTIONS", "INTERVAL_US", "check_predicate", "interval_us", "timestamp_literal"]

#: function name (lower case) -> (fewest, most arguments; None: any number)
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "coalesce": (1, None), "greatest": (2, None), "least": (2, None), "abs": (1, 1), "lower": (1, 1),
    "upper": (1, 1), "length": (1, 1), "hour": (1, 1), "minute": (1, 1), "dayofweek": (1, 1),
}
#: an interval unit (singular, upper case) -> its length in µs
INTERVAL_US = {"MICROSECOND": 1, "MILLISECOND": 1_000, "SECOND": 1_000_000, "MINUTE": 60_000_000,
               "HOUR": 3_600_000_000, "DAY": 86_400_000_000, "WEEK": 604_800_000_000}
#: nodes allowed with whatever children are allowed themselves
_OPERATORS = (exp.Paren, exp.Neg, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.EQ, exp.NEQ,
              exp.LT, exp.LTE, exp.GT, exp.GTE, exp.NullSafeEQ, exp.And, exp.Or, exp.Not, exp.Between, exp.Case,
              exp.If, exp.Literal, exp.Boolean, exp.Null, exp.Column, exp.Identifier)
_GRAMMAR = ("columns, literals, day-time intervals, TIMESTAMP '...', comparisons, AND/OR/NOT, IS [NOT] NULL, "
            f"BETWEEN, IN (literals), CASE, IF, + - * / % DIV and the functions {', '.join(sorted(FUNCTIONS))}")


def check_predicate(node: exp.Expr, key: str, allowed_calls: tuple[str, ...] = ("watermark_ts",)) -> None:
    """Refuse (``PipelineConfigError`` on ``key``, naming the node's text) anything in ``node`` outside the
    grammar; ``allowed_calls``: functions of no arguments the caller handles itself (``WATERMARK_TS()``)."""
    for child in node.walk():
        if isinstance(child, _OPERATORS):
            continue
        if isinstance(child, exp.Anonymous):
            _check_call(child, key, allowed_calls)
        elif isinstance(child, exp.Interval):
            interval_us(child, key)
        elif isinstance(child, exp.Var) and isinstance(child.parent, exp.Interval):
            continue
        elif isinstance(child, exp.Is):
            if not isinstance(child.expression, exp.Null):
                _refuse(key, child, "IS compares with NULL only", "write x = TRUE, or IS NULL / IS NOT NULL")
        elif isinstance(child, exp.In):
            if child.args.get("query") or child.args.get("unnest") or child.args.get("field") or not all(
                    isinstance(e, (exp.Literal, exp.Boolean, exp.Null))
                    or (isinstance(e, exp.Neg) and isinstance(e.this, exp.Literal)) for e in child.expressions):
                _refuse(key, child, "IN takes a list of literals", "write x IN (1, 2, 3)")
        elif isinstance(child, exp.Cast):
            timestamp_literal(child, key)
        elif isinstance(child, exp.DataType) and isinstance(child.parent, exp.Cast):
            continue
        else:
            _refuse(key, child, "it is outside the predicate's grammar", f"use only {_GRAMMAR}")


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
    if not (isinstance(node.this, exp.Literal) and node.this.is_string
            and node.to.this in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ)):
        _refuse(key, node, "a cast; the grammar holds only TIMESTAMP '<ISO 8601>' literals",
                "compare values of the same type: a window bound with a TIMESTAMP literal or an interval sum")
    try:
        moment = datetime.fromisoformat(node.this.name)
    except ValueError:
        _refuse(key, node, "not an ISO 8601 date or date-time", "write TIMESTAMP '2024-01-01 00:00:00'")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _check_call(node: exp.Anonymous, key: str, allowed_calls: tuple[str, ...]) -> None:
    name = node.name.lower()
    if name in allowed_calls and not node.expressions:
        return
    if name not in FUNCTIONS:
        _refuse(key, node, "a function outside the predicate's grammar",
                f"use one of {', '.join(sorted(FUNCTIONS))}: deterministic, and computed exactly as Spark does")
    least, most = FUNCTIONS[name]
    if len(node.expressions) < least or (most is not None and len(node.expressions) > most):
        _refuse(key, node, f"calls {name} with {len(node.expressions)} arguments",
                f"{name} takes {least}" + ("" if most == least else f" to {most}" if most else " or more"))


def _refuse(key: str, node: exp.Expr, problem: str, fix: str) -> NoReturn:
    raise PipelineConfigError(key, f"uses {text(node)}: {problem}", fix)
