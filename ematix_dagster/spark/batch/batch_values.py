"""A batch's own values (batch time, lateness bounds) as columns of a joined one-row relation.

Spark compiles a plan's expressions to Java (whole-stage code generation) and caches the code by
its text. A literal of a numeric or time type is written into that text, so a plan holding this
batch's watermark as a literal is new code every batch: Spark compiles it again and the JVM
interprets, profiles and JIT-compiles it again, a large share of a plain pipeline's CPU, most
of it in the JIT's compiler threads. Read from a column of a joined one-row relation
instead, the values are data: every batch runs the code the first one generated.

The join is a cartesian product with the one row in each task (the ``shuffle_replicate_nl`` hint): a
broadcast, Spark's choice for a relation this small, builds and ships a new broadcast variable every
batch, where reading the row in each task costs next to nothing (figures: benchmarks/README.md,
"Measurements behind the code").

    rows = with_batch_values(rows, batch_time_us=1_700_000_000_000_000, closed_before=None,
                             emitted_before=None)
    rows.select(F.col(BATCH_TIME))  # the same value on every row
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from ematix_dagster.columns import BATCH_TIME, BATCH_VALUES, CLOSED_BEFORE, EMITTED_BEFORE


def with_batch_values(df: DataFrame, batch_time_us: int, closed_before: int | None,
                      emitted_before: int | None) -> DataFrame:
    """``df`` with the ``BATCH_VALUES`` columns (BIGINT µs, NULL for None) added last."""
    values = {BATCH_TIME: batch_time_us, CLOSED_BEFORE: closed_before, EMITTED_BEFORE: emitted_before}
    # Every column nullable whatever its value (``IF(TRUE, v, NULL)``): a column known not to be
    # NULL compiles to other code than one that may be, and the first batch's bounds are NULL.
    cells = ", ".join(f"CAST(IF(TRUE, {'NULL' if value is None else int(value)}, NULL) AS BIGINT)"
                      for value in map(values.__getitem__, BATCH_VALUES))
    # An inline table is a local relation built in the JVM (no Python worker); its values stay
    # data through the optimizer, which folds only literals and aliases of literals.
    one_row = df.sparkSession.sql(f"SELECT * FROM VALUES ({cells}) AS batch({', '.join(BATCH_VALUES)})")
    return df.crossJoin(one_row.hint("shuffle_replicate_nl"))
