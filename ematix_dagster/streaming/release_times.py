"""The release time of each emitted row under ``[emit] sql``, computed over the rows' Arrow table
(docs/contract/delayed-windows.md).

The predicate's OR branches (``sql.release_plan``: a guard, and an upper bound on ``WATERMARK_TS()``)
give a row its release time: the least bound of the branches whose guard is TRUE, the bound in µs
(+1 for a strict ``<``), :data:`RELEASE_NOW` for a branch without one, NULL when no guard is TRUE.
The batch computes it here, in its driver callback, over the table it writes the target from: a second
Spark query on the emitted rows cost more than the rest of the delay.

The predicate is held to a grammar (``sql.grammar``) that Arrow evaluates as Spark does under ANSI
with the session time zone UTC: three-valued logic; ``AND``, ``OR``, ``CASE``, ``IF`` and
``COALESCE`` evaluate an operand only on the rows it can decide (so ``x <> 0 AND 10 / x > 1`` does
not fail on ``x = 0``); integer arithmetic in the literals' Spark types (``1`` is an INT, ``1.5``
a DECIMAL) and checked for overflow; ``/`` in DOUBLE; ``%`` with the sign of the dividend; a zero
divisor an error. An expression that fails on a row is :class:`RowFailed`, naming the row's
position: a window's row is never dead-lettered, so the batch stops with a terminal error naming it.

>>> import pyarrow as pa
>>> from ematix_dagster.sql.release_plan import ReleaseBranch
>>> times = ReleaseTimes((ReleaseBranch("k = 'b'", "window_end + INTERVAL 1 SECOND", False),
...                       ReleaseBranch("k <> 'b'", None, False)), ("window_end", "k"))
>>> rows = pa.table({"window_end": pa.array([10, 20, 30], pa.timestamp("us", "UTC")), "k": ["b", "a", None]})
>>> times.of(rows).to_pylist() == [1_000_010, RELEASE_NOW, None]
True
"""

from __future__ import annotations

import re
from decimal import Decimal
from functools import partial
from typing import Callable, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from ematix_dagster.sql.emit_query import KEY
from ematix_dagster.sql.grammar import interval_us, timestamp_literal
from ematix_dagster.sql.parsing import AnsiSpark
from ematix_dagster.sql.release_plan import RELEASE_NOW, ReleaseBranch

Value = Union[pa.Array, pa.Scalar]
_INT32 = 2**31


class RowFailed(Exception):
    """An expression of the predicate failed on a row (an overflow, a zero divisor)."""

    def __init__(self, row: int, expression: str, reason: str) -> None:
        super().__init__(f"{expression}: {reason}")
        self.row = row


class _Failed(Exception):
    def __init__(self, node: exp.Expr, reason: str) -> None:
        super().__init__(reason)
        self.node, self.reason = node, reason


