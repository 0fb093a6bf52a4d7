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

The spec given here is resolved (:meth:`PipelineSpec.resolved`): paths and options are used as
they are.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.errors import EmatixError, InputSchemaMismatch, PipelineConfigError, first_line
from ematix_dagster.spark.recovery import HEARTBEAT
from ematix_dagster.spec import PipelineSpec, Source

CORRUPT = "_corrupt_record"

# Epoch seconds of 0001-01-01 and 9999-12-31T23:59:59: the range Spark timestamps can hold.
_MIN_S, _MAX_S = -62_135_596_800, 253_402_300_799
_UNIT_SCALE = {"s": 1, "ms": 1_000, "us": 1_000_000}
_NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType)


def parse_schema(source: Source, key: str) -> T.StructType:
    try:
        schema = T._parse_datatype_string(source.schema)  # type: ignore[attr-defined]
    except Exception as exc:  # Spark's parser raises several types
        raise PipelineConfigError(f"{key}.schema", f"{source.schema!r} is not a DDL schema ({first_line(exc)})",
                                  'write it like "user_id BIGINT, ts TIMESTAMP"') from None
    if not isinstance(schema, T.StructType):
        raise PipelineConfigError(f"{key}.schema", f"{source.schema!r} is not a list of columns",
                                  'write it like "user_id BIGINT, ts TIMESTAMP"')
    return schema


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


def _files(spark: SparkSession, source: Source, key: str) -> DataFrame:
    schema = parse_schema(source, key)
    path = source.path or ""
    local = path[len("file://"):] if path.startswith("file://") else path
    if "://" not in local and not Path(local).is_dir():
        raise PipelineConfigError(f"{key}.path", f"directory {path!r} does not exist",
                                  "create it (an empty directory is fine) or correct the path")
    reader = spark.readStream.format(source.format)
    if source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", source.max_files_per_trigger)
    if source.format in ("json", "csv"):
        if CORRUPT in schema.fieldNames():
            raise PipelineConfigError(f"{key}.schema", f"{CORRUPT} is reserved", "rename that column")
        schema = T.StructType(schema.fields + [T.StructField(CORRUPT, T.StringType())])
        reader = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
        if source.format == "csv":
            header = source.header is not False
            reader = reader.option("header", str(header).lower())
            if header:
                # Spark's default (enforceSchema = true) ignores the header's names and reads by
                # position; false compares them with the schema and fails the batch on a mismatch.
                reader = reader.option("enforceSchema", "false")
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
        column, unit = source.event_time_column, source.event_time_unit
    elif source.kind == "rate":
        df, column, unit = _rate(spark, source), "timestamp", "ms"
    else:
        df, column, unit = _kafka(spark, source), "timestamp", "ms"
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
    df = df.withColumn("_event_ts", event_time(F.col(column), types[column], unit, key)).withColumn("_source", F.lit(source.name))
    if CORRUPT not in df.columns:
        df = df.withColumn(CORRUPT, F.lit(None).cast("string"))
    return df


def heartbeat(spark: SparkSession) -> DataFrame:
    return (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
            .select(F.lit(None).cast("timestamp").alias("_event_ts"), F.lit(HEARTBEAT).alias("_source"),
                    F.lit(None).cast("string").alias(CORRUPT)))


def union_sources(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """All sources (and the heartbeat under ``processing_time``) as one stream."""
    frames = [read_source(spark, spec, i) for i in range(len(spec.sources))]
    if spec.run.trigger == "processing_time":
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


def classify_read_error(exc: BaseException) -> EmatixError | None:
    """:class:`InputSchemaMismatch` when ``exc`` (or its cause) is Spark refusing an input file that
    does not fit the declared schema; None for anything else. Retrying cannot help such a batch: the
    same file is read again."""
    for text in _texts(exc):
        m = _CSV_HEADER_NAMES.search(text)
        if m:
            first = ""
            if m["expected"] is not None:  # they may differ in whitespace only: show them quoted
                first = f" (first difference: the schema's {m['expected']!r}, the header's {m['found']!r})"
            return InputSchemaMismatch(
                f"the header of CSV file {_local(m['file'])} does not match the source's schema: the header has the "
                f"columns ({m['header']}), the schema ({m['schema'].strip()}){first}; read by position, the values "
                f"would land in the wrong columns. Way out: {_WAY_OUT_CSV}")
        m = _CSV_HEADER_LENGTH.search(text)
        if m:
            path = _local(m["file"])
            return InputSchemaMismatch(
                f"the header of CSV file {path} has {m['header']} columns ({_csv_header(path)}), the source's schema "
                f"{m['schema']}. Way out: {_WAY_OUT_CSV}")
        m = _PARQUET_TYPE.search(text)
        if m:
            return InputSchemaMismatch(
                f"Parquet file {_local(m['file'])} holds column {m['column']} as {m['actual']}, but the source's "
                f"schema declares it {m['expected']}. Way out: rewrite the file with the declared type, or declare "
                "the column's type as the files hold it")
    return None
