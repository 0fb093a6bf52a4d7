"""count, sum, min, max, first, last, avg.

Ordering follows Spark's, so the driver and the executors agree: NULLs are skipped and NaN sorts
above every other float. first/last break event-time ties by value (docs/contract/aggregators.md), which makes the
answer independent of how rows fall into micro-batches.
"""

from __future__ import annotations

from decimal import Decimal
from operator import add, itemgetter
from typing import TYPE_CHECKING, Any, Sequence, cast

import numpy as np
import pyarrow as pa

from ematix_dagster.columns import TS
from ematix_dagster.errors import AggregationOverflow
from ematix_dagster.spec import Aggregation
from ematix_dagster.streaming.aggregators.aggregator import (
    BIGINT_MAX,
    BIGINT_MIN,
    NONE,
    PAIR_TYPES,
    SCALAR_TYPES,
    Aggregator,
    SparkInput,
    describe_value,
    not_none,
    order_key,
)

if TYPE_CHECKING:
    from pyspark.sql import Column

_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def _column(spark: SparkInput) -> Column:
    """The aggregated column of an aggregation over one (every one but ``count(*)``)."""
    return cast("Column", spark.column)


def _added(accs: Sequence[Any], partials: Sequence[Any]) -> list[Any]:
    """``accs[r] + partials[r]`` at C speed, a new group's accumulator (None) taking its partial as
    it is. A window still open takes held groups and new ones in one batch: NumPy's object arrays
    add the held ones and place the new ones without a Python call per row (0 + partial would
    turn a partial of -0.0 into 0.0)."""
    if None not in accs:
        return list(map(add, accs, partials))
    n = len(accs)
    if accs.count(None) == n:
        return list(partials)
    totals, column = np.fromiter(accs, dtype=object, count=n), np.fromiter(partials, dtype=object, count=n)
    new = totals == None  # noqa: E711 (elementwise on an object array)
    held = ~new
    totals[held] += column[held]
    totals[new] = column[new]
    return cast(list, totals.tolist())


def _added_in_place(column: np.ndarray, rows: np.ndarray, partials: np.ndarray) -> None:
    """``column[rows[r]] += partials[r]``, a repeated row adding each of its partials in order."""
    np.add.at(column, rows, partials)


def _needs_number(spec: Aggregation, spark: SparkInput) -> tuple[str, str] | None:
    if spark.numeric:
        return None
    return (f"{spec.agg} needs a number, {spec.column!r} is {spark.type_name}",
            "cast it in [transform] sql or use another aggregator")


class Count(Aggregator):
    """count(*) and count(col): the partial is already a count."""

    state_types = frozenset({NONE, int})
    expected = "a count (an integer)"

    def spark_partials(self, spark: SparkInput) -> list[Column]:
        F = spark.functions
        return [F.count(F.lit(1) if spark.column is None else spark.column)]

    def merge(self, acc: Any, partial: Any) -> Any:
        return (acc or 0) + (partial or 0)

    def merge_column(self, accs: Sequence[Any], partials: Sequence[Any]) -> list[Any]:
        if None not in partials:  # Spark's counts are never NULL
            return _added(accs, partials)
        return super().merge_column(accs, partials)

    array_type = pa.int64()
    array_empty = 0
    fold_array = staticmethod(_added_in_place)

    def result(self, acc: Any) -> Any:
        return acc or 0

    def result_column(self, accs: list[Any]) -> list[Any]:
        return accs if None not in accs else super().result_column(accs)

    additive_parts = 1

    def to_parts(self, acc: Any) -> tuple[Any, ...]:
        return (acc or 0,)

    def to_parts_column(self, accs: list[Any]) -> list[list[Any]]:
        return [accs] if None not in accs else super().to_parts_column(accs)

    def from_parts(self, parts: Sequence[Any]) -> Any:
        return parts[0]

    def from_parts_column(self, columns: Sequence[list[Any]]) -> list[Any]:
        return columns[0]


