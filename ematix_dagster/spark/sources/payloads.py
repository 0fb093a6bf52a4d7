"""Message payloads as the source's DDL columns, for every broker (Kafka and Redis alike).

A broker source yields its payload as text beside its own columns (a Kafka message's ``value``;
a Redis entry's ``fields`` map). :func:`decoded` turns it into the DDL ``schema``'s columns, typed,
and keeps the broker's columns (``timestamp`` among them, the event time unless
``event_time_column`` names a payload column). What does not decode is a ``malformed`` row, as a
malformed line of a json file is: ``_corrupt_record`` holds its raw text (a Redis entry's fields
as a JSON object), and the batch counts and dead-letters it whatever of its payload Spark parsed. Nothing
here fails a batch on a bad payload: ``from_json`` is permissive and the casts are ``try_cast``.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.columns import CORRUPT
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import Source

#: the columns each broker keeps beside the payload's
BROKER_COLUMNS = {"kafka": ("key", "topic", "partition", "offset", "timestamp"),
                  "redis_stream": ("stream", "entry_id", "timestamp")}
#: a Redis entry's JSON document is in this field unless ``json_field`` names another
DEFAULT_JSON_FIELD = "data"


def _raw(source: Source) -> tuple[Column, Column]:
    """The payload text to decode, and the raw text a malformed row keeps when it is NULL."""
    if source.kind == "kafka":
        return F.col("value"), F.lit("")  # a tombstone (NULL value) is not a document
    fields = F.col("fields")
    return fields[source.json_field or DEFAULT_JSON_FIELD], F.to_json(fields)


def decoded(df: DataFrame, source: Source, schema: T.StructType, key: str) -> DataFrame:
    """``df`` (a broker's raw rows) with the payload decoded into ``schema``'s columns and
    ``_corrupt_record`` set on the rows whose payload does not decode."""
    broker = BROKER_COLUMNS[source.kind]
    for f in schema.fields:
        if f.name in broker or f.name == CORRUPT:
            raise PipelineConfigError(f"{key}.schema", f"column {f.name!r} is taken by the {source.kind} source's own "
                                      f"columns ({', '.join(broker)}, {CORRUPT})", "rename it in the schema")
    kept = [F.col(c) for c in broker]
    if source.format == "json":
        raw, when_missing = _raw(source)
        with_corrupt = T.StructType(schema.fields + [T.StructField(CORRUPT, T.StringType())])
        parsed = F.from_json(raw, with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
        return (df.select(*kept, raw.alias("_raw"), when_missing.alias("_missing"), parsed.alias("_doc"))
                .select(*broker, *[F.col(f"_doc.{f.name}").alias(f.name) for f in schema.fields],
                        F.when(F.col("_raw").isNull(), F.col("_missing"))
                        .otherwise(F.col(f"_doc.{CORRUPT}")).alias(CORRUPT)))
    return _fields(df, schema, kept, key)


def _fields(df: DataFrame, schema: T.StructType, kept: list[Column], key: str) -> DataFrame:
    """``format = "fields"``: each DDL column is the entry's field of that name, cast with
    ``try_cast``; a field that is there but does not cast makes the entry malformed (a missing
    field is NULL, as a missing JSON key is)."""
    fields = F.col("fields")
    for f in schema.fields:
        if isinstance(f.dataType, (T.StructType, T.ArrayType, T.MapType, T.BinaryType)):
            raise PipelineConfigError(f"{key}.schema", f"column {f.name!r} is {f.dataType.simpleString()}, which a "
                                      "Redis field (text) cannot be cast to", 'use format = "json" for nested values')
    cast = [(f.name, fields[f.name].try_cast(f.dataType)) for f in schema.fields]
    failed = [fields[name].isNotNull() & value.isNull() for name, value in cast]
    bad = reduce(lambda a, b: a | b, failed, F.lit(False))
    return df.select(*kept, *[value.alias(name) for name, value in cast], F.when(bad, F.to_json(fields)).alias(CORRUPT))
