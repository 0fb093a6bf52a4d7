"""Spark readStream sources, each adding ``_event_ts`` and ``_source`` (SPEC.md §1-2).

Every source yields its payload columns plus ``_event_ts`` (TIMESTAMP, NULL when the event time
is missing or unparseable), ``_source`` (its name) and ``_corrupt_record`` (the raw line of a
malformed json/csv row, else NULL). The sources are unioned by name; the heartbeat (a 1-row/s
rate source) is added for ``processing_time`` runs so that idleness is noticed when nothing
arrives (DESIGN.md §2).

Bad event times never fail a batch: numbers outside the timestamp range and unparseable strings
become NULL through ``try_*`` functions (ANSI mode is on in Spark 4). A file that does not fit the
declared schema as a whole (a CSV header naming the columns in another order) fails its batch
instead: reading it by position would put values into the wrong columns without a trace.
:func:`classify_read_error` turns Spark's error for it into :class:`InputSchemaMismatch`.

Files the engine reads itself
-----------------------------
Spark's file stream reads every file of a batch in one scan, and inside ``foreachBatch`` that scan
is opaque: a file cannot be left out of it, nor read with another schema. So for *managed* files
sources (:func:`managed`: ``on_unreadable_file = "skip"``, and every parquet source on a local
path) the stream only lists the files (Spark's ``binaryFile`` format, its ``content`` never
selected) and logs each batch's list in the checkpoint (``sources/<i>/``, :func:`batch_files`),
and :class:`InputFiles` reads that list in the batch, file group by file group:

* a parquet footer is checked first with pyarrow (cheap: the footer only). A file whose footer
  does not read (truncated, not parquet) or whose column has a type Spark cannot read as the
  declared one (a STRING where BIGINT is declared) is *unreadable*; a file Spark still fails on
  (a corrupt page) is found from Spark's ``FAILED_READ_FILE`` error and the batch is planned again
  without it, so no row of an unreadable file ever reaches the batch.
* ``on_unreadable_file = "fail"`` (the default) stops the run with :class:`UnreadableInputFile`
  (or :class:`InputSchemaMismatch` for a column type) naming the file and the way out; ``"skip"``
  leaves the file out, counts it (``unreadable_files:<source>`` in the stored counters,
  ``ematix_streaming_unreadable_files_total{pipeline,source}``) and writes one dead-letter row
  per file (``_reason = "unreadable_file"``, ``_file_path``, ``_file_error``, ``_file_rows``).
  A file removed after its batch listed it is left out in both modes and recorded the same way
  (moving a bad file away is a way out of "fail").
* parquet TIMESTAMP(NANOS) columns (pandas' default) that the schema declares TIMESTAMP or
  TIMESTAMP_NTZ are read as BIGINT nanoseconds and truncated to microseconds (floor, so
  ``...00.123456789`` becomes ``...00.123456``), the precision of Spark's timestamps.

What a batch reads is a function of the checkpoint's file list and the files' bytes, so a
replayed batch skips the same files as the original did.

The spec given here is resolved (:meth:`PipelineSpec.resolved`): paths and options are used as
they are.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache, reduce
from pathlib import Path
from typing import Callable, Protocol
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client import Counter
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.errors import (
    CorruptCheckpoint, EmatixError, InputSchemaMismatch, PipelineConfigError, UnreadableInputFile, first_line,
)
from ematix_dagster.spark.checkpoint import local_path, offsets_exist, read_offsets, source_log
from ematix_dagster.spark.recovery import HEARTBEAT
from ematix_dagster.spec import PipelineSpec, Source
from ematix_dagster.streaming.micro_batch import BatchInput

CORRUPT = "_corrupt_record"

# Epoch seconds of 0001-01-01 and 9999-12-31T23:59:59: the range Spark timestamps can hold.
_MIN_S, _MAX_S = -62_135_596_800, 253_402_300_799
_UNIT_SCALE = {"s": 1, "ms": 1_000, "us": 1_000_000}
_NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType)


def parse_schema(source: Source, key: str) -> T.StructType:
    try:
        schema = _parsed(source.schema)
    except Exception as exc:  # Spark's parser raises several types
        raise PipelineConfigError(f"{key}.schema", f"{source.schema!r} is not a DDL schema ({first_line(exc)})",
                                  'write it like "user_id BIGINT, ts TIMESTAMP"') from None
    if not isinstance(schema, T.StructType):
        raise PipelineConfigError(f"{key}.schema", f"{source.schema!r} is not a list of columns",
                                  'write it like "user_id BIGINT, ts TIMESTAMP"')
    return schema


@lru_cache(maxsize=64)
def _parsed(ddl: str) -> T.DataType:
    """Spark's parse of a DDL schema: a round trip to the JVM, which a managed source's batches
    would otherwise make twice each (listing its files, reading them)."""
    return T._parse_datatype_string(ddl)  # type: ignore[attr-defined]


def event_time(col: Column, dtype: T.DataType, unit: str, key: str) -> Column:
    """Turn a column of any supported type into a TIMESTAMP, NULL where it cannot be one."""
    if isinstance(dtype, T.TimestampType):
        return col
    if isinstance(dtype, (T.TimestampNTZType, T.DateType)):
        return col.cast("timestamp")
    if isinstance(dtype, T.StringType):
        return F.try_to_timestamp(col)
    if isinstance(dtype, _NUMERIC):
        scale = _UNIT_SCALE[unit]
        micros = F.try_multiply(col.cast("double"), F.lit(1_000_000 / scale))
        in_range = (col >= F.lit(_MIN_S * scale)) & (col <= F.lit(_MAX_S * scale))
        return F.when(in_range, F.timestamp_micros(micros.cast("bigint")))
    raise PipelineConfigError(key, f"event time column has type {dtype.simpleString()}",
                              "use TIMESTAMP, DATE, an ISO-8601 STRING or epoch numbers with event_time_unit")


def _read_schema(source: Source, key: str) -> T.StructType:
    """The schema a files source is read with: the declared one, plus ``_corrupt_record`` for json/csv."""
    schema = parse_schema(source, key)
    if source.format in ("json", "csv"):
        if CORRUPT in schema.fieldNames():
            raise PipelineConfigError(f"{key}.schema", f"{CORRUPT} is reserved", "rename that column")
        schema = T.StructType(schema.fields + [T.StructField(CORRUPT, T.StringType())])
    return schema


def _format_options(reader, source: Source):  # a DataStreamReader or a DataFrameReader
    if source.format in ("json", "csv"):
        reader = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
        if source.format == "csv":
            header = source.header is not False
            reader = reader.option("header", str(header).lower())
            if header:
                # Spark's default (enforceSchema = true) ignores the header's names and reads by
                # position; false compares them with the schema and fails the batch on a mismatch.
                reader = reader.option("enforceSchema", "false")
    return reader


#: Spark's binaryFile columns; a managed source's stream selects none of them, so no file is opened.
_LISTING_SCHEMA = "path STRING, modificationTime TIMESTAMP, length BIGINT, content BINARY"


def _files(spark: SparkSession, source: Source, key: str) -> DataFrame:
    schema = _read_schema(source, key)
    path = source.path or ""
    local = path[len("file://"):] if path.startswith("file://") else path
    if "://" not in local and not Path(local).is_dir():
        raise PipelineConfigError(f"{key}.path", f"directory {path!r} does not exist",
                                  "create it (an empty directory is fine) or correct the path")
    if managed(source):
        # Spark lists the files and logs each batch's list; InputFiles reads them in the batch.
        reader = spark.readStream.format("binaryFile").schema(_LISTING_SCHEMA)
        if source.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", source.max_files_per_trigger)
        return reader.load(source.path).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields])
    reader = _format_options(spark.readStream.format(source.format), source)
    if source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", source.max_files_per_trigger)
    return reader.schema(schema).load(source.path)


def _rate(spark: SparkSession, source: Source) -> DataFrame:
    return spark.readStream.format("rate").option("rowsPerSecond", source.rows_per_second or 1).load()


def kafka_options(source: Source) -> dict[str, str]:
    """Reader options for the Kafka source (needs spark-sql-kafka on the cluster)."""
    options = {
        "kafka.bootstrap.servers": source.bootstrap_servers or "",
        "subscribe": source.topic or "",
        "startingOffsets": source.starting_offsets or "latest",
        "failOnDataLoss": "true",
    }
    if source.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(source.max_offsets_per_trigger)
    return options


def _kafka(spark: SparkSession, source: Source) -> DataFrame:
    reader = spark.readStream.format("kafka")
    for k, v in kafka_options(source).items():
        reader = reader.option(k, v)
    df = reader.load()
    return df.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        "topic", "partition", "offset", "timestamp",
    )


def read_source(spark: SparkSession, spec: PipelineSpec, index: int) -> DataFrame:
    """One source as a streaming DataFrame with ``_event_ts``, ``_source`` and ``_corrupt_record``."""
    source = spec.sources[index]
    key = f"sources[{index}]"
    if source.kind == "files":
        df = _files(spark, source, key)
    elif source.kind == "rate":
        df = _rate(spark, source)
    else:
        df = _kafka(spark, source)
    return _with_engine_columns(df, spec, index)


def _with_engine_columns(df: DataFrame, spec: PipelineSpec, index: int) -> DataFrame:
    """A source's rows (streamed, or read by :class:`InputFiles`) with the engine's columns added."""
    source = spec.sources[index]
    key = f"sources[{index}]"
    if source.kind == "files":
        column, unit = source.event_time_column, source.event_time_unit
    else:
        column, unit = "timestamp", "ms"
    window = spec.window
    if window.event_time_column != "_event_ts":
        column, unit, key = window.event_time_column, window.event_time_unit, "transform.window.event_time_column"
    for reserved in ("_event_ts", "_source"):
        if reserved in df.columns:
            raise PipelineConfigError(f"{key}", f"the source already has a column named {reserved}",
                                      "rename it in the data or drop it; the engine adds this column")
    types = {f.name: f.dataType for f in df.schema.fields}
    if column not in types:
        raise PipelineConfigError(key, f"event time column {column!r} is not in the source's columns {sorted(types)}",
                                  "name one of the source's columns")
    added = {"_event_ts": event_time(F.col(column), types[column], unit, key), "_source": F.lit(source.name)}
    if CORRUPT not in types:
        added[CORRUPT] = F.lit(None).cast("string")
    return df.withColumns(added)  # one step: each is analysed, in every batch of a managed source


def heartbeat(spark: SparkSession) -> DataFrame:
    return (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
            .select(F.lit(None).cast("timestamp").alias("_event_ts"), F.lit(HEARTBEAT).alias("_source"),
                    F.lit(None).cast("string").alias(CORRUPT)))


def has_heartbeat(spec: PipelineSpec) -> bool:
    """Whether the stream carries heartbeat rows (``processing_time``: a batch runs on time without input)."""
    return spec.run.trigger == "processing_time"


def union_sources(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """All sources (and the heartbeat, :func:`has_heartbeat`) as one stream."""
    frames = [read_source(spark, spec, i) for i in range(len(spec.sources))]
    if has_heartbeat(spec):
        frames.append(heartbeat(spark))
    df = frames[0]
    for i, other in enumerate(frames[1:], start=1):
        # unionByName would coerce a STRING column meeting a non-STRING one of the same name with
        # an ANSI cast that fails the batch on the first bad value: refuse that at start.
        seen = {f.name.lower(): f.dataType for f in df.schema.fields}
        for f in other.schema.fields:
            before = seen.get(f.name.lower())
            if before is not None and isinstance(before, T.StringType) != isinstance(f.dataType, T.StringType):
                raise PipelineConfigError(f"sources[{i}]", f"column {f.name!r} is {f.dataType.simpleString()} here "
                                          f"but {before.simpleString()} in a source before it",
                                          "give same-named columns the same type")
        try:
            df = df.unionByName(other, allowMissingColumns=True)
        except Exception as exc:
            raise PipelineConfigError(f"sources[{i}]", f"its columns do not line up with the sources before it "
                                      f"({first_line(exc)})", "give same-named columns the same type") from None
    return df


# ---------------------------------------------------------------------------------------------
# Errors from reading input files

# Spark's texts (CSVHeaderChecker, error class FAILED_READ_FILE); the file is a URL.
_CSV_HEADER_NAMES = re.compile(r"CSV header does not conform to the schema\.\s*Header: (?P<header>[^\n]*)\n"
                               r"\s*Schema: (?P<schema>[^\n]*)\n(?:Expected: (?P<expected>[^\n]*) but found: "
                               r"(?P<found>[^\n]*)\n)?.*?CSV file: (?P<file>\S+)", re.DOTALL)
_CSV_HEADER_LENGTH = re.compile(r"Number of column in CSV header is not equal to number of fields in the schema:"
                                r"\s*Header length: (?P<header>\d+), schema size: (?P<schema>\d+)\s*"
                                r"CSV file: (?P<file>\S+)")
_PARQUET_TYPE = re.compile(r"PARQUET_COLUMN_DATA_TYPE_MISMATCH\] Encountered error while reading file (?P<file>\S+?)\. "
                           r"Data type mismatches when reading Parquet column (?P<column>.+?)\. Expected Spark type "
                           r"(?P<expected>.+?), actual Parquet type (?P<actual>[^.\s]+)")


def _texts(exc: BaseException) -> list[str]:
    """The texts of ``exc`` and of every exception it was raised from or while handling."""
    texts: list[str] = []
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        try:
            texts.append(str(e))
        except Exception:  # noqa: BLE001 - a Py4JJavaError asks the JVM for its text, and the JVM may be gone
            pass
        pending += [e.__cause__, e.__context__, getattr(e, "_cause", None)]  # _cause: PySpark's captured cause
    return texts


def _local(url: str) -> str:
    parts = urlsplit(url)
    return unquote(parts.path) if parts.scheme == "file" else url


def _csv_header(path: str) -> str:
    """The first line of a local CSV file, for a message (Spark names only the header's length)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return "(unreadable)"


_WAY_OUT_CSV = ("fix the file's header (or the declared schema) so that both list the same columns in the same "
                "order, or set header = false on the source to read every line by position (a header line is then "
                "read as a row of data)")
_WAY_OUT_SKIP = 'or set on_unreadable_file = "skip" on its source to leave such files out (counted and dead-lettered)'
_REPLACE = "replace the file with a readable one under the same name (the failed batch reads it again)"

# FAILED_READ_FILE with a cause that says something about the file's bytes (not a missing file: the
# source's log still names it, and nothing about the bytes is known).
_FAILED_READ = re.compile(r"\[FAILED_READ_FILE\.(?P<kind>[A-Z_]+)\] Encountered error while reading file "
                          r"(?P<file>\S+?)\.(?=\s|$)")
_CAUSED_BY = re.compile(r"Caused by: (?P<cls>[\w.$]+)(?::[ \t]*(?P<msg>[^\n]*))?")
#: Causes about the machine or the network, not the file: a retry may read the file.
_NOT_THE_FILE = ("FileNotFoundException", "AccessDeniedException", "Permission denied", "SocketTimeoutException",
                 "ConnectException", "Connection reset", "UnknownHostException", "Filesystem closed",
                 "InterruptedException", "ClosedByInterruptException", "OutOfMemoryError", "TaskKilled",
                 "Too many open files")


@dataclass(frozen=True)
class ReadFailure:
    """Spark refusing one input file, as its error tells it."""

    url: str  # the file, as Spark names it
    problem: str  # what is wrong with the file, for a dead letter
    message: str  # the same for an operator, naming the file
    fix: str  # how to fix the file (or the schema)
    mismatch: bool  # the file does not fit the declared schema (InputSchemaMismatch), else unreadable

    def error(self, prefix: str = "", alternatives: str = _WAY_OUT_SKIP) -> EmatixError:
        cls = InputSchemaMismatch if self.mismatch else UnreadableInputFile
        return cls(f"{prefix}{self.message}", way_out=f"Way out: {self.fix}, {alternatives}")


def read_failure(exc: BaseException) -> ReadFailure | None:
    """The input file ``exc`` (or its cause) says Spark cannot read, and why; None when it names no
    file, or when the cause may be the machine rather than the file (a retry may then help)."""
    texts = _texts(exc)
    for text in texts:
        m = _CSV_HEADER_NAMES.search(text)
        if m:
            first = ""
            if m["expected"] is not None:  # they may differ in whitespace only: show them quoted
                first = f" (first difference: the schema's {m['expected']!r}, the header's {m['found']!r})"
            problem = (f"the header has the columns ({m['header']}), the schema ({m['schema'].strip()}){first}")
            return ReadFailure(m["file"], problem,
                               f"the header of CSV file {_local(m['file'])} does not match the source's schema: "
                               f"{problem}; read by position, the values would land in the wrong columns",
                               _WAY_OUT_CSV, mismatch=True)
        m = _CSV_HEADER_LENGTH.search(text)
        if m:
            path = _local(m["file"])
            problem = f"the header has {m['header']} columns ({_csv_header(path)}), the schema {m['schema']}"
            return ReadFailure(m["file"], problem, f"the header of CSV file {path} has {m['header']} columns "
                               f"({_csv_header(path)}), the source's schema {m['schema']}",
                               _WAY_OUT_CSV, mismatch=True)
        m = _PARQUET_TYPE.search(text)
        if m:
            return _type_mismatch(m["file"], m["column"], m["actual"], m["expected"])
    for text in texts:
        m = _FAILED_READ.search(text)
        if m is None or m["kind"] == "FILE_NOT_EXIST":
            continue
        causes = [(c["cls"], c["msg"] or "") for c in _CAUSED_BY.finditer(text)
                  if not c["cls"].startswith(("org.apache.spark.", "py4j."))]
        if not causes or any(marker in f"{cls}: {msg}" for cls, msg in causes for marker in _NOT_THE_FILE):
            continue
        cls, msg = causes[0]  # the outermost cause past Spark's own: the reader's words
        problem = f"{cls.rsplit('.', 1)[-1]}: {msg}".rstrip(": ")
        return ReadFailure(m["file"], problem, f"Spark cannot read input file {_local(m['file'])}: {problem}",
                           _REPLACE, mismatch=False)
    return None


def _type_mismatch(url: str, column: str, actual: str, expected: str) -> ReadFailure:
    return ReadFailure(url, f"column {column} is {actual} in the file, {expected} in the source's schema",
                       f"Parquet file {_local(url)} holds column {column} as {actual}, but the source's schema "
                       f"declares it {expected}",
                       "rewrite the file with the declared type (or declare the column's type as the files hold it)",
                       mismatch=True)


def classify_read_error(exc: BaseException) -> EmatixError | None:
    """:class:`InputSchemaMismatch` when ``exc`` (or its cause) is Spark refusing an input file that
    does not fit the declared schema, :class:`UnreadableInputFile` when the file's bytes cannot be
    read (truncated, not in its format); None for anything else. Retrying cannot help such a batch:
    the same file is read again. An error that is one of these already is returned as it is."""
    if isinstance(exc, (InputSchemaMismatch, UnreadableInputFile)):
        return exc
    failure = read_failure(exc)
    return None if failure is None else failure.error()


# ---------------------------------------------------------------------------------------------
# Files the engine reads itself (see the module docstring)

UNREADABLE_FILE = "unreadable_file"
#: An unreadable file's dead-letter row: the envelope (``_batch_id``, ``_source``, ``_event_ts``
#: NULL, ``_reason``) and these (in the ``payload`` of a postgres dead-letter table).
FILE_PATH, FILE_ERROR, FILE_ROWS = "_file_path", "_file_error", "_file_rows"
_MISSING = "the file no longer exists (it was removed after its batch listed it)"
_INTEGRAL_OR_TIME = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DateType,
                     T.TimestampType, T.TimestampNTZType)
