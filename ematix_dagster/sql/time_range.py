"""A pipeline's SQL restricted to a range of event time, for a backfill (docs/contract/backfill.md).

A backfill recomputes the windows of a range from the rows whose event time can fall in them:
every read of the ``source`` view reads those rows only, so the SQL, its dead letters and the
window caps see what the range holds and nothing of the rest of the archive. A SELECT that reads
``source`` in its FROM gets the range as one more WHERE condition, so it still reads the view
itself (a failing row's dead letter then carries the row as read, ``_source_row``); any other
read of ``source`` (a join's right side) reads a subquery of the range instead.

>>> restricted_to("SELECT k, _event_ts FROM source WHERE v > 0", 10, 20)
'SELECT k, _event_ts FROM source WHERE v > 0 AND (source._event_ts >= TIMESTAMP_MICROS(10) AND source._event_ts < TIMESTAMP_MICROS(20))'
>>> restricted_to("SELECT d.x FROM dim AS d JOIN source ON d.k = source.k", 10, 20)
'SELECT d.x FROM dim AS d JOIN (SELECT * FROM source WHERE source._event_ts >= TIMESTAMP_MICROS(10) AND source._event_ts < TIMESTAMP_MICROS(20)) AS source ON d.k = source.k'
"""

from __future__ import annotations

from sqlglot import exp

from ematix_dagster.columns import EVENT_TS, SOURCE_VIEW
from ematix_dagster.sql.parsing import parse_statement, text


def _in_range(name: str, lo_us: int, hi_us: int) -> str:
    return f"{name}.{EVENT_TS} >= TIMESTAMP_MICROS({lo_us}) AND {name}.{EVENT_TS} < TIMESTAMP_MICROS({hi_us})"


def _reads_source(node: exp.Expr | None) -> bool:
    return isinstance(node, exp.Table) and node.name.lower() == SOURCE_VIEW and not node.args.get("db")


def restricted_to(sql: str | None, lo_us: int, hi_us: int, key: str = "transform.sql") -> str:
    """``sql`` (None: every column of ``source``) over the rows with ``lo_us <= _event_ts < hi_us``."""
    if sql is None:
        return f"SELECT * FROM {SOURCE_VIEW} WHERE {_in_range(SOURCE_VIEW, lo_us, hi_us)}"
    tree = parse_statement(sql, key)
    restricted = set()
    for select in list(tree.find_all(exp.Select)):
        from_ = select.args.get("from_")
        table = from_.this if from_ is not None else None
        if isinstance(table, exp.Table) and _reads_source(table):
            select.where(_in_range(table.alias_or_name, lo_us, hi_us), append=True, copy=False)
            restricted.add(id(table))
    for table in list(tree.find_all(exp.Table)):
        if _reads_source(table) and id(table) not in restricted:
            subquery = parse_statement(f"SELECT * FROM {SOURCE_VIEW} WHERE {_in_range(SOURCE_VIEW, lo_us, hi_us)}", key)
            table.replace(exp.Subquery(this=subquery, alias=exp.TableAlias(this=exp.to_identifier(table.alias_or_name))))
    return text(tree)


__all__ = ["restricted_to"]
