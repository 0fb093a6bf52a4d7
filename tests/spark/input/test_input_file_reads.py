"""How input files are read, on real Spark: read errors of the sources Spark streams are classified
(terminal), the parquet footer check refuses only what Spark refuses, ``on_unreadable_file`` is checked at load,
managed and streamed sources share a pipeline, and which files a batch reads (the checkpoint's source log).
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomli_w

from ematix_dagster.errors import PipelineConfigError, UnreadableInputFile
from ematix_dagster.spark.failures.read_errors import classify_read_error
from ematix_dagster.spark.input.input_files import UNREADABLE_FILE, _declared_type_refused
from ematix_dagster.spec import dump_pipeline, load_pipeline_str
from tests.spark.input.unreadable_inputs import (
    PIPELINE,
    T0,
    WINDOW,
    Input,
    dead_letters,
    expected_windows,
    make_spec,
    parquet_rows,
    rows,
    run,
    source,
    ts,
)

# -- sources Spark streams (fail): the error is classified, terminal --------------------------------------


def test_a_truncated_gzip_json_file_is_unreadable_and_terminal(spark, tmp_path: Path) -> None:
    directory = tmp_path / "in"
    directory.mkdir()
    lines = "".join(json.dumps({"id": i, "k": "a", "v": i, "ts": f"2024-01-01 00:00:{i:02d}"}) + "\n"
                    for i in range(50))
    (directory / "part-0.json").write_text(lines)
    data = gzip.compress(lines.encode() * 50)
    (directory / "part-1.json.gz").write_bytes(data[: len(data) // 2])
    spec = make_spec(tmp_path, source(directory, fmt="json", schema="id BIGINT, k STRING, v BIGINT, ts STRING"),
                     window={**WINDOW, "aggregations": WINDOW["aggregations"][:2]})
    assert not spec.sources[0].read_by_engine, "json without skip: Spark's stream reads it"

    with pytest.raises(UnreadableInputFile) as info:
        run(spec, spark)

    assert info.value.terminal is True
    assert str(directory / "part-1.json.gz") in str(info.value) and 'on_unreadable_file = "skip"' in str(info.value)


def test_read_errors_that_may_be_the_machine_are_not_unreadable_files() -> None:
    head = "org.apache.spark.SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error while reading file " \
           "file:///data/in/a%20b.parquet.  SQLSTATE: KD001\n\tat x\n"
    corrupt = RuntimeError(head + "Caused by: java.lang.RuntimeException: file:/data/in/a b.parquet is not a "
                           "Parquet file. Expected magic number at tail, but found [1, 2, 3, 4]\n\tat y\n")
    err = classify_read_error(corrupt)
    assert isinstance(err, UnreadableInputFile) and "/data/in/a b.parquet" in str(err)
    assert "is not a Parquet file" in str(err)
    for cause in ("java.io.FileNotFoundException: /data/in/a b.parquet", "java.nio.file.AccessDeniedException: x",
                  "java.net.SocketTimeoutException: Read timed out"):
        assert classify_read_error(RuntimeError(head + f"Caused by: {cause}\n")) is None
    missing = "[FAILED_READ_FILE.FILE_NOT_EXIST] Encountered error while reading file file:///x.parquet. gone\n" \
              "Caused by: java.lang.RuntimeException: boom\n"
    assert classify_read_error(RuntimeError(missing)) is None


# -- the footer check never refuses a file Spark would read -----------------------------------------------

FILE_TYPES = {
    "string": pa.array(["1"]), "binary": pa.array([b"1"]), "int64": pa.array([1], pa.int64()),
    "int32": pa.array([1], pa.int32()), "bool": pa.array([True]), "double": pa.array([1.0]),
    "ts_us": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us")), "date": pa.array([dt.date(2024, 1, 1)]),
    "decimal": pa.array([1], pa.decimal128(10, 2)),
}
DECLARED = ["STRING", "BINARY", "BIGINT", "INT", "DOUBLE", "BOOLEAN", "TIMESTAMP", "TIMESTAMP_NTZ", "DATE",
            "DECIMAL(10,2)"]


def test_the_footer_check_refuses_only_what_spark_refuses(spark, tmp_path: Path) -> None:
    from pyspark.sql import types as T

    refused = []
    for name, values in FILE_TYPES.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"c": values}), path)
        col = pq.read_metadata(path).schema.column(0)
        for declared in DECLARED:
            dtype = T._parse_datatype_string(f"c {declared}").fields[0].dataType
            if _declared_type_refused(dtype, col.physical_type, col.logical_type.type):
                refused.append((name, declared))
                with pytest.raises(Exception):  # noqa: B017 - whatever Spark raises: the read must fail
                    spark.read.schema(f"c {declared}").parquet(str(path)).collect()
    assert ("string", "BIGINT") in refused and ("int64", "STRING") in refused and ("bool", "INT") in refused
    assert ("int32", "BIGINT") not in refused and ("decimal", "BINARY") not in refused


# -- the key ------------------------------------------------------------------------------------------------


def _doc(tmp: Path, src: dict[str, Any]) -> str:
    return tomli_w.dumps({"pipeline_name": PIPELINE, "sources": [src], "transform": {"window": WINDOW},
                          "target": {"kind": "console"}, "run": {"checkpoint_location": str(tmp / "cp")}})


@pytest.mark.parametrize("src, fragment", [
    ({"on_unreadable_file": "ignore"}, "unknown value 'ignore'"),
    ({"on_unreadable_file": True}, "not a string"),
    ({"kind": "rate", "on_unreadable_file": "skip"}, "does not apply to a rate source"),
])
def test_on_unreadable_file_is_checked_at_load_naming_the_key(tmp_path: Path, src, fragment) -> None:
    base = source(tmp_path)
    if src.get("kind") == "rate":
        base = {"name": "s", "kind": "rate"}
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_str(_doc(tmp_path, {**base, **src}))
    assert info.value.key == "sources[0].on_unreadable_file" and fragment in str(info.value)


def test_on_unreadable_file_round_trips_and_defaults_to_fail(tmp_path: Path) -> None:
    plain = load_pipeline_str(_doc(tmp_path, source(tmp_path)))
    assert plain.sources[0].on_unreadable_file is None and not plain.sources[0].skips_unreadable_files
    skip = load_pipeline_str(_doc(tmp_path, source(tmp_path, "skip")))
    assert skip.sources[0].skips_unreadable_files
    assert load_pipeline_str(dump_pipeline(skip)) == skip and "on_unreadable_file =" not in dump_pipeline(plain)
    remote = load_pipeline_str(_doc(tmp_path, {**source(tmp_path), "path": "s3a://bucket/in"}))
    assert not remote.sources[0].read_by_engine, "a remote parquet source is Spark's stream unless it skips"


def test_managed_and_streamed_sources_in_one_pipeline(spark, tmp_path: Path) -> None:
    """Two parquet sources the engine reads (one skipping a bad file) and a csv source Spark
    streams: every source's rows reach the windows, the bad file's do not."""
    first, second = Input(tmp_path / "a"), Input(tmp_path / "b")
    first.pandas(rows(0, 20))
    second.micros(rows(100, 10))
    second.truncated(rows(200, 10))
    second.pandas(rows(300, 10, start=T0 + pd.Timedelta(minutes=1)), utc=True)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "part-0.csv").write_text(
        "id,k,v,at\n1000,a,7,2024-01-01 00:00:30\n1001,c,8,2024-01-01 00:01:30\n")
    window = {**WINDOW, "aggregations": WINDOW["aggregations"][:2]}
    doc: dict[str, Any] = {
        "pipeline_name": PIPELINE, "transform": {"window": window},
        "sources": [{**source(first.directory), "name": "a"}, {**source(second.directory, "skip"), "name": "b"},
                    {"name": "c", "kind": "files", "format": "csv", "path": str(tmp_path / "c"),
                     "schema": "id BIGINT, k STRING, v BIGINT, at STRING", "event_time_column": "at"}],
        "target": {"kind": "parquet", "path": str(tmp_path / "out")},
        "dead_letter": {"kind": "parquet", "path": str(tmp_path / "dlq")},
        "state_store": {"kind": "in_memory"},
        "run": {"checkpoint_location": str(tmp_path / "cp"), "end_of_input": "flush"},
    }
    spec = load_pipeline_str(tomli_w.dumps(doc))
    assert [s.read_by_engine for s in spec.sources] == [True, True, False]

    result = run(spec, spark)

    parquet_rows_in = pd.concat(first.readable + second.readable, ignore_index=True)
    expected = {(start, k): (n, v_sum) for (start, k), (n, v_sum, *_) in expected_windows(parquet_rows_in).items()}
    for start, k, v in [(pd.Timestamp("2024-01-01 00:00"), "a", 7), (pd.Timestamp("2024-01-01 00:01"), "c", 8)]:
        n, v_sum = expected.get((start, k), (0, 0))
        expected[(start, k)] = (n + 1, v_sum + v)
    got = {(ts(r["window_start"]), r["k"]): (r["n"], r["v_sum"]) for r in parquet_rows(tmp_path / "out")}
    assert got == expected
    assert result.reports[0].rows_by_source == {"a": 20, "b": 20, "c": 2}
    assert [(r["_source"], r["_reason"]) for r in dead_letters(tmp_path)] == [("b", UNREADABLE_FILE)]


# -- which files a batch reads ------------------------------------------------------------------------------


def _checkpoint(tmp: Path, offsets: list[str], logs: dict[str, list[tuple[str, int]]]) -> str:
    """A checkpoint with ``offsets/N`` (one source) and that source's file log (name -> entries)."""
    cp = tmp / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "sources" / "0").mkdir(parents=True)
    for n, line in enumerate(offsets):
        (cp / "offsets" / str(n)).write_text(f'v1\n{{"batchTimestampMs":{n}}}\n{line}\n')
    for name, entries in logs.items():
        (cp / "sources" / "0" / name).write_text(
            "v1\n" + "".join(json.dumps({"path": p, "timestamp": 1, "batchId": b}) + "\n" for p, b in entries))
    return str(cp)