_NOT_BYTES = ("BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE")


def _is_local(path: str | None) -> bool:
    return bool(path) and ("://" not in path or path.startswith("file://"))  # type: ignore[operator]


def managed(source: Source) -> bool:
    """Whether :class:`InputFiles` reads this source's batches instead of Spark's stream: a files
    source that skips unreadable files, or a parquet source on a local path (its footers are checked
    and TIMESTAMP(NANOS) columns read)."""
    return source.kind == "files" and (source.skips_unreadable_files or
                                       (source.format == "parquet" and _is_local(source.path)))


@dataclass(frozen=True)
class InputFile:
    """One file of a managed source's batch, as far as its footer tells (parquet, local path)."""

    url: str  # as the source's log names it
    nanos: frozenset[str] = frozenset()  # TIMESTAMP(_NTZ) columns the file holds as TIMESTAMP(NANOS)
    rows: int | None = None  # rows its footer declares
    failure: ReadFailure | None = None  # why it cannot be read; None: nothing known against it
    missing: bool = False  # removed after its batch listed it: left out under "fail" too

    @property
    def path(self) -> str:
        return _local(self.url)


def batch_files(location: str, index: int, batch_id: int) -> list[str]:
    """The files source ``index`` reads in batch ``batch_id``, as Spark's checkpoint records them.

    A file source's offset (line ``index`` of ``offsets/N``, ``{"logOffset": k}``) numbers its own
    file log, ``sources/<i>/<k>``, which moves only when new files arrive: batch N reads the log's
    entries after the previous batch's offset, up to its own (what ``FileStreamSource.getBatch``
    reads). Every tenth log entry Spark compacts the log into ``<k>.compact``, which holds all
    entries so far, each with its ``batchId``; the plain files before it are deleted later.
    """
    end = _log_offset(location, batch_id, index)
    if end is None:
        return []
    start = _log_offset(location, batch_id - 1, index) if batch_id > 0 and offsets_exist(location, batch_id - 1) \
        else None
    directory = local_path(location) / "sources" / str(index)
    compacted: dict[int, list[tuple[int, str]]] = {}
    paths: list[str] = []
    for k in range(-1 if start is None else start, end):
        k += 1
        if (directory / str(k)).exists():
            paths += source_log(location, index, k)
            continue
        covering = sorted(c for c in _compact_ids(directory) if c >= k)
        if not covering:
            raise CorruptCheckpoint(f"the checkpoint's file log {directory} has no entry {k} (neither {k} nor a "
                                    f"compacted file after it), which batch {batch_id} reads",
                                    way_out="Way out: restore the checkpoint directory from a backup, or start over "
                                    "with `ematix-dagster reset PIPELINE.toml --yes`")
        if covering[0] not in compacted:
            compacted[covering[0]] = _compact_entries(directory / f"{covering[0]}.compact")
        paths += [path for batch, path in compacted[covering[0]] if batch == k]
    return paths


