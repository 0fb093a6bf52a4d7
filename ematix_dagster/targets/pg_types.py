"""Arrow -> PostgreSQL: the column types ``create_table`` uses and the Python values psycopg writes.

============================================  ===============================
arrow                                         PostgreSQL
============================================  ===============================
timestamp (any unit; naive values are UTC)    timestamptz (microseconds; ns are truncated)
int64                                         bigint
int32 / uint32                                integer / bigint
int16, int8, uint8 / uint16                   smallint / integer
uint64                                        numeric(20,0)
double / float / half float                   double precision / real / real
string, large_string                          text
bool                                          boolean
date32, date64                                date
decimal(p, s)                                 numeric(p, s)
binary, large_binary, fixed_size_binary       bytea
time32, time64                                time
duration                                      interval
dictionary<values>                            the mapping of the value type
============================================  ===============================

Other types (lists, structs, maps, null) are refused with a :class:`PipelineConfigError` naming
the column. An existing table (``create_table = false``, or created earlier) must have every output
column (extra columns are fine) and a unique index on exactly the key columns; with key columns
that may be NULL (group columns, a row pipeline's key) it must be ``NULLS NOT DISTINCT``, otherwise
NULL key values would duplicate rows. A column whose type differs from the mapping is accepted
with a warning (PostgreSQL casts on insert).

Timestamps outside Python's years 1..9999 (Spark holds about ±290,000 years) are written as
PostgreSQL text (``10000-01-01 00:00:00+00``, ``0044-03-15 00:00:00+00 BC``), so an extreme but
valid instant is stored instead of failing the batch. PostgreSQL itself holds 4713 BC to 294276
AD (:data:`PG_MIN_US`), and rows whose window bounds fall before it are dead-lettered as
``out_of_range`` before they reach a writer.

The dead-letter ``payload`` is JSON (:func:`_json_value`): timestamps become ISO-8601 strings (UTC),
dates and times ISO-8601 strings, decimals strings, bytes base64 strings, NaN / infinite floats the
strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, durations ISO-8601 ``PT<seconds>S`` strings,
structs objects, lists arrays; NUL characters in strings (which jsonb cannot hold) become U+FFFD.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import math
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.streaming.kinds.time_units import DATETIME_MAX_US, DATETIME_MIN_US

#: the earliest instant PostgreSQL's timestamptz holds (4713-11-24 BC), µs since the epoch; its
#: latest (294276 AD) is after every instant Spark holds
PG_MIN_US = -210_866_803_200_000_000
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def postgres_type(dtype: pa.DataType, column: str = "?", key: str = "target") -> str:
    """The PostgreSQL type used for an arrow type (see the module docstring)."""
    t = pa.types
    if t.is_dictionary(dtype):
        return postgres_type(dtype.value_type, column, key)
    if t.is_timestamp(dtype):
        return "timestamptz"
    if t.is_int64(dtype) or t.is_uint32(dtype):
        return "bigint"
    if t.is_int32(dtype) or t.is_uint16(dtype):
        return "integer"
    if t.is_int16(dtype) or t.is_int8(dtype) or t.is_uint8(dtype):
        return "smallint"
    if t.is_uint64(dtype):
        return "numeric(20,0)"
    if t.is_float64(dtype):
        return "double precision"
    if t.is_float32(dtype) or t.is_float16(dtype):
        return "real"
    if t.is_string(dtype) or t.is_large_string(dtype) or _is(dtype, "is_string_view"):
        return "text"
    if t.is_boolean(dtype):
        return "boolean"
    if t.is_date(dtype):
        return "date"
    if t.is_decimal(dtype):
        return f"numeric({dtype.precision},{dtype.scale})"
    if (t.is_binary(dtype) or t.is_large_binary(dtype) or t.is_fixed_size_binary(dtype)
            or _is(dtype, "is_binary_view")):
        return "bytea"
    if t.is_time(dtype):
        return "time"
    if t.is_duration(dtype):
        return "interval"
    raise PipelineConfigError(f"{key}.table", f"column {column!r} has type {dtype}, which has no PostgreSQL mapping",
                              "cast it in [transform] sql to a scalar type (string, bigint, double, timestamp, ...)")


def _is(dtype: pa.DataType, predicate: str) -> bool:
    fn = getattr(pa.types, predicate, None)
    return bool(fn and fn(dtype))


def _normalize_column(arr: pa.ChunkedArray) -> pa.ChunkedArray:
    """Cast a column to the type whose Python values psycopg writes correctly."""
    dtype = arr.type
    if pa.types.is_dictionary(dtype):
        arr = arr.cast(dtype.value_type)
        dtype = arr.type
    if pa.types.is_timestamp(dtype):
        # Naive timestamps are UTC instants (spark.sql.session.timeZone = UTC); Postgres keeps us.
        if dtype.unit != "us" or dtype.tz != "UTC":
            arr = arr.cast(pa.timestamp("us", tz="UTC"), safe=False)
    elif pa.types.is_float16(dtype):
        arr = arr.cast(pa.float32())
    elif pa.types.is_duration(dtype) and dtype.unit == "ns":
        arr = arr.cast(pa.duration("us"), safe=False)
    elif pa.types.is_time64(dtype) and dtype.unit == "ns":
        arr = arr.cast(pa.time64("us"), safe=False)
    return arr


def _python_columns(rows: pa.Table, names: Iterable[str]) -> list[list[Any]]:
    return [python_values(rows.column(n)) for n in names]


def python_values(arr: pa.ChunkedArray) -> list[Any]:
    """The column's values as psycopg writes them; timestamps outside years 1..9999 as PostgreSQL text."""
    arr = _normalize_column(arr)
    if not pa.types.is_timestamp(arr.type) or arr.null_count == len(arr):
        return arr.to_pylist()
    micros = arr.cast(pa.int64())
    bounds = pc.min_max(micros)
    if DATETIME_MIN_US <= bounds["min"].as_py() and bounds["max"].as_py() <= DATETIME_MAX_US:
        return arr.to_pylist()
    return [None if v is None else _EPOCH + _dt.timedelta(microseconds=v) if DATETIME_MIN_US <= v <= DATETIME_MAX_US
            else postgres_timestamp_text(v) for v in micros.to_pylist()]


