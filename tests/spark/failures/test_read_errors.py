"""CSV headers are checked against the declared schema (``header = true``, the default for csv).

Spark's default reads a CSV file by position whatever its header says, so a file whose header
orders the columns differently put values silently into the wrong columns. Now the batch fails,
and :func:`classify_read_error` names the file, both column lists and the way out;
``header = false`` reads every line by position, the first included. A Parquet column whose type
differs from the declared one is classified the same way.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import tomli_w
from prometheus_client import CollectorRegistry

from ematix_dagster.errors import InputSchemaMismatch
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.failures.read_errors import classify_read_error
from ematix_dagster.spec import PipelineSpec, load_pipeline_str

DDL = "id BIGINT, k STRING, v BIGINT, ts STRING"


def spec_for(tmp: Path, name: str, header: bool | None) -> PipelineSpec:
    source: dict[str, Any] = {"name": "c", "kind": "files", "format": "csv", "path": str(tmp / "in"), "schema": DDL,
                              "event_time_column": "ts"}
    if header is not None:
        source["header"] = header
    return load_pipeline_str(tomli_w.dumps({
        "pipeline_name": name,
        "sources": [source],
        "transform": {"window": {"kind": "tumbling", "duration_ms": 60_000, "group_by": ["k"],
                                 "max_groups_per_window": 100,
                                 "aggregations": [{"agg": "count", "as": "n"},
                                                  {"agg": "sum", "column": "v", "as": "v_sum"},
                                                  {"agg": "count_distinct", "column": "id", "as": "ids",
                                                   "mode": "exact", "max_distinct_values_per_group": 100}]}},
        "target": {"kind": "parquet", "path": str(tmp / "out")},
        "dead_letter": {"kind": "parquet", "path": str(tmp / "dlq")},
        "state_store": {"kind": "in_memory"},
        "run": {"checkpoint_location": str(tmp / "cp"), "end_of_input": "flush"},
    }))


def write_csv(tmp: Path, text: str) -> Path:
    (tmp / "in").mkdir(parents=True, exist_ok=True)
    path = tmp / "in" / "part-0.csv"
    path.write_text(text)
    return path


def run(spec: PipelineSpec, spark) -> None:
    from ematix_dagster.spark.runner import PipelineRunner

    PipelineRunner(spec, spark=spark, metrics=StreamingMetrics(CollectorRegistry()), progress=lambda _line: None).run()


def rows(path: Path) -> list[dict[str, Any]]:
    return [r for f in sorted(path.glob("batch_id=*/*.parquet")) for r in pq.read_table(f).to_pylist()]


def windows(tmp: Path) -> dict[str, tuple[int, int, int]]:
    return {r["k"]: (r["n"], r["v_sum"], r["ids"]) for r in rows(tmp / "out")}


DATA = ["1,x,10,2024-01-01 00:00:05", "2,x,20,2024-01-01 00:00:15", "3,y,30,2024-01-01 00:00:25"]
EXPECTED = {"x": (2, 30, 2), "y": (1, 30, 1)}


def test_a_header_matching_the_schema_reads_by_name_and_is_not_a_malformed_row(spark, tmp_path: Path) -> None:
    write_csv(tmp_path, "\n".join(["id,k,v,ts", *DATA]) + "\n")
    run(spec_for(tmp_path, "csv-header-match", None), spark)
    assert windows(tmp_path) == EXPECTED
    assert rows(tmp_path / "dlq") == [], "the header line is neither data nor a malformed row"


def test_a_reordered_header_fails_the_batch_with_input_schema_mismatch(spark, tmp_path: Path) -> None:
    # The same values, written in the header's order: read by position, k would land in id.
    reordered = ["x,1,10,2024-01-01 00:00:05", "x,2,20,2024-01-01 00:00:15", "y,3,30,2024-01-01 00:00:25"]
    path = write_csv(tmp_path, "\n".join(["k,id,v,ts", *reordered]) + "\n")
    with pytest.raises(Exception) as info:
        run(spec_for(tmp_path, "csv-header-reordered", True), spark)
    err = classify_read_error(info.value)
    assert isinstance(err, InputSchemaMismatch) and err.terminal
    text = str(err)
    assert str(path) in text
    assert "(k, id, v, ts)" in text and "(id, k, v, ts)" in text
    assert "header = false" in text and "fix the file" in text
    assert rows(tmp_path / "out") == [] and rows(tmp_path / "dlq") == [], "nothing of the file was written"


def test_a_header_with_fewer_columns_is_a_mismatch_too(spark, tmp_path: Path) -> None:
    path = write_csv(tmp_path, "id,k,v\n1,x,10\n")
    with pytest.raises(Exception) as info:
        run(spec_for(tmp_path, "csv-header-short", None), spark)
    err = classify_read_error(info.value)
    assert isinstance(err, InputSchemaMismatch)
    assert str(path) in str(err) and "(id,k,v)" in str(err) and "has 3 columns" in str(err)


def test_header_false_reads_by_position_from_the_first_line(spark, tmp_path: Path) -> None:
    write_csv(tmp_path, "\n".join(DATA) + "\n")
    run(spec_for(tmp_path, "csv-no-header", False), spark)
    assert windows(tmp_path) == EXPECTED, "the first line is data"
    assert rows(tmp_path / "dlq") == []


def test_a_parquet_column_of_another_type_is_a_mismatch_too(spark, tmp_path: Path) -> None:
    import pyarrow as pa

    spec = spec_for(tmp_path, "parquet-type", None)
    spec = replace(spec, sources=(replace(spec.sources[0], format="parquet"),)).validate()
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "part-0.parquet"
    pq.write_table(pa.table({"id": ["one"], "k": ["x"], "v": [1], "ts": ["2024-01-01 00:00:05"]}), path)
    with pytest.raises(Exception) as info:
        run(spec, spark)
    err = classify_read_error(info.value)
    assert isinstance(err, InputSchemaMismatch)
    assert str(path) in str(err) and "[id]" in str(err) and "bigint" in str(err) and "BINARY" in str(err)


def test_other_errors_are_not_input_schema_mismatches() -> None:
    assert classify_read_error(ValueError("CSV header")) is None
    unrelated = RuntimeError("[FAILED_READ_FILE.NO_HINT] Encountered error while reading file x")
    assert classify_read_error(unrelated) is None