class ReleaseTimes:
    """The predicate's branches, parsed once, evaluated per batch over the emitted rows."""

    def __init__(self, branches: Sequence[ReleaseBranch], columns: Sequence[str]) -> None:
        self.names = {c.lower(): c for c in columns}
        self.branches = [(_parse(b.guard), _parse(b.release_at), b.strict) for b in branches]

    def of(self, rows: pa.Table) -> pa.Array:
        """Each row's release time (int64 µs, RELEASE_NOW, or NULL), in row order; :class:`RowFailed` for the
        first row an expression fails on."""
        try:
            return self._times(rows)
        except _Failed as failed:
            for i in range(rows.num_rows):  # which row: only once the batch is lost anyway
                try:
                    self._times(rows.slice(i, 1))
                except _Failed as one:
                    raise RowFailed(i, one.node.sql(dialect=AnsiSpark), one.reason) from None
            raise RowFailed(0, failed.node.sql(dialect=AnsiSpark), failed.reason) from None

    def _times(self, rows: pa.Table) -> pa.Array:
        n = rows.num_rows
        values = []
        for guard, bound, strict in self.branches:
            applies = self._truth(guard, rows) if guard is not None else _all(n)
            if bound is None:
                values.append(pc.if_else(applies, pa.scalar(RELEASE_NOW, pa.int64()), pa.scalar(None, pa.int64())))
            else:
                values.append(_where(applies, partial(self._micros, bound, strict), rows, pa.int64()))
        if len(values) == 1:
            return _array(values[0], n)
        return pc.min_element_wise(*values, skip_nulls=True)

    def _micros(self, bound: exp.Expr, strict: bool, rows: pa.Table) -> pa.Array:
        value = self._values(bound, rows)
        if not pa.types.is_timestamp(value.type):
            raise _Failed(bound, f"is {value.type}, not a TIMESTAMP")
        micros = value.cast(pa.timestamp("us", "UTC")).cast(pa.int64())
        return _checked(bound, pc.add_checked, micros, pa.scalar(1, pa.int64())) if strict else micros

    def _values(self, node: exp.Expr, rows: pa.Table) -> pa.Array:
        return _array(self._value(node, rows), rows.num_rows)

    def _truth(self, node: exp.Expr, rows: pa.Table) -> pa.Array:
        """TRUE where ``node`` is TRUE; FALSE where it is FALSE or NULL."""
        return _true(self._value(node, rows), rows.num_rows)

    def _value(self, node: exp.Expr, rows: pa.Table) -> Value:
        handler = _HANDLERS.get(type(node))
        if handler is None:
            raise _Failed(node, "is outside the predicate's grammar")
        return handler(self, node, rows)

    # -- leaves

    def _column(self, node: exp.Column, rows: pa.Table) -> Value:
        return rows.column(self.names[node.name.lower()]).combine_chunks()

    def _literal(self, node: exp.Literal, rows: pa.Table) -> Value:
        if node.is_string:
            return pa.scalar(node.name, pa.string())
        digits = node.name
        if re.fullmatch(r"\d+", digits) and int(digits) < 2**63:  # an INT, or a BIGINT past its range
            return pa.scalar(int(digits), pa.int32() if int(digits) < _INT32 else pa.int64())
        if re.fullmatch(r"\d*\.?\d*", digits):  # a DECIMAL of the literal's precision and scale
            places, exponent = Decimal(digits).as_tuple()[1:]
            scale = max(-int(exponent), 0)
            return pa.scalar(Decimal(digits), pa.decimal128(max(len(places), scale, 1), scale))
        return pa.scalar(float(digits), pa.float64())

    def _boolean(self, node: exp.Boolean, rows: pa.Table) -> Value:
        return pa.scalar(bool(node.this), pa.bool_())

    def _null(self, node: exp.Null, rows: pa.Table) -> Value:
        return pa.scalar(None, pa.null())

    def _interval(self, node: exp.Interval, rows: pa.Table) -> Value:
        return pa.scalar(interval_us(node, KEY), pa.duration("us"))

    def _timestamp(self, node: exp.Cast, rows: pa.Table) -> Value:
        return pa.scalar(timestamp_literal(node, KEY), pa.timestamp("us", "UTC"))

    def _paren(self, node: exp.Paren, rows: pa.Table) -> Value:
        return self._value(node.this, rows)

    # -- arithmetic

    def _operands(self, node: exp.Binary, rows: pa.Table) -> tuple[Value, Value]:
        """Both sides of an operator that is NULL when one is: the right one only where the left is not NULL,
        as Spark evaluates it (a right side that would fail there does not)."""
        left = self._value(node.left, rows)
        if _is_null(left):
            return left, left
        if isinstance(left, pa.Scalar) or not left.null_count:
            return left, self._value(node.right, rows)
        right = _where(pc.is_valid(left), lambda part: self._value(node.right, part), rows, pa.null())
        return left, right

    def _arithmetic(self, node: exp.Binary, rows: pa.Table) -> Value:
        left, right = self._operands(node, rows)
        if any(_is_null(v) or _is_null_type(v) for v in (left, right)):  # NULL (x % NULL: no zero divisor)
            return pa.scalar(None, pa.null())
        if isinstance(left, pa.Scalar) and isinstance(right, pa.Scalar):  # fails on each row, so on none of none
            left = _array(left, rows.num_rows)
        if isinstance(node, (exp.Div, exp.Mod, exp.IntDiv)):
            n = rows.num_rows  # the rows that evaluate the division: NULL on the left skips it
            if pc.any(pc.and_(_array(pc.equal(right, pa.scalar(0, right.type)), n), _array(pc.is_valid(left), n))).as_py():
                raise _Failed(node, "division by zero")
        if isinstance(node, exp.Div):
            return _checked(node, pc.divide_checked, _double(left), _double(right))
        if isinstance(node, exp.Mod):  # Java's remainder: the sign of the dividend
            if _floating(left) or _floating(right):
                return _fmod(_array(_double(left), rows.num_rows), _array(_double(right), rows.num_rows))
            quotient = _checked(node, pc.divide_checked, left, right)
            return _checked(node, pc.subtract_checked, left, _checked(node, pc.multiply_checked, quotient, right))
        function = {exp.Add: pc.add_checked, exp.Sub: pc.subtract_checked, exp.Mul: pc.multiply_checked,
                    exp.IntDiv: pc.divide_checked}[type(node)]
        value = _checked(node, function, *_unified(left, right))
        return value.cast(pa.int64()) if isinstance(node, exp.IntDiv) else value

    def _negate(self, node: exp.Neg, rows: pa.Table) -> Value:
        return _checked(node, pc.negate_checked, self._value(node.this, rows))

    # -- comparisons and logic

    def _compare(self, node: exp.Binary, rows: pa.Table) -> Value:
        if not isinstance(node, exp.NullSafeEQ):
            left, right = self._operands(node, rows)
        else:  # <=> is never NULL: Spark evaluates both sides
            left, right = self._value(node.left, rows), self._value(node.right, rows)
        if isinstance(node, exp.NullSafeEQ):
            n = rows.num_rows
            left, right = _array(left, n), _array(right, n)
            both_null = pc.and_(pc.is_null(left), pc.is_null(right))
            if _is_null_type(left) or _is_null_type(right):
                return both_null
            return pc.or_(both_null, pc.fill_null(pc.equal(*_unified(left, right)), False))
        if any(_is_null(v) or _is_null_type(v) for v in (left, right)):
            return pa.scalar(None, pa.bool_())
        function = {exp.EQ: pc.equal, exp.NEQ: pc.not_equal, exp.LT: pc.less, exp.LTE: pc.less_equal,
                    exp.GT: pc.greater, exp.GTE: pc.greater_equal}[type(node)]
        return _checked(node, function, *_unified(left, right))

    def _and(self, node: exp.And, rows: pa.Table) -> Value:
        return self._lazy(node, rows, decided=False)

    def _or(self, node: exp.Or, rows: pa.Table) -> Value:
        return self._lazy(node, rows, decided=True)

    def _lazy(self, node: exp.Binary, rows: pa.Table, decided: bool) -> Value:
        """``AND`` (``decided`` FALSE) or ``OR`` (TRUE): the right side only where the left is not ``decided``."""
        n = rows.num_rows
        left = _boolean_array(node, self._value(node.left, rows), n)
        open_rows = pc.invert(pc.fill_null(pc.equal(left, decided), False))
        right = _where(open_rows, lambda part: _boolean_array(node, self._value(node.right, part), part.num_rows),
                       rows, pa.bool_())
        return (pc.or_kleene if decided else pc.and_kleene)(left, right)

    def _not(self, node: exp.Not, rows: pa.Table) -> Value:
        return pc.invert(_boolean_array(node, self._value(node.this, rows), rows.num_rows))

    def _is(self, node: exp.Is, rows: pa.Table) -> Value:
        return pc.is_null(_array(self._value(node.this, rows), rows.num_rows))

    def _between(self, node: exp.Between, rows: pa.Table) -> Value:
        low = exp.GTE(this=node.this.copy(), expression=node.args["low"].copy())
        high = exp.LTE(this=node.this.copy(), expression=node.args["high"].copy())
        return self._and(exp.And(this=low, expression=high), rows)

    def _in(self, node: exp.In, rows: pa.Table) -> Value:
        found: Value = pa.scalar(False, pa.bool_())
        for item in node.expressions:  # x IN (a, b) is x = a OR x = b, NULLs and all
            found = pc.or_kleene(found, self._compare(exp.EQ(this=node.this.copy(), expression=item.copy()), rows))
        return _array(found, rows.num_rows)

    def _case(self, node: exp.Case, rows: pa.Table) -> Value:
        subject = node.this
        branches = [(exp.EQ(this=subject.copy(), expression=i.this.copy()) if subject is not None else i.this,
                     i.args["true"]) for i in node.args["ifs"]]
        return self._branches(branches, node.args.get("default"), rows)

    def _if(self, node: exp.If, rows: pa.Table) -> Value:
        return self._branches([(node.this, node.args["true"])], node.args.get("false"), rows)

    def _branches(self, branches: list[tuple[exp.Expr, exp.Expr]], default: exp.Expr | None,
                  rows: pa.Table) -> Value:
        """CASE WHEN c1 THEN v1 ... ELSE d: each value only on the rows its condition is the first TRUE one."""
        n = rows.num_rows
        remaining = _all(n)
        parts: list[tuple[pa.Array, exp.Expr]] = []
        for condition, value in branches:
            hit = pc.fill_null(_where(remaining, partial(self._truth, condition), rows, pa.bool_()), False)
            parts.append((hit, value))
            remaining = pc.and_(remaining, pc.invert(hit))
        if default is not None:
            parts.append((remaining, default))
        common = _common_type([self._value(value, rows.slice(0, 0)) for _, value in parts])
        out = pa.nulls(n, common)
        for mask, value in parts:
            part = _array(self._value(value, rows.filter(mask)), pc.sum(mask).as_py() or 0)
            if not _is_null_type(part):
                out = _replace_with_mask(out, mask, part.cast(common))
        return out

    # -- functions

    def _call(self, node: exp.Anonymous, rows: pa.Table) -> Value:
        name = node.name.lower()
        n = rows.num_rows
        if name == "coalesce":
            return self._coalesce(node.expressions, rows)
        args = [_array(self._value(a, rows), n) for a in node.expressions]
        if name in ("greatest", "least"):
            common = _common_type(args)
            if pa.types.is_null(common):
                return pa.nulls(n)
            storage = pa.int64() if pa.types.is_timestamp(common) else common  # Arrow orders no timestamps here
            typed = [a.cast(common).cast(storage) for a in args if not _is_null_type(a)]
            function = pc.max_element_wise if name == "greatest" else pc.min_element_wise
            return function(*typed, skip_nulls=True).cast(common)
        (arg,) = args
        if name == "abs":
            return _checked(node, pc.abs_checked, arg)
        if name in ("lower", "upper", "length"):
            return {"lower": pc.utf8_lower, "upper": pc.utf8_upper, "length": pc.utf8_length}[name](arg)
        if name in ("hour", "minute"):
            return (pc.hour if name == "hour" else pc.minute)(arg).cast(pa.int32())
        if name == "dayofweek":  # 1 = Sunday, as Spark counts
            return pc.day_of_week(arg, count_from_zero=False, week_start=7).cast(pa.int32())
        raise _Failed(node, "is outside the predicate's grammar")

    def _coalesce(self, args: list[exp.Expr], rows: pa.Table) -> Value:
        common = _common_type([self._value(a, rows.slice(0, 0)) for a in args])
        out = _array(self._value(args[0], rows), rows.num_rows).cast(common)
        for arg in args[1:]:
            more = _where(pc.is_null(out), partial(self._values, arg), rows, common)
            out = pc.coalesce(out, more.cast(common))
        return out


