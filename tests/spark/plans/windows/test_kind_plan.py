"""The class slot (``spark.plans.windows.kind_plan``): a row's class and window start share one grouping column.

The ground truth is the rows themselves: grouped by their slot, each (class, start) pair must come
back exactly once, as it went in, with its rows counted; the window starts include the extremes a
start of whole milliseconds can take next to the class codes.
"""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ematix_dagster.columns import CLASS, SLOT, WINDOW_START
from ematix_dagster.spark.plans.windows.kind_plan import CLASSES, class_slot, rules_slot, slot_outputs

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
#: window starts of whole milliseconds nearest int64's two ends, and around 0
STARTS = [INT64_MIN - INT64_MIN % 1_000 + 1_000, -1_000, 0, 1_000, INT64_MAX - INT64_MAX % 1_000]


Pair = tuple[str | None, int | None]  # (class, window start)


def slot_groups(df: DataFrame, slot: Column) -> list[tuple[str | None, int | None, int]]:
    """``df`` grouped by ``slot``: each group's class and start read back from it, and its rows."""
    out = df.select(slot.alias(SLOT)).groupBy(SLOT).agg(*slot_outputs(WINDOW_START), F.count(F.lit(1)).alias("n")).toArrow()
    return sorted(zip(out.column(CLASS).to_pylist(), out.column(WINDOW_START).to_pylist(), out.column("n").to_pylist()),
                  key=repr)


def counted(pairs: list[Pair]) -> list[tuple[str | None, int | None, int]]:
    """The ground truth: each (class, start) pair with how many rows have it, ordered as :func:`slot_groups`."""
    return sorted(((c, s, n) for (c, s), n in Counter(pairs).items()), key=repr)


def test_every_class_and_start_comes_back_from_its_slot(spark: SparkSession) -> None:
    rows = [(None, s) for s in STARTS for _ in range(2)] + [(c, None) for c in CLASSES for _ in range(3)]
    rows.append(("late", None))
    df = spark.createDataFrame(rows, "cls string, start bigint")
    assert slot_groups(df, class_slot(F.col("cls"), F.col("start"))) == counted(rows)
    assert len(set(CLASSES)) == len(CLASSES) == 7


def test_a_class_the_slot_does_not_know_fails_the_job(spark: SparkSession) -> None:
    df = spark.createDataFrame([("late",), ("no_such_class",)], "cls string")
    with pytest.raises(Exception, match="a row of an unknown class: no_such_class"):
        df.select(class_slot(F.col("cls"), F.lit(0)).alias(SLOT)).groupBy(SLOT).count().collect()


def test_rules_give_the_slot_of_the_first_rule_that_holds(spark: SparkSession) -> None:
    """``rules_slot`` against the rows' flags read in order by hand: the first rule that holds names
    the class, a NULL condition does not hold, and a row no rule holds for keeps its start."""
    rows = [(a, b, s) for a in (True, False, None) for b in (True, False, None) for s in (STARTS[0], 60_000_000)]
    df = spark.createDataFrame(rows, "a boolean, b boolean, start bigint")
    rules = [(F.col("a"), "malformed"), (F.col("b"), "key_too_large")]
    pairs: list[Pair] = [("malformed", None) if a is True else ("key_too_large", None) if b is True else (None, start)
                         for a, b, start in rows]
    assert slot_groups(df, rules_slot(rules, F.col("start"))) == counted(pairs)
    assert pairs.count(("malformed", None)) == 6 and pairs.count(("key_too_large", None)) == 4
