"""The query a row pipeline's batches run (docs/contract/row-pipelines.md).

A row pipeline writes its SQL's SELECT list as it is, but the engine needs each row's event time
besides (the release order and, with a ``[target] key``, which row of a key wins within a batch),
and the SELECT may leave ``_event_ts`` out. :func:`row_query` appends it, in µs, as
:data:`~ematix_dagster.columns.EVENT_US`, to the query the release plan made of it (the original
when it does not call ``WATERMARK_TS()``).

>>> print(row_query("SELECT id FROM source WHERE id > 0")[0])
SELECT id, UNIX_MICROS(_event_ts) AS _event_us FROM source WHERE id > 0
"""

from __future__ import annotations

from sqlglot import exp

from ematix_dagster.columns import EVENT_TS, EVENT_US
from ematix_dagster.sql.parsing import parse_statement, text, top_selects
from ematix_dagster.sql.release_plan import ReleasePlan, release_plan


def row_query(sql: str, key: str = "transform.sql") -> tuple[str, ReleasePlan | None]:
    """(the query Spark runs, the release plan or None) for a row pipeline's ``sql``."""
    plan = release_plan(sql, key)
    tree = parse_statement(plan.sql if plan is not None else sql, key)
    for select in top_selects(tree, key):  # each branch of a UNION
        event_us = exp.Anonymous(this="UNIX_MICROS", expressions=[exp.column(EVENT_TS)])
        select.set("expressions", [*select.expressions, exp.alias_(event_us, EVENT_US)])
    return text(tree), plan