_HANDLERS: dict[type, Callable[..., Value]] = {
    exp.Column: ReleaseTimes._column, exp.Literal: ReleaseTimes._literal, exp.Boolean: ReleaseTimes._boolean,
    exp.Null: ReleaseTimes._null, exp.Interval: ReleaseTimes._interval, exp.Cast: ReleaseTimes._timestamp,
    exp.Paren: ReleaseTimes._paren, exp.Neg: ReleaseTimes._negate,
    **{kind: ReleaseTimes._arithmetic for kind in (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod)},
    **{kind: ReleaseTimes._compare for kind in (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE, exp.NullSafeEQ)},
    exp.And: ReleaseTimes._and, exp.Or: ReleaseTimes._or, exp.Not: ReleaseTimes._not, exp.Is: ReleaseTimes._is,
    exp.Between: ReleaseTimes._between, exp.In: ReleaseTimes._in, exp.Case: ReleaseTimes._case,
    exp.If: ReleaseTimes._if, exp.Anonymous: ReleaseTimes._call,
}


def _parse(sql: str | None) -> exp.Expr | None:
    return None if sql is None else sqlglot.parse_one(sql, dialect=AnsiSpark)


def _all(n: int) -> pa.Array:
    return pa.array([True] * n, pa.bool_())


def _array(value: Value, n: int) -> pa.Array:
    if isinstance(value, pa.ChunkedArray):
        return value.combine_chunks()
    if isinstance(value, pa.Array):
        return value
    return pa.array([value.as_py()] * n, value.type)