def _log_offset(location: str, batch_id: int, index: int) -> int | None:
    """A file source's log offset in ``offsets/<batch_id>``; None when it has none yet (``-``)."""
    lines = read_offsets(location, batch_id).offsets
    if index >= len(lines) or lines[index].strip() in ("", "-"):
        return None
    try:
        value = json.loads(lines[index])
        return int(value["logOffset"] if isinstance(value, dict) else value)
    except (ValueError, KeyError, TypeError):
        raise CorruptCheckpoint(f"the checkpoint file {local_path(location) / 'offsets' / str(batch_id)} is not in "
                                f"Spark's format: line {index + 3} is not a file source's offset: "
                                f"{lines[index][:80]!r}",
                                way_out="Way out: restore the checkpoint directory from a backup, or start over "
                                "with `ematix-dagster reset PIPELINE.toml --yes`") from None


def _compact_ids(directory: Path) -> list[int]:
    names = (p.name[: -len(".compact")] for p in directory.glob("*.compact"))
    return [int(name) for name in names if name.isdigit()]


def _compact_entries(path: Path) -> list[tuple[int, str]]:
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()[1:], start=2):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            entries.append((int(entry["batchId"]), str(entry["path"])))
        except (ValueError, KeyError, TypeError):
            raise CorruptCheckpoint(f"the checkpoint file {path} is not in Spark's format: line {number} is not a "
                                    f"file entry: {line[:80]!r}",
                                    way_out="Way out: restore the checkpoint directory from a backup, or start over "
                                    "with `ematix-dagster reset PIPELINE.toml --yes`") from None
    return entries