class Sum(Aggregator):
    """Integer sums are exact Python ints checked against BIGINT; float/decimal sums add up."""

    reads_input_type = True

    def __init__(self, integral: bool | None) -> None:
        # None: not known (``ematix-dagster check`` vets state without asking Spark for column types)
        self.integral = integral
        if integral is None:
            self.state_types = frozenset({NONE, int, float, Decimal})
            self.expected = "a sum (an integer, float or decimal)"
        elif integral:
            self.state_types = frozenset({NONE, int})
            self.expected = "an integer sum"
        else:
            self.state_types = frozenset({NONE, float, Decimal})
            self.expected = "a float or decimal sum"

    def input_problem(self, spec: Aggregation, spark: SparkInput) -> tuple[str, str] | None:
        return _needs_number(spec, spark)

    def spark_partials(self, spark: SparkInput) -> list[Column]:
        F, col = spark.functions, _column(spark)
        if spark.integral:
            # DECIMAL(38,0) cannot overflow here; the driver checks the BIGINT range with the window named.
            return [F.sum(col.cast("decimal(38,0)"))]
        if spark.decimal:
            return [F.sum(col)]
        return [F.sum(col.cast("double"))]

    def merge(self, acc: Any, partial: Any) -> Any:
        if partial is None:
            return acc
        if self.integral:
            partial = int(partial)
        total = partial if acc is None else acc + partial
        if self.integral and not BIGINT_MIN <= total <= BIGINT_MAX:
            raise AggregationOverflow("integer sum left the BIGINT range")
        return total

    def merge_column(self, accs: Sequence[Any], partials: Sequence[Any]) -> list[Any]:
        if None not in partials:  # no group whose values were all NULL
            if self.integral:
                partials = list(map(int, partials))  # Spark's DECIMAL(38,0) partial sums
            totals = _added(accs, partials)
            if not self.integral or not totals or (BIGINT_MIN <= min(totals) and max(totals) <= BIGINT_MAX):
                return totals
        return super().merge_column(accs, partials)  # row by row: also names a row that overflows

    # A float sum's column is typed while no group's values are all NULL (a NULL sum has no float);
    # -0.0 is the identity of IEEE addition, so a new group takes its first partial exactly (0.0
    # would turn a partial of -0.0 into 0.0). Integer and decimal sums stay Python values.
    array_type = pa.float64()
    array_empty = -0.0
    fold_array = staticmethod(_added_in_place)

    additive_parts = 2  # the sum, and how many non-empty accumulators it adds (none: NULL)

    def to_parts(self, acc: Any) -> tuple[Any, ...]:
        return (0, 0) if acc is None else (acc, 1)

    def to_parts_column(self, accs: list[Any]) -> list[list[Any]]:
        return [accs, [1] * len(accs)] if None not in accs else super().to_parts_column(accs)

    def from_parts(self, parts: Sequence[Any]) -> Any:
        total, summed = parts
        if not summed:
            return None
        if self.integral and not BIGINT_MIN <= total <= BIGINT_MAX:
            raise AggregationOverflow("integer sum left the BIGINT range")
        return total

    def from_parts_column(self, columns: Sequence[list[Any]]) -> list[Any]:
        """The sums as they are when every window summed something (and, BIGINT, stays in range)."""
        totals, summed = columns
        if 0 not in summed and (not self.integral or not totals
                                or (BIGINT_MIN <= min(totals) and max(totals) <= BIGINT_MAX)):
            return totals
        return super().from_parts_column(columns)

    def output_type(self, input_type: pa.DataType | None) -> pa.DataType:
        if pa.types.is_integer(input_type):
            return pa.int64()
        if pa.types.is_decimal(input_type):
            assert input_type is not None  # is_integer(None) above raises
            return pa.decimal128(38, input_type.scale)
        return pa.float64()


class Min(Aggregator):
    """The smallest non-null value; subclasses change the ordering or the direction."""

    largest = False
    state_types = SCALAR_TYPES | {NONE}
    expected = "a single value"
    reads_input_type = True

    def input_problem(self, spec: Aggregation, spark: SparkInput) -> tuple[str, str] | None:
        if spark.orderable:
            return None
        return f"{spec.agg} cannot order {spark.type_name} values", "aggregate an orderable column"

    def spark_partials(self, spark: SparkInput) -> list[Column]:
        F = spark.functions
        return [(F.max if self.largest else F.min)(spark.column)]

    def key(self, value: Any) -> Any:
        return order_key(value)

    def merge(self, acc: Any, partial: Any) -> Any:
        if partial is None:
            return acc
        if acc is None:
            return partial
        new, old = self.key(partial), self.key(acc)
        return partial if (new > old if self.largest else new < old) else acc

    def output_type(self, input_type: pa.DataType | None) -> pa.DataType:
        assert input_type is not None
        return input_type


