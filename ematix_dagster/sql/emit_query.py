"""Read a windowed pipeline's ``[emit] sql`` into a release plan (docs/contract/delayed-windows.md).

``[emit] sql`` delays a windowed pipeline's rows: it is exactly ``SELECT * FROM windows WHERE
<predicate>``, the predicate calling ``WATERMARK_TS()`` as a row pipeline's WHERE does, and it is
read by the same :func:`~ematix_dagster.sql.release_plan.release_plan`. What is checked here is what
makes it an emission schedule rather than a filter of values:

- the shape: ``SELECT *`` over the view ``windows`` and nothing else (no projection, join or
  clause besides the WHERE), so every emitted row keeps its columns and only its time changes;
- the predicate's columns (a property of the grammar's walk, :class:`~ematix_dagster.sql.grammar.Columns`):
  window bounds, ``session_id`` and group columns only. A window's rows
  (early, final, corrections, retracts) then share one release time for as long as its bounds do,
  so they leave in the order they were emitted; an aggregate column would let a correction leave
  before the final it corrects, or never;
- the predicate's grammar (``sql.grammar``): what the engine computes over the emitted rows exactly
  as Spark would, and nothing whose value depends on other rows.

>>> plan = emit_plan("SELECT * FROM windows WHERE window_end + INTERVAL 1 HOUR <= WATERMARK_TS()",
...                  ("window_start", "window_end", "user_id"))
>>> plan.branches
(ReleaseBranch(guard=None, release_at="window_end + INTERVAL '1' HOUR", strict=False),)
>>> emit_plan("SELECT * FROM windows WHERE n > 3 AND window_end <= WATERMARK_TS()", ("window_end",))
Traceback (most recent call last):
...
ematix_dagster.errors.PipelineConfigError: emit.sql: the predicate names n, ...
"""

from __future__ import annotations

from typing import NoReturn, Sequence

from sqlglot import exp

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.sql.grammar import Columns, check_predicate
from ematix_dagster.sql.parsing import CLAUSES, parse_statement, text
from ematix_dagster.sql.release_plan import WATERMARK_TS, ReleasePlan, release_plan

#: the view the ``[emit] sql`` reads: the pipeline's emitted rows
VIEW = "windows"
KEY = "emit.sql"
_SHAPE = f"SELECT * FROM {VIEW} WHERE <predicate>"
#: what a ``SELECT * FROM windows WHERE`` holds (sqlglot's argument keys); anything else is refused
_PARTS = ("expressions", "from_", "where")


def emit_plan(sql: str, columns: Sequence[str]) -> ReleasePlan:
    """The release plan of ``sql``, whose predicate may name only ``columns`` (compared as Spark does,
    ignoring case). A ``PipelineConfigError`` on ``emit.sql`` names what is wrong and how to write it."""
    tree = parse_statement(sql, KEY)
    if not isinstance(tree, exp.Select):
        _fail(f"is not a single SELECT (it is {type(tree).__name__.upper()})")
    if len(tree.expressions) != 1 or not isinstance(tree.expressions[0], exp.Star):
        _fail(f"selects {', '.join(text(e) for e in tree.expressions)}: the emitted rows keep their columns")
    source = tree.args.get("from_")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or table.name.lower() != VIEW or table.db or table.alias:
        _fail(f"reads {text(source) if source is not None else 'nothing'}; it reads the view {VIEW}, the "
              "pipeline's emitted rows")
    for part, value in tree.args.items():
        if value and part not in _PARTS:
            _fail(f"has {'JOIN' if part == 'joins' else CLAUSES.get(part, part.rstrip('_').upper())}: only a WHERE may "
                  f"follow FROM {VIEW}")
    where = tree.args.get("where")
    if where is None:
        _fail(f"has no WHERE: it is the emission schedule, calling {WATERMARK_TS}()")
    check_predicate(where.this, KEY, Columns(
        tuple(columns), VIEW, "which is not a window bound, session_id or group column: a row's release time may "
        "depend only on its window and group (an aggregate changes with each correction), so that a window's "
        "corrections and retracts follow its final in order"))
    plan = release_plan(sql, KEY)
    if plan is None:
        _fail(f"does not call {WATERMARK_TS}(): without it the WHERE would drop emitted rows (and the corrections "
              "and retracts that follow them) instead of delaying them", f"compare a window bound with {WATERMARK_TS}()")
    return plan


def _fail(problem: str, fix: str = f"write exactly {_SHAPE}") -> NoReturn:
    raise PipelineConfigError(KEY, problem, fix)
