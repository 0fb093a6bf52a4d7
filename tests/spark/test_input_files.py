"""Unreadable input files and parquet TIMESTAMP(NANOS) columns (issue 13), on real Spark.

A truncated parquet file, one whose column type drifted, or one whose data pages are corrupt used
to fail every retry as a transient Spark error; a parquet file written by ``pandas.to_parquet``
(TIMESTAMP(NANOS)) could not be read at all. Now (``ematix_dagster.spark.input_files``):

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
import gzip
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomli_w
from prometheus_client import CollectorRegistry

from ematix_dagster import faults
from ematix_dagster.errors import EmatixError, InputSchemaMismatch, PipelineConfigError, UnreadableInputFile
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.operations import summary as stored_summary
from ematix_dagster.spark.input_files import UNREADABLE_FILE, _declared_type_refused, _from_nanos
from ematix_dagster.spark.read_errors import classify_read_error
from ematix_dagster.spark.readers import managed
from ematix_dagster.spark.runner import PipelineRunner, RunSummary
from ematix_dagster.spec import dump_pipeline, load_pipeline_str

PIPELINE = "unreadable"
DDL = "id BIGINT, k STRING, v BIGINT, page STRING, ts TIMESTAMP, created TIMESTAMP_NTZ"
T0 = pd.Timestamp("2024-01-01 00:00:00")
WINDOW = {"kind": "tumbling", "duration_ms": 60_000, "group_by": ["k"], "max_groups_per_window": 1000,
          "aggregations": [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "v_sum"},
                           {"agg": "min", "column": "ts", "as": "first_ts"},
                           {"agg": "max", "column": "ts", "as": "last_ts"},
                           {"agg": "max", "column": "created", "as": "last_created"}]}
ARROW_US = pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.int64()), ("page", pa.string()),
                      ("ts", pa.timestamp("us", tz="UTC")), ("created", pa.timestamp("us"))])


# -- input ------------------------------------------------------------------------------------------


def rows(first: int, count: int, *, start: pd.Timestamp = T0) -> pd.DataFrame:
    """Rows with nanosecond timestamps (every one has a sub-microsecond part), 7 s apart."""
    ids = range(first, first + count)
    ts = [start + pd.Timedelta(seconds=7 * (i - first), nanoseconds=123_456_789 + i) for i in ids]
    return pd.DataFrame({"id": list(ids), "k": ["ab"[i % 2] for i in ids], "v": [i * 3 for i in ids],
                         "page": "p", "ts": pd.to_datetime(ts), "created": pd.to_datetime(ts) + pd.Timedelta(hours=1)})


class Input:
    """One file per call in ``directory``, in order of modification time (Spark's order), and what
    each readable file holds, for the expected result."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.count = 0
        self.readable: list[pd.DataFrame] = []  # rows of the files the engine must read
        directory.mkdir(parents=True, exist_ok=True)

    def _place(self, write, suffix: str = "parquet") -> Path:
        final = self.directory / f"part-{self.count:05d}.{suffix}"
        tmp = self.directory / f".{final.name}.tmp"
        write(tmp)
        os.replace(tmp, final)
        os.utime(final, (1_700_000_000 + self.count,) * 2)
        self.count += 1
        return final

    def pandas(self, df: pd.DataFrame, *, utc: bool = False) -> Path:
        """``DataFrame.to_parquet`` with pandas' defaults: TIMESTAMP(NANOS) columns."""
        out = df.assign(ts=df.ts.dt.tz_localize("UTC")) if utc else df
        self.readable.append(df)
        return self._place(lambda p: out.to_parquet(p))

    def micros(self, df: pd.DataFrame) -> Path:
        """The same rows written with microsecond columns (the engine's own precision)."""
        floored = df.assign(ts=df.ts.dt.floor("us").dt.tz_localize("UTC"), created=df.created.dt.floor("us"))
        self.readable.append(df)
        return self._place(lambda p: pq.write_table(pa.Table.from_pandas(floored, ARROW_US, preserve_index=False), p))

    def truncated(self, df: pd.DataFrame) -> Path:
        """A parquet file cut in half (its footer gone), as a crashed writer leaves it."""
        def write(p: Path) -> None:
            df.to_parquet(p)
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        return self._place(write)

    def drifted(self, count: int) -> Path:
        """A parquet file whose ``v`` is STRING where the schema says BIGINT."""
        df = rows(9_000, count).assign(v=lambda d: d.v.astype(str))
        return self._place(lambda p: df.to_parquet(p))

    def corrupt_pages(self, count: int) -> Path:
        """A parquet file whose footer reads but whose ``v`` pages do not: only Spark finds out."""
        def write(p: Path) -> None:
            df = rows(20_000, count)
            df.to_parquet(p)
            raw = bytearray(p.read_bytes())
            offset = pq.ParquetFile(p).metadata.row_group(0).column(2).data_page_offset
            raw[offset + 8: offset + 200] = b"\xab" * 192
            p.write_bytes(bytes(raw))
        return self._place(write)

    def expected(self) -> dict[tuple, tuple]:
        return expected_windows(pd.concat(self.readable, ignore_index=True))


def expected_windows(df: pd.DataFrame) -> dict[tuple, tuple]:
    """What the pipeline must emit, computed by pandas: timestamps truncated to microseconds."""
    df = df.dropna(subset=["ts"]).assign(ts=lambda d: d.ts.dt.floor("us"), created=lambda d: d.created.dt.floor("us"))
    df = df.assign(window_start=df.ts.dt.floor("60s"))
    out = {}
    for (start, k), g in df.groupby(["window_start", "k"]):
        out[(start, k)] = (len(g), int(g.v.sum()), g.ts.min(), g.ts.max(), g.created.max())
    return out


# -- the pipeline -----------------------------------------------------------------------------------


def source(path: Path, on_unreadable_file: str | None = None, max_files_per_trigger: int | None = None,
           fmt: str = "parquet", schema: str = DDL) -> dict[str, Any]:
    out: dict[str, Any] = {"name": "s", "kind": "files", "format": fmt, "path": str(path), "schema": schema,
                           "event_time_column": "ts"}
    if on_unreadable_file is not None:
        out["on_unreadable_file"] = on_unreadable_file
    if max_files_per_trigger is not None:
        out["max_files_per_trigger"] = max_files_per_trigger
    return out


def make_spec(tmp: Path, src: dict[str, Any], *, window: dict[str, Any] = WINDOW, dead_letter: dict | None = None,
              store: dict | None = None):
    doc: dict[str, Any] = {
        "pipeline_name": PIPELINE, "sources": [src], "transform": {"window": window},
        "target": {"kind": "parquet", "path": str(tmp / "out")},
        "state_store": store or {"kind": "in_memory"},
        "run": {"checkpoint_location": str(tmp / "cp"), "end_of_input": "flush"},
    }
    if dead_letter is not False:
        doc["dead_letter"] = dead_letter or {"kind": "parquet", "path": str(tmp / "dlq")}
    return load_pipeline_str(tomli_w.dumps(doc))


def run(spec, spark, registry: CollectorRegistry | None = None, lines: list[str] | None = None) -> RunSummary:
    metrics = StreamingMetrics(registry or CollectorRegistry())
    progress = lines.append if lines is not None else (lambda _line: None)
    return PipelineRunner(spec, spark=spark, metrics=metrics, progress=progress).run()


def parquet_rows(path: Path) -> list[dict[str, Any]]:
    return [r for f in sorted(path.glob("batch_id=*/*.parquet")) for r in pq.read_table(f).to_pylist()]


def ts(value: Any) -> pd.Timestamp:
    """An emitted timestamp as a naive UTC pandas timestamp."""
    t = pd.Timestamp(value)
    return t.tz_convert("UTC").tz_localize(None) if t.tzinfo else t


def emitted(tmp: Path) -> dict[tuple, tuple]:
    out = {}
    for r in parquet_rows(tmp / "out"):
        key = (ts(r["window_start"]), r["k"])
        assert key not in out, "every window is emitted once"
        out[key] = (r["n"], r["v_sum"], ts(r["first_ts"]), ts(r["last_ts"]), ts(r["last_created"]))
    return out


def dead_letters(tmp: Path) -> list[dict[str, Any]]:
    return parquet_rows(tmp / "dlq")


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
    assert managed(spec.sources[0])

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
    assert not (tmp_path / "out" / "batch_id=1").exists() and dead_letters(tmp_path) == []


@pytest.mark.parametrize("way_out", ["move-it-out", "set-skip"])
def test_each_way_out_of_fail_works_on_the_replayed_batch(spark, tmp_path: Path, way_out: str) -> None:
    """Batch 1 fails on a truncated file; the replayed batch 1 still lists it (Spark's log), and
    either moving the file away or setting "skip" lets it through without the file."""
    inp = Input(tmp_path / "in")
    inp.pandas(rows(0, 20))
    bad = inp.truncated(rows(100, 20))
    inp.micros(rows(200, 20, start=T0 + pd.Timedelta(minutes=3)))
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
    counters = stored_summary(spec, windows=False)["counters"]
    assert counters["unreadable_files:s"] == 1 and counters["dead_letter_rows:unreadable_file"] == 1


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
    assert managed(spec.sources[0])

    run(spec, spark)

    got = {r["k"]: (r["n"], r["v_sum"]) for r in parquet_rows(tmp_path / "out")}
    assert got == {"a": (2, 50), "b": (1, 20)}
    letters = dead_letters(tmp_path)
    assert sorted(r["_reason"] for r in letters) == ["malformed", UNREADABLE_FILE]
    [file] = [r for r in letters if r["_reason"] == UNREADABLE_FILE]
    assert file["_file_path"] == str(directory / "part-1.csv") and "the header has the columns" in file["_file_error"]


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
    assert not managed(spec.sources[0]), "json without skip: Spark's stream reads it"

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
    assert not managed(remote.sources[0]), "a remote parquet source is Spark's stream unless it skips"


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
    assert [managed(s) for s in spec.sources] == [True, True, False]

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
    from ematix_dagster.spark.checkpoint import batch_files

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