def _missing(url: str) -> InputFile:
    return InputFile(url, failure=ReadFailure(url, _MISSING, f"input file {_local(url)}: {_MISSING}", "", False),
                     missing=True)


def _declared_type_refused(dtype: T.DataType, physical: str, logical: str) -> bool:
    """A parquet column that Spark refuses to read as ``dtype`` whatever its values (checked against
    Spark 4.3: strings and booleans never become numbers, times or each other). Other pairs are left
    to Spark, whose error then names the file."""
    if isinstance(dtype, (T.StringType, T.BinaryType)):
        return physical in _NOT_BYTES
    if isinstance(dtype, T.BooleanType):
        return physical != "BOOLEAN"
    if isinstance(dtype, _INTEGRAL_OR_TIME):
        return physical in ("BYTE_ARRAY", "BOOLEAN")
    if isinstance(dtype, T.DecimalType):
        return physical == "BOOLEAN" or (physical == "BYTE_ARRAY" and logical != "DECIMAL")
    return False  # nested types: Spark decides


def inspect_parquet(url: str, schema: T.StructType) -> InputFile:
    """Read a local parquet file's footer: its row count, its TIMESTAMP(NANOS) columns and, when it
    cannot be read or a column cannot be read as declared, why."""
    path = _local(url)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return _missing(url)
    except OSError:
        return InputFile(url)  # not about the bytes: Spark reads it, or says what is wrong
    if size == 0:
        return InputFile(url, rows=0)  # Spark reads an empty file as no rows
    try:
        meta = pq.read_metadata(path)
    except (PermissionError, FileNotFoundError):
        return InputFile(url)
    except (OSError, pa.ArrowException) as exc:  # bad magic bytes, a footer that does not deserialize
        problem = f"not a readable Parquet file: {first_line(exc)}"
        return InputFile(url, failure=ReadFailure(url, problem, f"input file {path} is {problem}", _REPLACE, False))
    columns = {}
    for i in range(meta.num_columns):
        col = meta.schema.column(i)
        if col.max_repetition_level == 0 and "." not in col.path:
            columns[col.path.lower()] = col
    nanos: set[str] = set()
    for field in schema.fields:
        col = columns.get(field.name.lower())
        if col is None:
            continue  # Spark reads a missing column as NULL
        logical = col.logical_type.type
        if _declared_type_refused(field.dataType, col.physical_type, logical):
            actual = "BINARY" if col.physical_type == "BYTE_ARRAY" else col.physical_type  # Spark's names
            failure = _type_mismatch(url, f"[{field.name}]", actual, field.dataType.simpleString())
            return InputFile(url, rows=meta.num_rows, failure=failure)
        if isinstance(field.dataType, (T.TimestampType, T.TimestampNTZType)) and logical == "TIMESTAMP" \
                and json.loads(col.logical_type.to_json()).get("timeUnit") == "nanoseconds":
            nanos.add(field.name)
    return InputFile(url, nanos=frozenset(nanos), rows=meta.num_rows)


