"""A distinct count's input in Spark hashes as DataSketches' own ``update`` does (docs/contract/aggregators.md).

The driver unions Spark's sketches with the ones stored by earlier runs, so the canonical form
each row is brought to before ``hll_sketch_agg`` must give the sketch DataSketches builds from the
same values: equal coupons (the images in DataSketches' compact form, which Java and C++ lay out
alike), checked against sketches built here in Python, inline and projected before the groupBy
alike. The empty string, which Spark's HLL would skip, counts as a value.
"""

from __future__ import annotations

from datasketches import hll_sketch
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.spark.plans.aggregation_input import AggregationInput

STRINGS = ["a", "é", "日本語", "a", "x" * 300, "Ünïcödé ✓", None]
INTS = [1, -1, 0, 2**62, 1, None]


def _python_sketch(values: list) -> bytes:
    sketch = hll_sketch(14)
    for v in values:
        if v is not None:
            sketch.update(v)
    return sketch.serialize_compact()


def _spark_sketches(spark, values: list, ddl: str, dtype: T.DataType) -> tuple[bytes, bytes]:
    """(inline, projected) sketches of ``values`` through the engine's canonical form."""
    df = spark.createDataFrame([(v,) for v in values], ddl)
    inline = AggregationInput(F.col("v"), dtype).hll_input()
    projected: list[Column] = []
    by_name = AggregationInput(F.col("v"), dtype, ("_in", projected)).hll_input()
    (a,) = df.agg(F.hll_sketch_agg(inline, 14)).collect()
    (b,) = df.select("*", *projected).agg(F.hll_sketch_agg(by_name, 14)).collect()
    return _compact(a[0]), _compact(b[0])


def _compact(image: bytes) -> bytes:
    """Java's image may be an updatable one (its list's empty slots included): compared as C++ lays it out."""
    return hll_sketch.deserialize(bytes(image)).serialize_compact()


def test_string_and_integer_sketches_equal_python_ones(spark) -> None:
    assert _spark_sketches(spark, STRINGS, "v STRING", T.StringType()) == (_python_sketch(STRINGS),) * 2
    assert _spark_sketches(spark, INTS, "v BIGINT", T.LongType()) == (_python_sketch(INTS),) * 2
    small = [v for v in INTS if v is None or abs(v) < 2**31]  # an INT is counted as its BIGINT
    assert _spark_sketches(spark, small, "v INT", T.IntegerType()) == (_python_sketch(small),) * 2


def test_the_empty_string_is_a_value(spark) -> None:
    with_empty, _ = _spark_sketches(spark, ["", "a", ""], "v STRING", T.StringType())
    assert with_empty != _python_sketch(["a"])
    assert round(hll_sketch.deserialize(with_empty).get_estimate()) == 2
