"""Spark readStream sources, each adding ``_event_ts`` and ``_source`` (docs/contract/toml-reference.md).

Every source yields its payload columns plus ``_event_ts`` (TIMESTAMP, NULL when the event time
is missing or unparseable), ``_source`` (its name) and ``_corrupt_record`` (the raw line of a
malformed json/csv row, else NULL). The sources are unioned by name; the heartbeat (a 1-row/s
rate source) is added for ``processing_time`` runs so that idleness is noticed when nothing
arrives (docs/design.md).

Bad event times never fail a batch: numbers outside the timestamp range and unparseable strings
become NULL through ``try_*`` functions (ANSI mode is on in Spark 4). A file that does not fit the
declared schema as a whole (a CSV header naming the columns in another order) fails its batch
instead: reading it by position would put values into the wrong columns without a trace
(:mod:`.read_errors` says so, naming the file).

A message source (``kafka``, ``redis_stream``) with a ``format`` has its payload decoded into its
DDL columns by :mod:`.payloads`; ``redis_stream`` is the Python data source of :mod:`.redis_source`.

A *managed* files source (:func:`managed`) is only listed by its stream (Spark's ``binaryFile``
format, its ``content`` never selected); :mod:`.input_files` reads each batch's files, with this
module's schema, options and engine columns.

The spec given here is resolved (:meth:`PipelineSpec.resolved`): paths and options are used as
they are.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from pyspark import cloudpickle
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.columns import CORRUPT, EVENT_TS, HEARTBEAT, SOURCE
from ematix_dagster.errors import PipelineConfigError, first_line
from ematix_dagster.spark.sources import redis_source
from ematix_dagster.spark.sources.payloads import decoded
from ematix_dagster.spark.sources.redis_source import FORMAT as REDIS_FORMAT
from ematix_dagster.spark.sources.redis_source import RedisStreamDataSource
from ematix_dagster.spec import PipelineSpec, Source, environment

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
    return T._parse_datatype_string(ddl)


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


def read_schema(source: Source, key: str) -> T.StructType:
    """The schema a files source is read with: the declared one, plus ``_corrupt_record`` for json/csv."""
    schema = parse_schema(source, key)
    if source.format in ("json", "csv"):
        if CORRUPT in schema.fieldNames():
            raise PipelineConfigError(f"{key}.schema", f"{CORRUPT} is reserved", "rename that column")
        schema = T.StructType(schema.fields + [T.StructField(CORRUPT, T.StringType())])
    return schema


def format_options(reader, source: Source):  # a DataStreamReader or a DataFrameReader
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


def _files(spark: SparkSession, source: Source, key: str, engine_reads: bool) -> DataFrame:
    schema = read_schema(source, key)
    path = source.path or ""
    local = path[len("file://"):] if path.startswith("file://") else path
    if "://" not in local and not Path(local).is_dir():
        raise PipelineConfigError(f"{key}.path", f"directory {path!r} does not exist",
                                  "create it (an empty directory is fine) or correct the path")
    if engine_reads and source.read_by_engine:
        # Spark lists the files and logs each batch's list; input_files.InputFiles reads them in the batch.
        reader = spark.readStream.format("binaryFile").schema(_LISTING_SCHEMA)
        if source.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", source.max_files_per_trigger)
        return reader.load(source.path).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields])
    assert source.format is not None  # validated: a files source names its format
    reader = format_options(spark.readStream.format(source.format), source)
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


def redis_options(source: Source) -> dict[str, str]:
    """Reader options for a redis_stream source: its URL as written (the reader expands ``${NAME}``).
    A key the spec leaves unset is left out: the reader owns the defaults of its options."""
    options = {"url": source.url or "", "streams": json.dumps(list(source.streams))}
    if source.start:
        options["start"] = source.start
    if source.on_trimmed:
        options["on_trimmed"] = source.on_trimmed
    if source.max_entries_per_trigger:
        options["max_entries"] = str(source.max_entries_per_trigger)
    return options


def kafka_columns(df: DataFrame, source: Source, key: str) -> DataFrame:
    """Kafka's rows (its own schema) with key and value as text, the value decoded when the source
    has a ``format`` (:mod:`.payloads`)."""
    df = df.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        "topic", "partition", "offset", "timestamp",
    )
    return decoded(df, source, parse_schema(source, key), key) if source.format else df


def _kafka(spark: SparkSession, source: Source, key: str) -> DataFrame:
    return kafka_columns(spark.readStream.format("kafka").options(**kafka_options(source)).load(), source, key)


def ship_redis_reader() -> None:
    """Have the Redis reader pickled by value, with the one helper of the package it uses: Spark's
    Python workers then import redis-py, not this package (whose import costs each new worker most
    of a second, and which a cluster's workers need not have)."""
    for module in (redis_source, environment):
        cloudpickle.register_pickle_by_value(module)


def _redis(spark: SparkSession, source: Source, key: str) -> DataFrame:
    schema = parse_schema(source, key)  # before Spark hears of the source: a bad schema names its key
    ship_redis_reader()
    spark.dataSource.register(RedisStreamDataSource)
    return decoded(spark.readStream.format(REDIS_FORMAT).options(**redis_options(source)).load(), source, schema, key)


def read_source(spark: SparkSession, spec: PipelineSpec, index: int, engine_reads: bool = True) -> DataFrame:
    """One source as a streaming DataFrame with ``_event_ts``, ``_source`` and ``_corrupt_record``.

    ``engine_reads``: a source the engine reads itself (``Source.read_by_engine``) streams only its
    file listing; False streams its rows as any other (Spark's stateful aggregation reads them)."""
    source = spec.sources[index]
    key = f"sources[{index}]"
    if source.kind == "files":
        df = _files(spark, source, key, engine_reads)
    elif source.kind == "rate":
        df = _rate(spark, source)
    elif source.kind == "kafka":
        df = _kafka(spark, source, key)
    else:
        df = _redis(spark, source, key)
    return with_engine_columns(df, spec, index)


def with_engine_columns(df: DataFrame, spec: PipelineSpec, index: int) -> DataFrame:
    """A source's rows (streamed, or read by :class:`.input_files.InputFiles`) with the engine's
    columns added."""
    source = spec.sources[index]
    key = f"sources[{index}]"
    if source.kind == "files" or source.event_time_column:  # a payload column of a broker source
        column, unit = source.event_time_column, source.event_time_unit
    else:
        column, unit = "timestamp", "ms"  # the broker's time
    marks = spec.watermark  # the window's keys, or a row pipeline's [transform]
    if marks.event_time_column != EVENT_TS:
        column, unit, key = marks.event_time_column, marks.event_time_unit, f"{spec.watermark_table}.event_time_column"
    for reserved in (EVENT_TS, SOURCE):
        if reserved in df.columns:
            raise PipelineConfigError(f"{key}", f"the source already has a column named {reserved}",
                                      "rename it in the data or drop it; the engine adds this column")
    types = {f.name: f.dataType for f in df.schema.fields}
    if column not in types:
        raise PipelineConfigError(key, f"event time column {column!r} is not in the source's columns {sorted(types)}",
                                  "name one of the source's columns")
    added = {EVENT_TS: event_time(F.col(column), types[column], unit, key), SOURCE: F.lit(source.name)}
    if CORRUPT not in types:
        added[CORRUPT] = F.lit(None).cast("string")
    return df.withColumns(added)  # one step: each is analysed, in every batch of a managed source


def heartbeat(spark: SparkSession) -> DataFrame:
    return (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
            .select(F.lit(None).cast("timestamp").alias(EVENT_TS), F.lit(HEARTBEAT).alias(SOURCE),
                    F.lit(None).cast("string").alias(CORRUPT)))


def has_heartbeat(spec: PipelineSpec) -> bool:
    """Whether the stream carries heartbeat rows (``processing_time``: a batch runs on time without input,
    so the driver's watermark may move by idleness or processing time; Spark's stateful aggregation,
    ``window_state = "executors"``, has no use for one)."""
    return spec.run.trigger == "processing_time" and (spec.is_row_pipeline or spec.run.window_state == "driver")


def source_rows(spec: PipelineSpec, df: DataFrame) -> DataFrame:
    """A batch's rows from its sources: the heartbeat's left out (:func:`has_heartbeat`)."""
    return df.filter(F.col(SOURCE) != HEARTBEAT) if has_heartbeat(spec) else df


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