def _from_nanos(col: Column, dtype: T.DataType) -> Column:
    """Nanoseconds since the epoch (BIGINT) to a timestamp, truncated (floor) to microseconds."""
    micros = F.floor(col.cast(T.DecimalType(20, 0)) / F.lit(1000)).cast("bigint")  # exact, unlike a double
    return F.timestamp_micros(micros).cast(dtype)


def _escaped(url: str) -> str:
    """A file's URL from the source's log (percent-encoded) as DataFrameReader.load takes it: decoded,
    since Hadoop encodes it again, and with {}[]*?\\ escaped, since it would be a glob pattern."""
    parts = urlsplit(url)
    path = unquote(parts.path) if parts.scheme == "file" else \
        f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}" if parts.scheme else url
    return re.sub(r"([\\{}\[\]*?])", r"\\\1", path)


def read_files(session: SparkSession, spec: PipelineSpec, index: int, urls: list[str],
               nanos: frozenset[str] = frozenset()) -> DataFrame:
    """Some files of a managed source, read in the batch with the stream's options, as
    :func:`read_source` would give their rows; ``nanos`` columns are read as BIGINT nanoseconds."""
    source = spec.sources[index]
    declared = _read_schema(source, f"sources[{index}]")
    schema = declared
    if nanos:
        session.conf.set("spark.sql.legacy.parquet.nanosAsLong", "true")  # else Spark refuses the column
        schema = T.StructType([T.StructField(f.name, T.LongType()) if f.name in nanos else f for f in schema.fields])
    reader = _format_options(session.read.format(source.format), source).schema(schema)
    df = reader.option("basePath", source.path).load([_escaped(u) for u in urls])  # basePath: as the stream's
    for f in declared.fields:
        if f.name in nanos:
            df = df.withColumn(f.name, _from_nanos(F.col(_quoted(f.name)), f.dataType))
    return _with_engine_columns(df, spec, index)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _alignment(df: DataFrame, schema: T.StructType) -> list[Column] | None:
    """The projection giving ``df`` exactly the columns of ``schema`` (the union of every source), in
    its order; None when it has them already."""
    if df.schema == schema:
        return None
    have = set(df.columns)
    return [(F.col(_quoted(f.name)) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in schema.fields]


class DeadLetters(Protocol):
    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None: ...

    def write_in_transaction(self, conn: object, batch_id: int, rows: pa.Table) -> None: ...


class _WithFileRows:
    """The batch's dead-letter writer, adding the unreadable files' rows to what the batch writes:
    a postgres dead-letter write replaces the batch's rows, so a batch writes its dead letters once."""

    def __init__(self, inner: DeadLetters, rows: pa.Table, key: str) -> None:
        self.inner, self.rows, self.key = inner, rows, key

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _with(self, rows: pa.Table) -> pa.Table:
        mine = self.rows
        for name in mine.column_names:
            if name in rows.column_names:
                want = rows.schema.field(name).type
                if not mine.schema.field(name).type.equals(want):
                    if name in (FILE_PATH, FILE_ERROR, FILE_ROWS):
                        raise PipelineConfigError(
                            self.key, f"the batch's dead-letter rows have a column {name} of type {want}, the "
                            "column unreadable files' dead-letter rows use",
                            f"rename {name} in the data or in [transform] sql")
                    mine = mine.set_column(mine.column_names.index(name), name, mine.column(name).cast(want))
        return pa.concat_tables([rows, mine], promote_options="permissive")

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        self.inner.write(batch_id, self._with(rows), part)

    def write_in_transaction(self, conn: object, batch_id: int, rows: pa.Table) -> None:
        self.inner.write_in_transaction(conn, batch_id, self._with(rows))


class InputFiles:
    """Reads the batches of the managed files sources (:func:`managed`) and leaves out unreadable files.

    Made once per run; :meth:`aggregate` per batch. ``skipped`` holds the last batch's skipped files
    per source name (for the stored counters).
    """

    def __init__(self, spec: PipelineSpec, counter: Counter, progress: Callable[[str], None]) -> None:
        self.spec = spec
        self.indexes = [i for i, s in enumerate(spec.sources) if managed(s)]
        self.counter = counter  # unreadable_files_total{pipeline,source}
        self.progress = progress
        self.skipped: dict[str, int] = {}
        # per (source index, TIMESTAMP(NANOS) columns): the projection that aligns its read rows with
        # the stream's schema, None where they already are (the same every batch: built once)
        self._alignments: dict[tuple[int, frozenset[str]], list[Column] | None] = {}

    @property
    def managed(self) -> bool:
        return bool(self.indexes)

    def aggregate(self, df: DataFrame, batch_id: int,
                  attempt: Callable[[DataFrame, DeadLetters | None], BatchInput],
                  dead_letter: DeadLetters | None, write_own: Callable[[pa.Table], None]) -> BatchInput:
        """Run ``attempt`` (the batch's aggregation, with the dead-letter writer to use) on this batch's
        rows, read here for the managed sources; a file Spark fails on is left out and the batch
        planned again, or (``fail``) the run stops. ``write_own`` writes the unreadable files' rows
        when the batch writes no dead letters of its own."""
        listed = {i: self._listed(i, batch_id) for i in self.indexes}
        skipped: dict[str, tuple[int, InputFile]] = {}
        for i, files in listed.items():
            for f in files:
                if f.failure is not None:
                    self._refuse(i, f, batch_id)
                    skipped[f.path] = (i, f)
        while True:
            frame = self._frame(df, listed, skipped)
            rows = self._dead_letter_rows(batch_id, skipped) if dead_letter is not None and skipped else None
            writer = dead_letter if rows is None else _WithFileRows(dead_letter, rows, self._key(skipped))
            try:
                batch = attempt(frame, writer)
                break
            except Exception as exc:
                found = self._failed(exc, listed, skipped)
                if found is None:
                    raise
                self._refuse(*found, batch_id, cause=exc)
                skipped[found[1].path] = found
        self._record(batch_id, skipped, rows is not None)
        if rows is not None:
            if not batch.dead_letters:
                write_own(rows)
            batch.dead_letters = {**batch.dead_letters, UNREADABLE_FILE: rows.num_rows}
        return batch

    def _listed(self, index: int, batch_id: int) -> list[InputFile]:
        source = self.spec.sources[index]
        urls = batch_files(self.spec.run.checkpoint_location, index, batch_id)
        if not _is_local(source.path):
            return [InputFile(u) for u in urls]
        if source.format != "parquet":
            return [InputFile(u) if os.path.exists(_local(u)) else _missing(u) for u in urls]
        schema = parse_schema(source, f"sources[{index}]")
        if len(urls) < 8:
            return [inspect_parquet(u, schema) for u in urls]
        with ThreadPoolExecutor(max_workers=4) as pool:  # pyarrow reads footers without the GIL
            return list(pool.map(lambda u: inspect_parquet(u, schema), urls))

    def _refuse(self, index: int, f: InputFile, batch_id: int, cause: BaseException | None = None) -> None:
        """Raise the run-stopping error for ``f`` unless its source skips unreadable files (or it is gone)."""
        source = self.spec.sources[index]
        if source.skips_unreadable_files or f.missing:
            return
        assert f.failure is not None
        error = f.failure.error(
            f"pipeline {self.spec.pipeline_name}, source {source.name}, batch {batch_id}: ",
            f"move it out of {_local(source.path or '')} (the batch then records it as removed and goes on), or set "
            f'on_unreadable_file = "skip" on sources[{index}] ({source.name}) to leave unreadable files out, counted '
            "and dead-lettered")
        if cause is not None:
            raise error from cause
        raise error

    def _failed(self, exc: BaseException, listed: dict[int, list[InputFile]],
                skipped: dict[str, tuple[int, InputFile]]) -> tuple[int, InputFile] | None:
        """The managed file (not skipped yet) that Spark's error ``exc`` says it cannot read."""
        failure = read_failure(exc)
        if failure is None:
            return None
        path = _local(failure.url)
        for i, files in listed.items():
            for f in files:
                if f.path == path and path not in skipped:
                    return i, InputFile(f.url, rows=f.rows, failure=failure)
        return None

    def _frame(self, df: DataFrame, listed: dict[int, list[InputFile]],
               skipped: dict[str, tuple[int, InputFile]]) -> DataFrame:
        """The batch's rows: the other sources' from Spark's batch, the managed ones' read here."""
        session, spec = df.sparkSession, self.spec
        frames: list[DataFrame] = []
        if len(self.indexes) < len(spec.sources):  # rows of streamed sources (the heartbeat's are not needed)
            names = [spec.sources[i].name for i in self.indexes]
            frames.append(df.filter(~F.col("_source").isin(names)))
        for i, files in listed.items():
            groups: dict[frozenset[str], list[str]] = {}
            for f in files:
                if f.path not in skipped:
                    groups.setdefault(f.nanos, []).append(f.url)
            for nanos in sorted(groups, key=sorted):
                rows = read_files(session, spec, i, groups[nanos], nanos)
                if (i, nanos) not in self._alignments:
                    self._alignments[(i, nanos)] = _alignment(rows, df.schema)
                projection = self._alignments[(i, nanos)]
                frames.append(rows if projection is None else rows.select(*projection))
        if not frames:
            return session.createDataFrame([], df.schema)
        return reduce(DataFrame.union, frames)

    def _key(self, skipped: dict[str, tuple[int, InputFile]]) -> str:
        return f"sources[{min(i for i, _ in skipped.values())}].on_unreadable_file"

    def _dead_letter_rows(self, batch_id: int, skipped: dict[str, tuple[int, InputFile]]) -> pa.Table:
        files = sorted(skipped.values(), key=lambda e: (e[0], e[1].path))
        n = len(files)
        return pa.table({
            "_batch_id": pa.array([batch_id] * n, pa.int64()),
            "_source": pa.array([self.spec.sources[i].name for i, _ in files], pa.string()),
            "_event_ts": pa.array([None] * n, pa.timestamp("us", tz="UTC")),
            "_reason": pa.array([UNREADABLE_FILE] * n, pa.string()),
            FILE_PATH: pa.array([f.path for _, f in files], pa.string()),
            FILE_ERROR: pa.array([f.failure.problem if f.failure else None for _, f in files], pa.string()),
            FILE_ROWS: pa.array([f.rows for _, f in files], pa.int64()),
        })

    def _record(self, batch_id: int, skipped: dict[str, tuple[int, InputFile]], dead_lettered: bool) -> None:
        self.skipped = {}
        name = self.spec.pipeline_name
        where = "recorded in the dead letters" if dead_lettered else "no [dead_letter]: counted only"
        for i, f in sorted(skipped.values(), key=lambda e: (e[0], e[1].path)):
            source = self.spec.sources[i].name
            self.skipped[source] = self.skipped.get(source, 0) + 1
            assert f.failure is not None
            self.counter.labels(name, source).inc()
            self.progress(f"[{name}] batch {batch_id}: left out input file {f.path} of source {source}: "
                          f"{f.failure.problem} ({where})")