class Max(Min):
    largest = True


class First(Min):
    """(event_ts, value) with the smallest event time; ties take the smallest value."""

    state_types = PAIR_TYPES
    looks_inside = True
    state_bytes = 145  # an (event time, value) pair

    def spark_partials(self, spark: SparkInput) -> list[Column]:
        F, col = spark.functions, _column(spark)
        pair = F.when(col.isNotNull(), F.struct(F.col(TS).alias("t"), col.alias("v")))
        return [(F.max if self.largest else F.min)(pair)]

    def from_arrow(self, columns: Sequence[list[Any]]) -> list[Any]:
        return [None if v is None else (v["t"], v["v"]) for v in columns[0]]

    def key(self, value: Any) -> Any:
        return (value[0], order_key(value[1]))

    def result(self, acc: Any) -> Any:
        return None if acc is None else acc[1]

    def check_state(self, acc: Any) -> str | None:
        if acc is None or (type(acc) is tuple and len(acc) == 2 and type(acc[0]) is int
                           and type(acc[1]) in SCALAR_TYPES):
            return None
        return f"expected an (event time µs, value) pair, got {describe_value(acc)}"

    def scan_contents(self, states: list[Any], types: set[type]) -> bool:
        pairs = not_none(states, types)
        return (set(map(len, pairs)) <= {2} and set(map(type, map(_FIRST, pairs))) <= {int}
                and set(map(type, map(_SECOND, pairs))) <= SCALAR_TYPES)


class Last(First):
    """(event_ts, value) with the largest event time; ties take the largest value."""

    largest = True


class Avg(Aggregator):
    """State is (sum, count) so that merging partials stays exact in count."""

    state_types = PAIR_TYPES
    looks_inside = True
    state_bytes = 110  # a (sum, count) pair

    def input_problem(self, spec: Aggregation, spark: SparkInput) -> tuple[str, str] | None:
        return _needs_number(spec, spark)

    def spark_partials(self, spark: SparkInput) -> list[Column]:
        F, col = spark.functions, _column(spark)
        return [F.sum(col.cast("double")), F.count(col)]

    def partial_names(self, name: str) -> tuple[str, ...]:
        return (name, name + "_n")

    def from_arrow(self, columns: Sequence[list[Any]]) -> list[Any]:
        return list(zip(columns[0], columns[1]))

    def merge(self, acc: Any, partial: Any) -> Any:
        if partial is None or not partial[1]:
            return acc
        if acc is None or not acc[1]:  # an empty (NULL, 0) pair is the empty accumulator too
            return (float(partial[0]), int(partial[1]))
        return (acc[0] + float(partial[0]), acc[1] + int(partial[1]))

    def result(self, acc: Any) -> Any:
        return None if acc is None or not acc[1] else acc[0] / acc[1]

    additive_parts = 2

    def to_parts(self, acc: Any) -> tuple[Any, ...]:
        return (0.0, 0) if acc is None or not acc[1] else acc

    def from_parts(self, parts: Sequence[Any]) -> Any:
        return (float(parts[0]), parts[1]) if parts[1] else None

    def output_type(self, input_type: pa.DataType | None) -> pa.DataType:
        return pa.float64()

    def check_state(self, acc: Any) -> str | None:
        if acc is None or (type(acc) is tuple and len(acc) == 2 and type(acc[0]) is float and type(acc[1]) is int):
            return None
        return f"expected a (float sum, count) pair, got {describe_value(acc)}"

    def scan_contents(self, states: list[Any], types: set[type]) -> bool:
        pairs = not_none(states, types)
        return (set(map(len, pairs)) <= {2} and set(map(type, map(_FIRST, pairs))) <= {float}
                and set(map(type, map(_SECOND, pairs))) <= {int})