def postgres_timestamp_text(micros: int) -> str:
    """PostgreSQL's text for an instant (UTC) that Python's datetime cannot hold.

    >>> postgres_timestamp_text(253_402_300_800_000_000)
    '10000-01-01 00:00:00.000000+00'
    >>> postgres_timestamp_text(-62_135_596_800_000_001)  # numpy's year 0 is 1 BC
    '0001-12-31 23:59:59.999999+00 BC'
    """
    text = str(np.datetime_as_string(np.datetime64(micros, "us"), unit="us"))
    negative = text.startswith("-")
    year, rest = text.lstrip("-").split("-", 1)
    rest = rest.replace("T", " ") + "+00"
    astronomical = -int(year) if negative else int(year)
    if astronomical >= 1:
        return f"{astronomical:04d}-{rest}"
    return f"{1 - astronomical:04d}-{rest} BC"


def _json_value(v: Any) -> Any:
    """A JSON-able value for the dead-letter payload (see the module docstring)."""
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    if isinstance(v, str):
        return v.replace("\x00", "\ufffd")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, _dt.datetime):  # also pandas.Timestamp (nanosecond timestamps)
        if v.tzinfo is None:
            v = v.replace(tzinfo=_dt.timezone.utc)
        return v.astimezone(_dt.timezone.utc).isoformat()
    if isinstance(v, (_dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, _dt.timedelta):
        return f"PT{v.total_seconds():g}S"
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        # arrow maps come back as lists of (key, value) tuples
        if v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v):
            return {k: _json_value(x) for k, x in v}
        return [_json_value(x) for x in v]
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _text(v: Any) -> str | None:
    return None if v is None else str(v).replace("\x00", "\ufffd")


def _canonical_type(name: str) -> str:
    name = name.lower().replace(" ", "")
    return {"timestampwithtimezone": "timestamptz", "timewithouttimezone": "time"}.get(name, name)
