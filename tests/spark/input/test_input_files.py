"""Unreadable input files and parquet TIMESTAMP(NANOS) columns, on real Spark.

A truncated parquet file, one whose column type drifted, or one whose data pages are corrupt used
to fail every retry as a transient Spark error; a parquet file written by ``pandas.to_parquet``
(TIMESTAMP(NANOS)) could not be read at all. Now (``ematix_dagster.spark.input.input_files``):

* nanosecond columns are read, truncated (floor) to microseconds, beside microsecond files of the
  same directory and batch (compared with pandas over the same rows);
* ``on_unreadable_file = "fail"`` (the default) stops with a terminal error naming the file and the
  way out, and each way out it names works (moving the file away, setting "skip");
* ``"skip"`` leaves the file out (no row of it), counts it and dead-letters one row per file (parquet
  and PostgreSQL dead letters, the latter in the store's transaction too), while the batch's other
  files are aggregated: rows in = rows aggregated + rows dead-lettered, each with its reason;
* a replayed batch skips the same files, and the stored counters count them once.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

from ematix_dagster import faults
from ematix_dagster.errors import EmatixError, InputSchemaMismatch, UnreadableInputFile
from ematix_dagster.operations import summary as stored_summary
from ematix_dagster.spark.failures.read_errors import classify_read_error
from ematix_dagster.spark.input.input_files import UNREADABLE_FILE, _from_nanos
from tests.spark.input.unreadable_inputs import (
    PIPELINE,
    T0,
    WINDOW,
    Input,
    dead_letters,
    emitted,
    make_spec,
    parquet_rows,
    rows,
    run,
    source,
)

# -- TIMESTAMP(NANOS) ---------------------------------------------------------------------------------


def test_nanoseconds_are_truncated_to_microseconds_by_floor(spark) -> None:
    nanos = [-1_001, -1, 0, 999, 1_000, 1_704_067_200_123_456_789]
    df = spark.createDataFrame([(n,) for n in nanos], "n BIGINT")
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    got = df.select(F.unix_micros(_from_nanos(F.col("n"), T.TimestampType())).alias("us"),
                    _from_nanos(F.col("n"), T.TimestampNTZType()).alias("ntz")).collect()
    assert [r.us for r in got] == [n // 1000 for n in nanos], "floor, also before 1970, exact at 19 digits"
    assert got[-1].ntz == dt.datetime(2024, 1, 1, 0, 0, 0, 123_456)


@pytest.mark.parametrize("max_files_per_trigger", [None, 1], ids=["one-batch", "file-per-batch"])
def test_pandas_nanosecond_files_are_read_beside_microsecond_files(spark, tmp_path: Path,
                                                                    max_files_per_trigger: int | None) -> None:
    inp = Input(tmp_path / "in")
    before_1970 = pd.DataFrame({"id": [-1], "k": ["a"], "v": [5], "page": ["p"],
                                "ts": pd.to_datetime(["1969-12-31 23:59:59.999999999"]),
                                "created": pd.to_datetime(["1969-12-31 23:59:59.999999999"])})
    inp.pandas(pd.concat([before_1970, rows(0, 40)], ignore_index=True))  # naive TIMESTAMP(NANOS)
    inp.micros(rows(40, 30, start=T0 + pd.Timedelta(minutes=5)))  # TIMESTAMP(MICROS)
    inp.pandas(rows(70, 40, start=T0 + pd.Timedelta(minutes=9)), utc=True)  # TIMESTAMP(NANOS, UTC)
    assert pq.ParquetFile(inp.directory / "part-00000.parquet").schema_arrow.field("ts").type == pa.timestamp("ns")
    spec = make_spec(tmp_path, source(inp.directory, max_files_per_trigger=max_files_per_trigger))
    assert spec.sources[0].read_by_engine

    result = run(spec, spark)

    assert result.rows_in == 111
    assert emitted(tmp_path) == inp.expected()
    assert dead_letters(tmp_path) == [], "nothing invalid, nothing late"
    first = emitted(tmp_path)[(pd.Timestamp("1969-12-31 23:59:00"), "a")]
    assert first[2] == pd.Timestamp("1969-12-31 23:59:59.999999"), "floor: not rounded up into 1970"


# -- on_unreadable_file = "fail" -------------------------------------------------------------------------

BAD_FILES = {
    "truncated": (lambda inp: inp.truncated(rows(500, 30)), UnreadableInputFile, "not a readable Parquet file"),
    "drifted": (lambda inp: inp.drifted(4), InputSchemaMismatch, "holds column [v] as BINARY"),
    "corrupt-pages": (lambda inp: inp.corrupt_pages(3000), UnreadableInputFile, "Spark cannot read input file"),
}


@pytest.mark.parametrize("bad", BAD_FILES)
def test_fail_stops_terminally_naming_the_file_and_the_way_out(spark, tmp_path: Path, bad: str) -> None:
    write, error_class, text = BAD_FILES[bad]
    inp = Input(tmp_path / "in")
    inp.pandas(rows(0, 20))
    path = write(inp)
    spec = make_spec(tmp_path, source(inp.directory, max_files_per_trigger=1))

    with pytest.raises(EmatixError) as info:
        run(spec, spark)

    err = info.value
    assert isinstance(err, error_class) and err.terminal is True
    message = str(err)
    assert str(path) in message and text in message and "batch 1" in message
    assert err.way_out is not None and err.way_out.startswith("Way out:")
    assert f"move it out of {inp.directory}" in message and 'on_unreadable_file = "skip"' in message
    assert classify_read_error(err) is err, "the runner's classification keeps it"
    report = Path(err.stack_file).read_text() if err.stack_file else ""
    assert "\tat org.apache.spark" in report, "Spark's report of it is in the file the error names, off the terminal"
    assert not (tmp_path / "out" / "batch_id=1").exists() and dead_letters(tmp_path) == []


@pytest.mark.parametrize("way_out", ["move-it-out", "set-skip"])
def test_each_way_out_of_fail_works_on_the_replayed_batch(spark, tmp_path: Path, way_out: str) -> None:
    """Batch 1 fails on a truncated file; the replayed batch 1 still lists it (Spark's log), and
    either moving the file away or setting "skip" lets it through without the file."""
    inp = Input(tmp_path / "in")
    inp.pandas(rows(0, 20))
    bad = inp.truncated(rows(100, 20))
    last = inp.micros(rows(200, 20, start=T0 + pd.Timedelta(minutes=3)))
    spec = make_spec(tmp_path, source(inp.directory, max_files_per_trigger=1),
                     store={"kind": "sqlite", "path": str(tmp_path / "state.db")})
    with pytest.raises(UnreadableInputFile):
        run(spec, spark)
    if way_out == "move-it-out":
        shutil.move(bad, tmp_path / bad.name)
    else:
        spec = replace(spec, sources=(replace(spec.sources[0], on_unreadable_file="skip"),)).validate()

    lines: list[str] = []
    run(spec, spark, lines=lines)

    assert emitted(tmp_path) == inp.expected()
    [letter] = dead_letters(tmp_path)
    assert letter["_batch_id"] == 1 and letter["_reason"] == UNREADABLE_FILE and letter["_file_path"] == str(bad)
    assert ("no longer exists" if way_out == "move-it-out" else "not a readable Parquet file") in letter["_file_error"]
    assert any(str(bad) in line and "left out input file" in line for line in lines)
    state = stored_summary(spec, windows=False)
    counters = state["counters"]
    assert counters["unreadable_files:s"] == 1 and counters["dead_letter_rows:unreadable_file"] == 1
    position = state["positions"]["s"]  # the file left out was read all the same: it is in Spark's log
    assert (position["kind"], position["files_read"]) == ("files", 3) and position["last_file"].endswith(last.name)


# -- on_unreadable_file = "skip" ---------------------------------------------------------------------------


@pytest.mark.parametrize("max_files_per_trigger", [None, 1], ids=["one-batch", "file-per-batch"])
def test_skip_leaves_bad_files_out_and_accounts_for_every_row(spark, tmp_path: Path,
                                                              max_files_per_trigger: int | None) -> None:
    inp = Input(tmp_path / "in")
    with_bad_row = rows(0, 30)
    with_bad_row.loc[3, "ts"] = pd.NaT  # a bad row of a readable file: dead-lettered as invalid_event_time
    inp.pandas(with_bad_row)
    truncated = inp.truncated(rows(100, 25))
    drifted = inp.drifted(4)
    inp.micros(rows(200, 30, start=T0 + pd.Timedelta(minutes=4)))
    corrupt = inp.corrupt_pages(3000)
    inp.pandas(rows(300, 30, start=T0 + pd.Timedelta(minutes=8)), utc=True)
    spec = make_spec(tmp_path, source(inp.directory, "skip", max_files_per_trigger))
    registry = CollectorRegistry()

    result = run(spec, spark, registry)

    assert emitted(tmp_path) == inp.expected(), "every row of every readable file, no row of a bad one"
    letters = dead_letters(tmp_path)
    files = sorted((r for r in letters if r["_reason"] == UNREADABLE_FILE), key=lambda r: r["_file_path"])
    assert [(r["_file_path"], r["_file_rows"], r["_source"], r["_event_ts"]) for r in files] == [
        (str(truncated), None, "s", None), (str(drifted), 4, "s", None), (str(corrupt), 3000, "s", None)]
    assert "Parquet magic bytes not found" in files[0]["_file_error"]
    assert files[1]["_file_error"] == "column [v] is BINARY in the file, bigint in the source's schema"
    assert "PageHeader" in files[2]["_file_error"], "found by Spark: its reader's words"
    bad_rows = [r for r in letters if r["_reason"] != UNREADABLE_FILE]
    assert [(r["_reason"], r["id"]) for r in bad_rows] == [("invalid_event_time", 3)]
    if max_files_per_trigger is None:  # one batch: both kinds in the batch's one dead-letter file
        assert {r["_batch_id"] for r in letters} == {0}
    else:
        assert {r["_batch_id"] for r in files} == {1, 2, 4}

    # rows in = rows aggregated + rows dead-lettered (the truncated file's rows are unknowable)
    aggregated = sum(v[0] for v in emitted(tmp_path).values())
    known = sum(len(d) for d in inp.readable) + 4 + 3000
    assert known == aggregated + len(bad_rows) + sum(r["_file_rows"] for r in files if r["_file_rows"] is not None)
    assert result.rows_in == sum(len(d) for d in inp.readable), "rows in: the rows read"
    assert registry.get_sample_value("ematix_streaming_unreadable_files_total",
                                     {"pipeline": PIPELINE, "source": "s"}) == 3
    assert registry.get_sample_value("ematix_streaming_dead_letter_rows_total",
                                     {"pipeline": PIPELINE, "reason": UNREADABLE_FILE}) == 3
    assert sum(r.dead_letter_rows for r in result.reports) == 4


def test_skip_without_dead_letters_counts_and_reports(spark, tmp_path: Path) -> None:
    inp = Input(tmp_path / "in")
    inp.pandas(rows(0, 10))
    bad = inp.drifted(2)
    spec = make_spec(tmp_path, source(inp.directory, "skip"), dead_letter=False)
    registry, lines = CollectorRegistry(), []

    run(spec, spark, registry, lines)

    assert emitted(tmp_path) == inp.expected()
    assert registry.get_sample_value("ematix_streaming_unreadable_files_total",
                                     {"pipeline": PIPELINE, "source": "s"}) == 1
    assert any(str(bad) in line and "counted only" in line for line in lines)


@pytest.mark.parametrize("store", ["in_memory", "postgres"])
def test_skip_with_postgres_dead_letters(spark, tmp_path: Path, pg_dsn: str, pg_schema: str, store: str) -> None:
    """One dead-letter write per batch (a postgres write replaces the batch's rows): the file rows
    join the bad rows, written directly or (a postgres store in the same database) in the store's
    transaction."""
    inp = Input(tmp_path / "in")
    with_bad_row = rows(0, 12)
    with_bad_row.loc[5, "ts"] = pd.NaT
    inp.pandas(with_bad_row)
    truncated = inp.truncated(rows(100, 10))
    drifted = inp.drifted(3)
    table = f"{pg_schema}.dead_letters"
    stores = {"in_memory": {"kind": "in_memory"}, "postgres": {"kind": "postgres", "url": pg_dsn, "schema": pg_schema}}
    spec = make_spec(tmp_path, source(inp.directory, "skip"), store=stores[store],
                     dead_letter={"kind": "postgres", "url": pg_dsn, "table": table, "create_table": True})

    run(spec, spark)

    assert emitted(tmp_path) == inp.expected()
    with psycopg.connect(pg_dsn) as conn:
        got = conn.execute(f"SELECT _batch_id, _source, _event_ts, _reason, payload FROM {table} "
                           "ORDER BY _reason, payload->>'_file_path'").fetchall()
    assert [(b, s, e, r) for b, s, e, r, _ in got] == [
        (0, "s", None, "invalid_event_time"), (0, "s", None, UNREADABLE_FILE), (0, "s", None, UNREADABLE_FILE)]
    assert got[0][4]["id"] == 5
    files = [(p["_file_path"], p["_file_rows"]) for *_, p in got[1:]]
    assert sorted(files) == sorted([(str(truncated), None), (str(drifted), 3)])
    assert all(p["_file_error"] for *_, p in got[1:])


def test_a_replayed_batch_skips_the_same_files_and_counts_them_once(spark, tmp_path: Path, monkeypatch) -> None:
    """Batch 1 dies after writing its target and dead letters, before the store commits: the
    replay decides the same, rewrites the same dead letters, and the stored counters count once."""
    inp = Input(tmp_path / "in")
    inp.pandas(rows(0, 20))
    inp.pandas(rows(100, 20, start=T0 + pd.Timedelta(minutes=3)))
    bad = inp.drifted(5)  # batch 1 holds a readable and a bad file
    inp.micros(rows(200, 20, start=T0 + pd.Timedelta(minutes=6)))
    spec = make_spec(tmp_path, source(inp.directory, "skip", 2),
                     store={"kind": "sqlite", "path": str(tmp_path / "state.db")})
    real_point = faults.point
    fired = []

    def crash_once(name: str, batch) -> None:
        if (name, batch) == ("target_write", 1) and not fired:
            fired.append(batch)
            raise RuntimeError("injected crash after the target write of batch 1")
        real_point(name, batch)

    monkeypatch.setattr(faults, "point", crash_once)
    with pytest.raises(EmatixError):
        run(spec, spark)
    before = pq.read_table(tmp_path / "dlq" / "batch_id=1" / "part-0.parquet").to_pylist()

    run(spec, spark)

    after = pq.read_table(tmp_path / "dlq" / "batch_id=1" / "part-0.parquet").to_pylist()
    assert after == before and [r["_file_path"] for r in after] == [str(bad)]
    assert emitted(tmp_path) == inp.expected()
    counters = stored_summary(spec, windows=False)["counters"]
    assert counters["unreadable_files:s"] == 1 and counters["dead_letter_rows:unreadable_file"] == 1


def test_skip_on_a_csv_source_leaves_out_a_file_whose_header_does_not_match(spark, tmp_path: Path) -> None:
    directory = tmp_path / "in"
    directory.mkdir()
    schema = "id BIGINT, k STRING, v BIGINT, ts STRING"
    texts = ["id,k,v,ts\n1,a,10,2024-01-01 00:00:05\n2,b,20,2024-01-01 00:00:15\nnot,a,number,row\n",
             "k,id,v,ts\na,3,30,2024-01-01 00:00:25\n",  # the header names the columns in another order
             "id,k,v,ts\n4,a,40,2024-01-01 00:00:35\n"]
    for i, text in enumerate(texts):
        (directory / f"part-{i}.csv").write_text(text)
        os.utime(directory / f"part-{i}.csv", (1_700_000_000 + i,) * 2)
    window = {**WINDOW, "aggregations": WINDOW["aggregations"][:2]}
    spec = make_spec(tmp_path, source(directory, "skip", fmt="csv", schema=schema), window=window)
    assert spec.sources[0].read_by_engine

    run(spec, spark)

    got = {r["k"]: (r["n"], r["v_sum"]) for r in parquet_rows(tmp_path / "out")}
    assert got == {"a": (2, 50), "b": (1, 20)}
    letters = dead_letters(tmp_path)
    assert sorted(r["_reason"] for r in letters) == ["malformed", UNREADABLE_FILE]
    [file] = [r for r in letters if r["_reason"] == UNREADABLE_FILE]
    assert file["_file_path"] == str(directory / "part-1.csv") and "the header has the columns" in file["_file_error"]