def _is_null(value: Value) -> bool:
    return isinstance(value, pa.Scalar) and not value.is_valid


def _is_null_type(value: Value) -> bool:
    return pa.types.is_null(value.type)


def _common_type(values: list[Value]) -> pa.DataType:
    """The type Spark gives CASE, COALESCE, GREATEST and LEAST over ``values``: their common one (NULL
    literals aside)."""
    typed = [pa.array([], v.type) for v in values if not _is_null_type(v)]
    return pc.coalesce(*typed).type if typed else pa.null()


def _floating(value: Value) -> bool:
    return pa.types.is_floating(value.type) or pa.types.is_decimal(value.type)


def _unified(left: Value, right: Value) -> tuple[Value, Value]:
    """Numbers of which one is a DOUBLE both as DOUBLE, as Spark widens them (Arrow's implicit cast refuses a
    BIGINT past 2**53 instead of rounding it)."""
    if pa.types.is_floating(left.type) or pa.types.is_floating(right.type):
        numeric = (pa.types.is_integer(left.type) or pa.types.is_decimal(left.type) or pa.types.is_floating(left.type))
        if numeric and (pa.types.is_integer(right.type) or pa.types.is_decimal(right.type)
                        or pa.types.is_floating(right.type)):
            return _double(left), _double(right)
    return left, right


