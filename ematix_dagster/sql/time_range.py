"""A pipeline's SQL restricted to a range of event time, for a backfill (docs/contract/backfill.md).

A backfill recomputes the windows of a range from the rows whose event time can fall in them:
every reference to the ``source`` view reads those rows only, so the SQL, its dead letters and the
window caps see what the range holds and nothing of the rest of the archive.

>>> restricted_to("SELECT k, _event_ts FROM source WHERE v > 0", 10, 20)
'SELECT k, _event_ts FROM (SELECT * FROM source WHERE _event_ts >= TIMESTAMP_MICROS(10) AND _event_ts < TIMESTAMP_MICROS(20)) AS source WHERE v > 0'
"""

from __future__ import annotations

from sqlglot import exp

from ematix_dagster.columns import EVENT_TS, SOURCE_VIEW
from ematix_dagster.sql.parsing import parse_statement, text


def _in_range(lo_us: int, hi_us: int) -> str:
    return (f"SELECT * FROM {SOURCE_VIEW} WHERE {EVENT_TS} >= TIMESTAMP_MICROS({lo_us}) "
            f"AND {EVENT_TS} < TIMESTAMP_MICROS({hi_us})")


def restricted_to(sql: str | None, lo_us: int, hi_us: int, key: str = "transform.sql") -> str:
    """``sql`` (None: every column of ``source``) over the rows with ``lo_us <= _event_ts < hi_us``."""
    if sql is None:
        return _in_range(lo_us, hi_us)
    tree = parse_statement(sql, key)
    for table in list(tree.find_all(exp.Table)):
        if table.name.lower() == SOURCE_VIEW and not table.args.get("db"):
            alias = table.alias or SOURCE_VIEW
            table.replace(exp.Subquery(this=parse_statement(_in_range(lo_us, hi_us), key),
                                       alias=exp.TableAlias(this=exp.to_identifier(alias))))
    return text(tree)


__all__ = ["restricted_to"]
