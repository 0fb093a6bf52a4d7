"""Why a row updates no window, as ordered rules: (condition, class) pairs, the first that holds wins.

One list of rules serves two readings. The exact plans write it as the string ``_reason`` column
(:func:`reason_column`), which the dead-letter rows and the per-source counters read; a tumbling
plan whose lateness the driver decides writes it straight into its grouping slot
(``spark.windows.base.rules_slot``), with no string column per row.
"""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F

#: a condition on a row and the class of the rows it holds for
Rule = tuple[Column, str]


def reason_column(rules: Sequence[Rule]) -> Column:
    """The class of the first rule that holds for a row, NULL where none does (a condition that is
    NULL does not hold)."""
    (condition, name), *rest = rules
    reason = F.when(condition, F.lit(name))
    for condition, name in rest:
        reason = reason.when(condition, F.lit(name))
    return reason
