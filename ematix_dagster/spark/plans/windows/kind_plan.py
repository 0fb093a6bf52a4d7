"""What a window kind's Spark plan hands back to the batch (see ``ematix_dagster.spark.plans.windows``).

A batch is one Spark job: one aggregation whose result carries the partials *and* the batch's
counters. Rows that update no window (late rows, and without ``[transform] sql`` the rows with a
bad event time) are not filtered out but grouped by their class into a few extra result rows
(``CLASS`` set, window and group columns NULL), so counting them costs a hash-aggregate slot
instead of a separate observation pass over every row. ``PRIMARY`` marks one copy of each input
row (a hopping row is copied into each of its windows), so counters count rows, not copies.

A fixed window's class shares one grouping column with its start (``class_slot``): a grouping
column of its own makes every batch's aggregation cost more in the executors.
Sliding windows keep a ``CLASS`` grouping column, as their start is a raw event time, which leaves
no int64 free for a code; sessions keep it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ematix_dagster.columns import BATCH_ID, BATCH_VALUES, CLASS, CORRUPT, REASON, SLOT
from ematix_dagster.spark.batch.reasons import Rule, first_holding
from ematix_dagster.spark.batch.rejects import REJECT_REASONS
from ematix_dagster.spec import Window

#: every class of a row that updates no window: ``late``, the pre-SQL reasons, the rejections'
CLASSES = ("late", "invalid_event_time", "future", "malformed", *REJECT_REASONS)
#: the slot of class ``CLASSES[i]`` is ``CLASS_SLOT_BASE + i``: int64s no fixed window's start
#: reaches (a start is a multiple of a whole number of milliseconds: the nearest is MIN + 808 µs)
CLASS_SLOT_BASE = -(2 ** 63)
#: the lowest slot a window's start takes: the slots below it are class codes
FIRST_WINDOW_SLOT = CLASS_SLOT_BASE + len(CLASSES)


def class_code(name: str) -> int:
    """The slot of the rows of class ``name`` (one of :data:`CLASSES`)."""
    return CLASS_SLOT_BASE + CLASSES.index(name)


def class_slot(cls: Column, start: Column) -> Column:
    """A row's grouping slot: its window's ``start`` when ``cls`` is NULL, else its class's code.

    A class outside :data:`CLASSES` fails the batch's job loudly rather than pass for a window.
    """
    slot = F.when(cls.isNull(), start)
    for i, name in enumerate(CLASSES):
        slot = slot.when(cls == F.lit(name), F.lit(CLASS_SLOT_BASE + i))
    return slot.otherwise(F.raise_error(F.concat(F.lit("a row of an unknown class: "), cls)))


def rules_slot(rules: Sequence[Rule], start: Column) -> Column:
    """A row's grouping slot straight from the rules why a row updates no window: the code of the
    first rule's class that holds, else ``start``.

    The same slot as :func:`class_slot` over the rules' ``_reason`` column, without that string
    column: a tumbling batch then needs one projection before its groupBy instead of two, and
    the JVM plans each batch's query faster.
    """
    return first_holding(rules, lambda name: F.lit(class_code(name))).otherwise(start) if rules else start


def slot_outputs(start_name: str) -> list[Column]:
    """The partials' ``CLASS`` and start (named ``start_name``) read back from the ``SLOT``
    grouping column: aggregate-list entries, evaluated once per result row."""
    slot = F.col(SLOT)
    cls = F.when(slot == F.lit(CLASS_SLOT_BASE), F.lit(CLASSES[0]))
    for i, name in enumerate(CLASSES[1:], start=1):
        cls = cls.when(slot == F.lit(CLASS_SLOT_BASE + i), F.lit(name))
    is_window = slot >= F.lit(FIRST_WINDOW_SLOT)
    return [cls.alias(CLASS), F.when(is_window, slot).alias(start_name)]


@dataclass(frozen=True)
class Aggregates:
    """A batch's aggregate columns and the per-row inputs they read by name.

    Spark generates code for an aggregate such as ``count`` or ``sum`` with its input expression,
    but an imperative one (``hll_sketch_agg``, ``collect_set``) evaluates its input expression row
    by row, interpreted; projected before the groupBy, the expression is generated code and the
    aggregate reads a column.
    """

    inputs: list[Column]  # projected onto the rows before the groupBy
    columns: list[Column]


def with_inputs(rows: DataFrame, inputs: Sequence[Column]) -> DataFrame:
    """``rows`` with the aggregates' projected inputs (the same frame when there are none: each
    DataFrame step is analysed on the driver, every batch)."""
    return rows.select("*", *inputs) if inputs else rows


@dataclass
class WindowedFrames:
    """The lazily built frames of a batch's window assignment.

    ``partials`` has one row per (``_ws`` window start, group columns) with the aggregators'
    partial columns and the hidden counters, plus one row per class of rows that update no
    window. ``class_rows`` builds its frame only when asked (dead letters of some class in the
    batch): every DataFrame step is analysed by Spark at once, and a batch pays for that even when
    the frame never runs.
    """

    partials: DataFrame
    #: the post-SQL rows of some classes (``late``, the rejected ones), with _batch_id and _reason
    class_rows: Callable[[Sequence[str]], DataFrame]
    #: the post-SQL rows, one per row (before a hopping row is copied), each with its ``CLASS`` (NULL:
    #: it updates a window): what ``spark.batch.executor_input`` reads the rows Spark aggregates from
    classified: DataFrame


def dead_letter_rows(rows: DataFrame, classes: Sequence[str], batch_id: int, helpers: Sequence[str]) -> DataFrame:
    """The rows of ``classes`` as dead letters: the plan's ``helpers`` columns, the batch values and
    the reader's corrupt-record column (NULL in a row that parsed) dropped, ``_batch_id`` and
    ``_reason`` (the class) added last."""
    return (rows.filter(F.col(CLASS).isin(*classes)).drop(*helpers, *BATCH_VALUES, CORRUPT, REASON)
            .withColumn(BATCH_ID, F.lit(batch_id).cast("bigint")).withColumn(REASON, F.col(CLASS)).drop(CLASS))


class PartialPlan(Protocol):
    """A window kind's plan for one run's batches.

    Made once per run from the window spec, the function of the gate column (true for rows that
    update windows) returning the aggregate columns and their projected inputs, and whether the
    rows come with a ``_reason`` column: its columns are built then, since each Column is a round
    trip to the JVM (several hundred a batch when built per batch). :meth:`frames` applies them to
    a batch: the SQL's output with the batch values' columns (``ematix_dagster.spark.batch.batch_values``),
    without ``_ts`` (the plan adds it from the output's ``_event_ts``).
    """

    #: the partials' column the kind's state takes as ``starts`` (``KindState.merge``)
    start_column: str
    #: the partials' column it takes as ``lasts`` (a partial session's last event time), if any
    last_column: str | None
    #: the partials come sorted by ``start_column`` (a kind whose state does not sort them itself)
    sort_by_start: bool

    def __init__(self, window: Window, aggregates: Callable[[Column], Aggregates], has_reason: bool) -> None: ...

    def frames(self, out: DataFrame, batch_id: int) -> WindowedFrames: ...
