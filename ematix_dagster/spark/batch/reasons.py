"""Why a row updates no window, as ordered rules: (condition, class) pairs, the first that holds wins.

One list of rules serves two readings. The exact plans write it as the string ``_reason`` column
(:func:`reason_column`), which the dead-letter rows and the per-source counters read; a tumbling
plan whose lateness the driver decides writes it straight into its grouping slot
(``spark.plans.windows.kind_plan.rules_slot``), with no string column per row.
"""

from __future__ import annotations

from typing import Callable, Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F

#: a condition on a row and the class of the rows it holds for
Rule = tuple[Column, str]


def first_holding(rules: Sequence[Rule], value: Callable[[str], Column]) -> Column:
    """``value(class)`` of the first rule that holds for a row, NULL where none does (a condition
    that is NULL does not hold); a CASE the caller may give an ``otherwise``."""
    (condition, name), *rest = rules
    case = F.when(condition, value(name))
    for condition, name in rest:
        case = case.when(condition, value(name))
    return case


def reason_column(rules: Sequence[Rule]) -> Column:
    """The class of the first rule that holds for a row, NULL where none does."""
    return first_holding(rules, F.lit)