def test_a_batch_reads_the_log_entries_between_its_offsets(tmp_path: Path) -> None:
    """The file log is numbered by the source's offsets, not by batch ids (a heartbeat-only batch or
    another source's batch does not move it), and Spark compacts it every tenth entry."""
    from ematix_dagster.spark.input.checkpoint import batch_files

    log = lambda k: '{"logOffset":%d}' % k  # noqa: E731
    cp = _checkpoint(tmp_path, ["-", log(0), log(0), log(2), log(4)], {
        "0": [("file:///in/a", 0)], "1": [("file:///in/b", 1)], "2": [("file:///in/c", 2), ("file:///in/d", 2)],
        "3": [("file:///in/e", 3)],
        # entry 4 exists only in the compacted log (its plain file deleted), which repeats every entry
        "5.compact": [("file:///in/a", 0), ("file:///in/b", 1), ("file:///in/c", 2), ("file:///in/d", 2),
                      ("file:///in/e", 3), ("file:///in/f", 4), ("file:///in/g", 5)]})
    assert batch_files(cp, 0, 0) == [], "no offset yet"
    assert batch_files(cp, 0, 1) == ["file:///in/a"], "the first entries"
    assert batch_files(cp, 0, 2) == [], "the offset did not move"
    assert batch_files(cp, 0, 3) == ["file:///in/b", "file:///in/c", "file:///in/d"]
    assert batch_files(cp, 0, 4) == ["file:///in/e", "file:///in/f"]


