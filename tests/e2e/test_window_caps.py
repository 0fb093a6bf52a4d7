"""Caps and overflow fail loud with our own error types, end to end on real local Spark.

Spark runs in this file: 3 (each costs a few seconds).
"""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from ematix_dagster.errors import AggregationOverflow, SparkQueryFailed, StateCapExceeded
from tests.e2e.windows_helpers import TS_TYPE, at, parquet_target, pipeline, run

# ---------------------------------------------------------------------------------------------
# 6. Caps and overflow fail loud with our own error types


CAP_DDL = "user_id BIGINT, page STRING, qty BIGINT, ts TIMESTAMP"
CAP_SCHEMA = pa.schema([("user_id", pa.int64()), ("page", pa.string()), ("qty", pa.int64()), ("ts", TS_TYPE)])
WINDOW_0 = re.escape("[2024-05-01T12:00:00Z, 2024-05-01T12:01:00Z)")


def _cap_run(spark, batch_files, tmp_path, name: str, rows: list[dict], aggs, max_groups: int) -> BaseException:
    src = batch_files("cap")
    src.write(rows, CAP_SCHEMA)
    window = f"""kind = "tumbling"
duration_ms = 60_000
group_by = ["user_id"]
max_groups_per_window = {max_groups}
"""
    toml = pipeline(name, src.directory, CAP_DDL, tmp_path / "cp", window, aggs, parquet_target(tmp_path / "out"))
    with pytest.raises((StateCapExceeded, AggregationOverflow)) as info:
        run(toml, spark)
    exc = info.value
    assert type(exc).__module__ == "ematix_dagster.errors", type(exc)
    assert not isinstance(exc, SparkQueryFailed)
    assert "Py4J" not in type(exc).__name__ and "Spark" not in type(exc).__name__
    return exc


def test_max_groups_per_window_exceeded(spark, batch_files, tmp_path):
    rows = [{"user_id": u, "page": "p", "qty": 1, "ts": at(10 + u)} for u in (1, 2, 3, 4)]
    exc = _cap_run(spark, batch_files, tmp_path, "cap-groups", rows, [{"agg": "count", "as": "n"}], max_groups=3)
    assert type(exc) is StateCapExceeded
    text = str(exc)
    assert "max_groups_per_window=3" in text
    assert re.search(WINDOW_0, text), text
    assert "cap-groups" in text


def test_exact_distinct_cap_exceeded(spark, batch_files, tmp_path):
    rows = [{"user_id": 1, "page": p, "qty": 1, "ts": at(10)} for p in ("a", "b", "c")]
    aggs = [{"agg": "count_distinct", "column": "page", "as": "pages", "mode": "exact",
             "max_distinct_values_per_group": 2}]
    exc = _cap_run(spark, batch_files, tmp_path, "cap-distinct", rows, aggs, max_groups=10)
    assert type(exc) is StateCapExceeded
    text = str(exc)
    assert "max_distinct_values_per_group=2" in text
    assert re.search(WINDOW_0, text), text
    assert "cap-distinct" in text and "pages" in text


def test_integer_sum_overflow(spark, batch_files, tmp_path):
    rows = [{"user_id": 1, "page": "p", "qty": 2**62, "ts": at(10)},
            {"user_id": 1, "page": "p", "qty": 2**62, "ts": at(11)}]
    aggs = [{"agg": "sum", "column": "qty", "as": "qty_sum"}]
    exc = _cap_run(spark, batch_files, tmp_path, "sum-overflow", rows, aggs, max_groups=10)
    assert type(exc) is AggregationOverflow
    text = str(exc)
    assert "BIGINT" in text and "qty_sum" in text and "sum-overflow" in text
    assert re.search(WINDOW_0, text), text
