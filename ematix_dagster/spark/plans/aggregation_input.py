"""An aggregation's input column as the aggregators see it (``streaming.aggregators.SparkInput``).

Its type tests (integral, numeric, orderable) and the canonical form distinct counting hashes or
collects: docs/contract/aggregators.md's one cast policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
NUMERIC = INTEGRAL + (T.FloatType, T.DoubleType, T.DecimalType)


def canonical(col: Column, dtype: T.DataType) -> Column:
    """docs/contract/aggregators.md's one cast policy for distinct counting: BIGINT or canonical string.

    Spark's HLL skips the empty string, which docs/README.md counts as a value; it is hashed as the
    single byte 0xFF, which no UTF-8 string encodes to, so it cannot collide with a real value.
    """
    if isinstance(dtype, INTEGRAL):
        return col.cast("bigint")
    if isinstance(dtype, T.TimestampType):
        return F.date_format(col, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'")
    if isinstance(dtype, T.TimestampNTZType):
        return F.date_format(col, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS")
    if isinstance(dtype, T.BinaryType):
        return F.base64(col)
    return col.cast("string")


def _hll_input(col: Column, dtype: T.DataType) -> Column:
    value = canonical(col, dtype)
    if isinstance(dtype, INTEGRAL):
        return value
    # A string's UTF-8 bytes as Spark holds them: the sketch DataSketches' update(String) would
    # build, without encode()'s decoding to a Java string and encoding back.
    return F.when(value == "", F.unhex(F.lit("FF"))).otherwise(value.cast("binary"))


@dataclass(frozen=True)
class AggregationInput:
    """One aggregation's input column as :class:`~ematix_dagster.streaming.aggregators.SparkInput`.

    ``projected``: where the canonical forms go (:class:`~ematix_dagster.spark.plans.windows.kind_plan.Aggregates`):
    the names' prefix and the list of columns projected before the groupBy; None: inline.
    """

    column: Column | None
    dtype: T.DataType | None
    projected: tuple[str, list[Column]] | None = None
    functions = F

    @property
    def integral(self) -> bool:
        return isinstance(self.dtype, INTEGRAL)

    @property
    def decimal(self) -> bool:
        return isinstance(self.dtype, T.DecimalType)

    @property
    def numeric(self) -> bool:
        return isinstance(self.dtype, NUMERIC)

    @property
    def orderable(self) -> bool:
        return not isinstance(self.dtype, (T.MapType, T.BinaryType))

    @property
    def type_name(self) -> str:
        assert self.dtype is not None
        return self.dtype.simpleString()

    def canonical(self) -> Column:
        assert self.column is not None and self.dtype is not None
        return self._row_input(canonical(self.column, self.dtype))

    def hll_input(self) -> Column:
        assert self.column is not None and self.dtype is not None
        return self._row_input(_hll_input(self.column, self.dtype))

    def _row_input(self, value: Column) -> Column:
        if self.projected is None:
            return value
        prefix, columns = self.projected
        name = f"{prefix}{len(columns)}"
        columns.append(value.alias(name))
        return F.col(name)