def test_more_than_ten_batches_and_a_source_that_waits(spark, tmp_path: Path) -> None:
    """Real logs: twelve one-file batches (Spark compacts its log at the tenth), then a second
    source whose log lags the batch ids, over three runs."""
    a, b = Input(tmp_path / "a"), Input(tmp_path / "b")
    for i in range(12):
        a.micros(rows(10 * i, 10, start=T0 + pd.Timedelta(minutes=2 * i)))
    b.pandas(rows(1000, 5))
    window = {**WINDOW, "aggregations": WINDOW["aggregations"][:2]}
    doc: dict[str, Any] = {
        "pipeline_name": PIPELINE, "transform": {"window": window},
        "sources": [{**source(a.directory, max_files_per_trigger=1), "name": "a"},
                    {**source(b.directory, "skip", max_files_per_trigger=1), "name": "b"}],
        "target": {"kind": "parquet", "path": str(tmp_path / "out")},
        "state_store": {"kind": "sqlite", "path": str(tmp_path / "state.db")},
        "run": {"checkpoint_location": str(tmp_path / "cp")},
    }
    spec = load_pipeline_str(tomli_w.dumps(doc))
    first = run(spec, spark)
    assert first.rows_in == 125 and first.batches == 12
    assert (tmp_path / "cp" / "sources" / "0" / "9.compact").exists()
    b.micros(rows(2000, 7, start=T0 + pd.Timedelta(minutes=30)))  # b's log entry 1, batch 12
    second = run(spec, spark)
    a.pandas(rows(3000, 3, start=T0 + pd.Timedelta(minutes=40)))  # a's log entry 12, batch 13
    b.micros(rows(4000, 4, start=T0 + pd.Timedelta(minutes=40)))  # b's log entry 2, batch 13
    third = run(spec, spark)
    assert [r.rows_by_source for r in second.reports] == [{"a": 0, "b": 7}]
    assert [r.rows_by_source for r in third.reports] == [{"a": 3, "b": 4}]