def _double(value: Value) -> Value:
    return value.cast(pa.float64(), safe=False)  # a BIGINT past 2**53 rounds, as Spark's cast does


def _fmod(left: pa.Array, right: pa.Array) -> pa.Array:
    """The remainder with the sign of the dividend, as Java's ``%`` on doubles (Arrow's has the divisor's)."""
    with np.errstate(all="ignore"):
        values = np.fmod(left.to_numpy(zero_copy_only=False), right.to_numpy(zero_copy_only=False))
    missing = pc.or_(pc.is_null(left), pc.is_null(right)).to_numpy(zero_copy_only=False)
    return pa.array(values, pa.float64(), mask=missing)


def _true(value: Value, n: int) -> pa.Array:
    """TRUE where ``value`` is TRUE; FALSE where it is FALSE or NULL."""
    return pc.fill_null(_array(value, n).cast(pa.bool_()), False)


def _boolean_array(node: exp.Expr, value: Value, n: int) -> pa.Array:
    array = _array(value, n)
    if _is_null_type(array):
        return pa.nulls(n, pa.bool_())
    if not pa.types.is_boolean(array.type):
        raise _Failed(node, f"is {array.type}, not a BOOLEAN")
    return array


def _where(mask: pa.Array, compute: Callable[[pa.Table], Value], rows: pa.Table, dtype: pa.DataType) -> pa.Array:
    """``compute`` over the rows ``mask`` selects, NULL on the others (an operand Spark would not evaluate)."""
    n = rows.num_rows
    mask = pc.fill_null(mask, False)
    if not n or pc.all(mask).as_py():
        return _array(compute(rows), n)
    selected = rows.filter(mask)
    values = _array(compute(selected), selected.num_rows)
    if _is_null_type(values):
        return pa.nulls(n, dtype)
    return _replace_with_mask(pa.nulls(n, values.type), mask, values)


def _replace_with_mask(base: pa.Array, mask: pa.Array, values: pa.Array) -> pa.Array:
    """``pc.replace_with_mask``, durations included (Arrow has no kernel for them: through int64)."""
    if pa.types.is_duration(base.type):
        return pc.replace_with_mask(base.cast(pa.int64()), mask, values.cast(pa.int64())).cast(base.type)
    return pc.replace_with_mask(base, mask, values)


def _checked(node: exp.Expr, function: Callable[..., Value], *args: Value) -> Value:
    """``function(*args)``; an overflow or a zero divisor fails the expression on the rows at hand (a type
    mismatch is an analysis error: the stage evaluates the predicate over no rows when it opens)."""
    try:
        return function(*args)
    except pa.ArrowInvalid as exc:
        raise _Failed(node, str(exc)) from None
