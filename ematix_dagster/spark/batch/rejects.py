"""Rows that would fail every retry of their batch, set aside with a reason instead (no poison row).

A row whose group key is too long for a PostgreSQL index, or whose window starts before the
earliest instant PostgreSQL holds, makes the target's (or the state store's) write fail; the batch
is then replayed and fails again, forever, on that one row. Such rows are classified in Spark
after the SQL, like late rows: they update no window, are counted per reason
(``rejected_rows_total{reason}``) and go to the dead-letter target when there is one:

* ``sql_error``: a guarded ``[transform] sql`` expression failed on the row
  (``ematix_dagster.spark.plans.safe_sql``: its ``_sql_error`` column names the expression);
* ``key_too_large``: the group key's string and binary values take more than
  :data:`MAX_KEY_BYTES` bytes, with a PostgreSQL target or state store (a btree entry holds at
  most 2,704 bytes, and the window start and the row's overhead share it);
* ``out_of_range``: with a PostgreSQL target, a window of the row would start before 4713 BC.
"""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.columns import EVENT_TS, SQL_ERROR
from ematix_dagster.spark.batch.reasons import Rule
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.targets.pg_types import PG_MIN_US

#: the post-SQL reasons, in the order a row is judged
REJECT_REASONS = ("sql_error", "key_too_large", "out_of_range")
#: the most bytes of string and binary group values one key may hold when PostgreSQL indexes it
MAX_KEY_BYTES = 2_000


def reject_rules(spec: PipelineSpec, types: dict[str, T.DataType]) -> list[Rule]:
    """The rules a post-SQL row is rejected by, in :data:`REJECT_REASONS`' order (none may apply)."""
    window = spec.window
    rules: list[Rule] = []
    if SQL_ERROR in types:
        rules.append((F.col(SQL_ERROR).isNotNull(), "sql_error"))
    postgres_target = spec.target.kind == "postgres"
    if postgres_target or spec.state_store.kind == "postgres":
        sized = [F.coalesce(F.octet_length(F.col(g)), F.lit(0)) for g in window.group_by
                 if isinstance(types[g], (T.StringType, T.BinaryType))]
        if sized:
            total = sized[0]
            for size in sized[1:]:
                total = total + size
            rules.append((total > F.lit(MAX_KEY_BYTES), "key_too_large"))
    if postgres_target:
        span_us = (window.duration_ms or window.max_session_duration_ms or 0) * 1_000
        rules.append((F.unix_micros(EVENT_TS) < F.lit(PG_MIN_US + span_us), "out_of_range"))
    return rules
