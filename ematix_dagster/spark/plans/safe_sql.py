"""Guard ``[transform] sql`` against rows that make an ANSI expression throw.

With ``spark.sql.ansi.enabled`` (Spark 4's default) one bad value fails the whole query:
``CAST('abc' AS BIGINT)`` raises ``CAST_INVALID_INPUT``, ``x / 0`` raises ``DIVIDE_BY_ZERO``,
``a + b`` past the BIGINT range raises ``ARITHMETIC_OVERFLOW``. In a streaming pipeline that batch is
retried and fails again, forever: one row stops the pipeline. ``guard_sql`` rewrites the query so
that every such expression takes its non-throwing form (``TRY_CAST``, ``try_add``, ...) and each
output row says, in the added column ``_sql_error``, which expression failed on it (NULL for a
clean row); the engine sends those rows to the dead-letter target as ``sql_error``.

>>> g = guard_sql("SELECT id, CAST(x AS BIGINT) AS xi, _event_ts, _source FROM source WHERE y > 0")
>>> g.expressions
('CAST(x AS BIGINT)',)
>>> print(g.sql)  # doctest: +NORMALIZE_WHITESPACE
SELECT id, TRY_CAST(x AS BIGINT) AS xi, _event_ts, _source,
  CASE WHEN (NOT (x) IS NULL) AND ((TRY_CAST(x AS BIGINT)) IS NULL) THEN 'CAST(x AS BIGINT)' END AS _sql_error
FROM source WHERE y > 0

What is guarded (SQL parsed by sqlglot, Spark dialect, read as ANSI Spark runs it):

* ``CAST(e AS t)``, ``e::t`` and the cast functions ``INT(e)``, ``DATE(e)``, ... -> ``TRY_CAST``
  (casts to ``STRING`` cannot fail and are left alone);
* ``+ - * / %`` -> ``try_add``, ``try_subtract``, ``try_multiply``, ``try_divide``, ``try_mod``
  (these take dates, timestamps and intervals as the operators do); ``mod`` -> ``try_mod``;
  ``DIV`` and ``pmod`` give NULL where ``try_mod`` does (a zero divisor);
* the functions with a ``try_`` twin: ``to_timestamp``, ``to_date``, ``to_number``, ``to_binary``,
  ``url_decode``, ``parse_url``, ``parse_json``, ``variant_get``, ``variant_array_append``,
  ``variant_insert``, ``variant_set``, ``make_timestamp`` (``_ltz``, ``_ntz``), ``make_interval``,
  ``validate_utf8``, ``aes_decrypt``, ``element_at``;
* ``array[i]`` out of range (a map's ``m[k]`` never throws and is left as it is).

A guarded expression *failed* on a row when its try form is NULL although none of its direct
inputs is (a NULL input giving NULL is not an error; for ``element_at``, ``[]``, ``parse_url`` and
``variant_get``, whose results may be NULL legitimately, the test is the cause itself: an index out
of range, a URL that does not parse, a value that does not cast). ``_sql_error`` names the *first*
failure in Spark's evaluation order: the WHERE clause, then the SELECT list left to right, and in an
expression its arguments before itself, so a nested failure names the innermost expression (the
outer one then has a NULL input and is not counted). A branch Spark would not evaluate (the other
side of ``CASE``/``IF``, a ``COALESCE`` argument after a non-NULL one, the right of ``AND``/``OR``
once the left decides) does not count, so ``CASE WHEN s RLIKE '^[0-9]+$' THEN CAST(s AS INT) END``
flags nothing. A row whose WHERE could not be evaluated is kept (``WHERE (cond) OR (it failed)``)
so that it reaches the dead-letter target instead of vanishing.

Not guarded (Spark has no non-throwing form, or the SQL text cannot tell): an expression over
literals only (it fails on every row or none: a spec error); implicit casts Spark adds (``'abc' = 3``:
write the CAST); overflow of ``-x``, ``abs(x)`` and ``x DIV -1`` at the type's minimum;
``make_date``, ``to_timestamp_ntz``/``_ltz``, ``unix_timestamp``, ``to_time`` (Spark 4.3's TIME type
is off), ``reflect``; ``try_*`` calls the user wrote (NULL is then their choice).

With ``source_row`` the guard also appends ``_source_row``: the JSON of the row as the SQL read
it (every column of the view, NULLs included), on the rows whose expression failed (or, with
``every_row``, on all), so that a ``sql_error`` dead letter shows the value that failed (``'abc'``,
which the post-SQL row holds as NULL). A SELECT that does not read the view directly (only through
a subquery) gives NULL there.

Spark names an unaliased SELECT item after its text, so a guarded one is named after its try form
(``TRY_CAST(x AS INT)``, not ``CAST(x AS INT)``): alias it, or rename the output by position.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from ematix_dagster.columns import SOURCE_ROW, SQL_ERROR
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.sql.parsing import AnsiSpark, misplaced, parse_statement, top_selects
from ematix_dagster.sql.parsing import text as _text

_KEY = "transform.sql"


@dataclass(frozen=True)
class GuardedSql:
    """The rewritten query and the guarded expressions, in the order ``_sql_error`` tests them."""

    sql: str
    expressions: tuple[str, ...]


@dataclass(frozen=True)
class SourceRow:
    """Whether and where ``guard_sql`` takes ``_source_row`` from: the view the SQL reads, and whether
    every row carries it (the dead letters of every post-SQL reason) or only a row whose expression failed."""

    view: str
    every_row: bool = False


#: Operators and functions whose ``try_`` twin takes the same arguments and is NULL exactly on failure.
_OPERATORS: dict[type[exp.Expr], str] = {exp.Add: "TRY_ADD", exp.Sub: "TRY_SUBTRACT", exp.Mul: "TRY_MULTIPLY",
                                         exp.Div: "TRY_DIVIDE", exp.Mod: "TRY_MOD"}
_TWINS = {name: f"TRY_{name}" for name in (
    "TO_TIMESTAMP", "TO_DATE", "TO_NUMBER", "TO_BINARY", "URL_DECODE", "PARSE_URL", "PARSE_JSON", "VARIANT_GET",
    "VARIANT_ARRAY_APPEND", "VARIANT_INSERT", "VARIANT_SET", "MAKE_TIMESTAMP", "MAKE_TIMESTAMP_LTZ",
    "MAKE_TIMESTAMP_NTZ", "MAKE_INTERVAL", "VALIDATE_UTF8", "AES_DECRYPT")} | {"MOD": "TRY_MOD"}
#: Spark's cast functions (``INT(x)`` is ``CAST(x AS INT)``).
_CAST_FUNCTIONS = {"TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE", "DECIMAL", "BOOLEAN", "DATE",
                   "TIMESTAMP", "BINARY"}
#: Conditional functions: an argument is evaluated only while the ones before it are NULL.
_COALESCING = {"COALESCE", "NVL", "IFNULL"}


def guard_sql(sql: str, source_row: SourceRow | None = None) -> GuardedSql:
    """Rewrite a row-wise ``[transform] sql`` so that no row can make it throw; see the module doc.

    Raises ``PipelineConfigError`` for a SQL that does not parse, holds more than one statement,
    is not a query, already names ``_sql_error`` (or ``_source_row``), or has a failure-prone expression where a failing
    row cannot be flagged (a subquery, a WITH clause, a JOIN condition, a lambda, GROUP BY, ...).
    """
    tree = parse_statement(sql, _KEY)
    tops = list(top_selects(tree, _KEY))
    for node in tree.walk():
        if isinstance(node, exp.Identifier) and node.name.lower() in (SQL_ERROR, SOURCE_ROW):
            name = node.name.lower()
            raise PipelineConfigError(_KEY, f"names {name}, a column the engine adds for the rows an "
                                      "expression failed on", f"rename it: {name} is added to the SELECT list")
        if _guarded(node) and (place := misplaced(node, tops, ("expressions", "where"))):
            raise PipelineConfigError(_KEY, f"has {_text(node)} {place}, where a row it fails on cannot be flagged "
                                      "(under ANSI mode one bad value would fail every retry of the batch)",
                                      "move it into the SELECT list or the WHERE of the outer query, or write its "
                                      "try_ form yourself (try_cast, try_add, ...) to take NULL for a bad value")
    texts: list[str] = []
    for select in tops:
        texts += _guard_select(select, source_row)
    return GuardedSql(tree.sql(dialect=AnsiSpark), tuple(texts))


def _guard_select(select: exp.Select, source_row: SourceRow | None) -> list[str]:
    guards = _Guards()
    where = select.args.get("where")
    if where is not None:
        cond = guards.walk(where.this, None)
        if guards.failures:
            cond = exp.or_(_p(cond), _p(exp.or_(*(_p(f) for _, f in guards.failures))))
        where.set("this", cond)
    select.set("expressions", [guards.walk(e, None) for e in select.expressions])
    flag: exp.Expr = exp.Case(ifs=[exp.If(this=f, true=exp.Literal.string(text)) for text, f in guards.failures]) \
        if guards.failures else exp.cast(exp.null(), exp.DataType.build("STRING"))
    added = [exp.alias_(flag, SQL_ERROR)]
    if source_row is not None:
        added.append(exp.alias_(_source_row(select, source_row, flag if guards.failures else None), SOURCE_ROW))
    select.set("expressions", [*select.expressions, *added])
    return [text for text, _ in guards.failures]


def _source_row(select: exp.Select, source_row: SourceRow, flag: exp.Expr | None) -> exp.Expr:
    """The JSON of the row ``select`` read from the view, where ``flag`` (the failed expression's text)
    is set or on every row; NULL when ``select`` does not read the view itself."""
    nothing = exp.cast(exp.null(), exp.DataType.build("STRING"))
    tables = [t for t in select.find_all(exp.Table)
              if t.name.lower() == source_row.view and t.find_ancestor(exp.Select) is select]
    if not tables or (flag is None and not source_row.every_row):
        return nothing
    every_column = exp.Column(this=exp.Star(), table=exp.to_identifier(tables[0].alias_or_name))
    row = _call("TO_JSON", _call("STRUCT", every_column),
                _call("MAP", exp.Literal.string("ignoreNullFields"), exp.Literal.string("false")))
    if source_row.every_row or flag is None:
        return row
    return exp.Case(ifs=[exp.If(this=exp.not_(_is_null(flag)), true=row)])


class _Guards:
    """Rewrites expressions to their try forms, collecting (text, failure condition) in evaluation order."""

    def __init__(self) -> None:
        self.failures: list[tuple[str, exp.Expr]] = []

    def walk(self, node: exp.Expr, reached: exp.Expr | None) -> exp.Expr:
        """``node`` rewritten; ``reached`` is the condition under which Spark evaluates it (None: always)."""
        if isinstance(node, (exp.Query, exp.Lambda)):
            return node  # nothing to guard there (``guard_sql`` refused it otherwise)
        text = _text(node) if _guarded(node) else None
        self._children(node, reached)
        if text is None:
            return node
        try_form, failed = _try_form(node)
        self.failures.append((text, _when(reached, failed)))
        return try_form

    def _children(self, node: exp.Expr, reached: exp.Expr | None) -> None:
        if isinstance(node, (exp.And, exp.Or)):  # the right side is evaluated unless the left decides
            left = self._set(node, "this", reached)
            undecided = _coalesce(left, exp.true()) if isinstance(node, exp.And) else \
                exp.not_(_coalesce(left, exp.false()))
            self._set(node, "expression", _when(reached, undecided))
        elif isinstance(node, exp.If):
            cond = _coalesce(self._set(node, "this", reached), exp.false())
            self._set(node, "true", _when(reached, cond))
            self._set(node, "false", _when(reached, exp.not_(cond)))
        elif isinstance(node, exp.Case):  # WHEN i is evaluated while no WHEN before it matched
            operand = self._set(node, "this", reached) if node.args.get("this") else None  # CASE x WHEN v
            for branch in node.args["ifs"]:
                cond = self._set(branch, "this", reached)
                matched = _coalesce(cond if operand is None else exp.EQ(this=_p(operand), expression=_p(cond)),
                                    exp.false())
                self._set(branch, "true", _when(reached, matched))
                reached = _when(reached, exp.not_(matched))
            self._set(node, "default", reached)
        elif _is_call(node, _COALESCING):  # argument i is evaluated while those before it are NULL
            args = []
            for arg in node.expressions:
                args.append(self.walk(arg, reached))
                reached = _when(reached, _is_null(args[-1]))
            node.set("expressions", args)
        elif _is_call(node, {"NVL2"}) and len(node.expressions) == 3:  # NVL2(a, b, c): b if a is not NULL, else c
            a = self.walk(node.expressions[0], reached)
            b = self.walk(node.expressions[1], _when(reached, exp.not_(_is_null(a))))
            c = self.walk(node.expressions[2], _when(reached, _is_null(a)))
            node.set("expressions", [a, b, c])
        else:
            for key, value in list(node.args.items()):
                if isinstance(value, exp.Expr):
                    self._set(node, key, reached)
                elif isinstance(value, list):
                    node.set(key, [self.walk(v, reached) if isinstance(v, exp.Expr) else v for v in value])

    def _set(self, node: exp.Expr, key: str, reached: exp.Expr | None) -> exp.Expr:
        """Rewrite the argument ``key`` of ``node`` in place (a missing one reads as NULL)."""
        value = node.args.get(key)
        if not isinstance(value, exp.Expr):
            return exp.null()
        value = self.walk(value, reached)
        node.set(key, value)
        return value


def _is_call(node: exp.Expr, names: set[str] | dict[str, str]) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.upper() in names


def _guarded(node: exp.Expr) -> bool:
    """Whether ``node`` can throw on some rows and not others, and ``_try_form`` has its guard."""
    if type(node) is exp.Cast:  # not TryCast, a subclass
        failable = not node.to.is_type(exp.DType.TEXT)
    elif isinstance(node, (exp.IntDiv, *_OPERATORS)):
        failable = True
    elif isinstance(node, exp.Anonymous):
        name, args = node.name.upper(), node.expressions
        failable = (name in _TWINS or name == "PMOD" or (name in _CAST_FUNCTIONS and len(args) == 1)
                    or (name == "ELEMENT_AT" and len(args) == 2 and not _is_string(args[1])))
    elif isinstance(node, exp.Bracket):
        failable = len(node.expressions) == 1 and not _is_string(node.expressions[0])
    else:
        return False
    return failable and _varies(node)


def _is_string(node: exp.Expr) -> bool:
    """A string literal index: a map key or a struct field, never an array index that could be out of range."""
    return isinstance(node, exp.Literal) and node.is_string


def _varies(node: exp.Expr) -> bool:
    """Whether ``node`` depends on the row: it reads a column (or a lambda's variable)."""
    return node.find(exp.Column) is not None or node.find_ancestor(exp.Lambda) is not None


def _try_form(node: exp.Expr) -> tuple[exp.Expr, exp.Expr]:
    """``node`` (its children already rewritten) as its non-throwing form, and the test that it failed."""
    if isinstance(node, exp.Cast):
        return _null_on_failure(exp.TryCast(this=node.this, to=node.to, safe=True), [node.this])
    if isinstance(node, (exp.IntDiv, *_OPERATORS)):
        left, right = node.this, node.expression
        if isinstance(node, exp.IntDiv):
            return _null_on_failure(_unless_zero(left, right, exp.IntDiv(this=_c(left), expression=_c(right))),
                                    [left, right])
        return _null_on_failure(_call(_OPERATORS[type(node)], left, right), [left, right])
    if isinstance(node, exp.Bracket):
        (key,) = node.expressions
        bad = _out_of_range(node.this, key, first=0)
        node.set("expressions", [exp.If(this=bad, true=exp.null(), false=key)])
        return node, _all(*_not_null([node.this, key]), _c(bad))
    name, args = node.name.upper(), node.expressions
    if name in _CAST_FUNCTIONS:
        return _null_on_failure(exp.TryCast(this=args[0], to=exp.DataType.build(name), safe=True), args)
    if name == "PMOD":
        dividend, divisor = args
        return _null_on_failure(_unless_zero(dividend, divisor, _call("PMOD", *args)), args)
    if name == "ELEMENT_AT":
        array, key = args
        bad = _out_of_range(array, key, first=1)
        return (_call("TRY_ELEMENT_AT", array, exp.If(this=bad, true=exp.null(), false=_c(key))),
                _all(*_not_null(args), _c(bad)))
    try_form, failed = _null_on_failure(_call(_TWINS[name], *args), args)
    if name == "PARSE_URL":  # NULL is also a valid URL without the part: one that parses has a protocol or a path
        failed = _all(failed, *(_is_null(_call("TRY_PARSE_URL", args[0], exp.Literal.string(part)))
                                for part in ("PROTOCOL", "PATH")))
    elif name == "VARIANT_GET":  # NULL is also a missing path or a JSON null: the value must be there to fail the cast
        value = _call("TRY_VARIANT_GET", args[0], args[1])
        failed = _all(failed, exp.not_(_is_null(value)), exp.not_(_call("IS_VARIANT_NULL", _c(value))))
    return try_form, failed


def _null_on_failure(try_form: exp.Expr, inputs: list[exp.Expr]) -> tuple[exp.Expr, exp.Expr]:
    return try_form, _all(*_not_null(inputs), _is_null(try_form))


def _unless_zero(left: exp.Expr, right: exp.Expr, value: exp.Expr) -> exp.Expr:
    """``value`` (``a DIV b``, ``pmod(a, b)``), or NULL where ``try_mod(a, b)`` is: a zero divisor, a bad string."""
    return exp.If(this=_is_null(_call("TRY_MOD", left, right)), true=exp.null(), false=value)


def _out_of_range(container: exp.Expr, key: exp.Expr, first: int) -> exp.Expr:
    """Whether ``key`` is outside an array (``first``: 0 for ``[]``, 1 for ``element_at``, which also counts
    from the end). FALSE for a map, whose key is compared as a string so that any key type analyses."""
    index = exp.TryCast(this=exp.cast(_c(key), exp.DataType.build("STRING")), to=exp.DataType.build("BIGINT"),
                        safe=True)
    size = _call("SIZE", container)
    within = exp.Between(this=_call("ABS", index) if first else index, low=exp.Literal.number(first),
                         high=size if first else exp.Sub(this=size, expression=exp.Literal.number(1)))
    is_array = exp.Like(this=_call("TYPEOF", container), expression=exp.Literal.string("array%"))
    return _all(is_array, exp.not_(_coalesce(within, exp.false())))


def _call(name: str, *args: exp.Expr) -> exp.Anonymous:
    return exp.Anonymous(this=name, expressions=[_c(a) for a in args])


def _c(node: exp.Expr) -> exp.Expr:
    """A copy: a sqlglot node has one parent, and the guards repeat the query's expressions."""
    return node.copy()


def _p(node: exp.Expr) -> exp.Paren:
    return exp.Paren(this=_c(node))


def _coalesce(node: exp.Expr, default: exp.Expr) -> exp.Expr:
    return _call("COALESCE", node, default)


def _is_null(node: exp.Expr) -> exp.Expr:
    return exp.Is(this=_p(node), expression=exp.null())


def _not_null(nodes: list[exp.Expr]) -> list[exp.Expr]:
    return [exp.not_(_is_null(n)) for n in nodes]


def _all(*conds: exp.Expr) -> exp.Expr:
    return exp.and_(*(_p(c) for c in conds), copy=False)


def _when(reached: exp.Expr | None, cond: exp.Expr) -> exp.Expr:
    """``cond``, counted only where Spark evaluates the expression (``reached``; None: always)."""
    return cond if reached is None else _all(reached, cond)
