"""Writers for closed windows (``[target]``) and dead-letter rows (``[dead_letter]``).

Everything here is pyarrow and psycopg: no Spark. The engine hands each writer one
:class:`pyarrow.Table` per micro-batch, together with the batch id from the streaming checkpoint.
Writers are built from the resolved spec (:meth:`~ematix_dagster.spec.PipelineSpec.resolved`), so
URLs and paths are used as they are.

Replays and the guarantee (SPEC.md §5)
--------------------------------------
Spark re-runs the last micro-batch after a crash with the same batch id and the same input, and a
durable state store makes it emit the same rows again. Every durable writer is therefore written
so that *writing batch N twice leaves exactly what writing it once left*, which turns the
at-least-once delivery of Spark into effectively-once output:

* **postgres target**: an upsert on ``(window_start, group columns...)``. The rows are COPYed into a
  temporary table and merged with ``INSERT ... SELECT ... ON CONFLICT (key) DO UPDATE`` in one
  transaction, so a replay rewrites identical values (rows whose values did not change are not
  touched at all) and a later correction replaces the earlier row of the same key. Within one
  batch the last row of a key wins. The key constraint is ``UNIQUE NULLS NOT DISTINCT`` so that
  NULL group keys form one group (PostgreSQL >= 15). ``_emit_kind`` is not stored: the table
  always holds the latest row per key. :meth:`PostgresWindowWriter.write_in_transaction` does the
  same on a caller's connection without committing, so a Postgres state store in the same
  database can commit state and output together (exactly-once).
* **parquet target / parquet dead letters**: each batch goes to ``<path>/batch_id=<N>/part-0.parquet``
  (the end-of-input flush writes ``flush.parquet`` beside the last batch's file). Each file is
  written (and fsynced) under a hidden temporary name and renamed into place, so readers see the
  old or the new complete file, never a partial one, and a replay replaces it. Temporary files
  left by a crash are removed by ``open()``. The parquet target keeps ``_emit_kind``
  (``final`` | ``correction``): readers keep the latest row per key by ``batch_id`` then emit kind.
  Only local paths (or ``file://``) are supported.
* **postgres dead letters**: ``DELETE`` the rows of the batch id, then COPY the new ones, in one
  transaction (``write_in_transaction`` likewise commits nothing). A dead-letter table therefore
  belongs to one pipeline: a second pipeline writing the same table would delete the first one's
  rows of the same batch id.
* **console**: prints each batch; a replay prints it again, so the console target is
  at-least-once (``idempotent = False``; the engine warns at start).

Empty batches are a no-op for every writer (nothing is written, nothing is deleted).

Arrow -> PostgreSQL type mapping (``create_table = true``)
---------------------------------------------------------
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
column (extra columns are fine) and a unique index on exactly the key columns; with group columns
it must be ``NULLS NOT DISTINCT``, otherwise NULL group keys would duplicate rows. A column whose
type differs from the mapping is accepted with a warning (PostgreSQL casts on insert).

Dead-letter table (postgres)
----------------------------
A fixed shape that survives schema drift of the payload::

    _batch_id bigint NOT NULL, _source text, _event_ts timestamptz, _reason text, payload jsonb NOT NULL

plus an index on ``_batch_id`` (for the replay delete). ``payload`` is a JSON object of every
column other than ``_source``, ``_event_ts``, ``_batch_id`` and ``_reason``: timestamps become
ISO-8601 strings (UTC), dates and times ISO-8601 strings, decimals strings, bytes base64 strings,
NaN / infinite floats the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, durations ISO-8601
``PT<seconds>S`` strings, structs objects, lists arrays; NUL characters in strings (which jsonb
cannot hold) become U+FFFD. ``_batch_id`` is always the batch id passed to ``write``. The table is
created only with ``create_table = true`` (as for the target: DDL is never run without being asked
for); otherwise it must exist with those columns, which ``open()`` checks.

Errors
------
Connection and I/O failures raise :class:`TargetError` (``terminal = False``: a retry may help;
a refused login, a missing role or database is ``terminal = True``)
naming the pipeline, the table and ``host:port/dbname``, never the password: passwords are
stripped from every message and raw DSNs are never printed. Data errors raised by PostgreSQL
(a value that does not fit an existing column, ...) are also :class:`TargetError` but with
``terminal = True``. A table that does not fit is a :class:`PipelineConfigError`.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import logging
import math
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any, Iterable, Protocol, runtime_checkable

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from ematix_dagster.errors import PipelineConfigError, TargetError
from ematix_dagster.spec import DeadLetter, Target
from state_store.postgres import access_denied

__all__ = [
    "EMIT_KIND_COLUMN",
    "DEAD_LETTER_COLUMNS",
    "WindowWriter",
    "DeadLetterWriter",
    "PostgresWindowWriter",
    "ParquetWriter",
    "ConsoleWindowWriter",
    "PostgresDeadLetterWriter",
    "make_window_writer",
    "make_dead_letter_writer",
    "postgres_type",
    "redact_url",
]

log = logging.getLogger(__name__)

EMIT_KIND_COLUMN = "_emit_kind"
#: Envelope columns of dead-letter rows, in the order of the Postgres dead-letter table.
DEAD_LETTER_COLUMNS = ("_batch_id", "_source", "_event_ts", "_reason")
_PAYLOAD_COLUMN = "payload"
_ORD_COLUMN = "__ematix_row_ord"
_STAGE_TABLE = "ematix_stage_rows"
_MIN_SERVER_VERSION = 150000  # UNIQUE NULLS NOT DISTINCT
_CONNECT_TIMEOUT_S = 10


# ---------------------------------------------------------------------------------------------
# Protocols and factories


@runtime_checkable
class WindowWriter(Protocol):
    """Writes the closed windows of one micro-batch."""

    idempotent: bool
    description: str

    def open(self) -> None: ...

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class DeadLetterWriter(Protocol):
    """Writes the dead-letter rows of one micro-batch (rows of any schema)."""

    idempotent: bool
    description: str

    def open(self) -> None: ...

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None: ...

    def close(self) -> None: ...


def make_window_writer(target: Target, pipeline_name: str, schema: pa.Schema,
                       key_columns: list[str]) -> WindowWriter:
    """The writer for ``[target]``.

    ``schema`` is the output schema including the trailing ``_emit_kind`` column; ``key_columns``
    is ``[window start column] + group columns`` (the upsert key).
    """
    names = list(schema.names)
    if EMIT_KIND_COLUMN not in names:
        raise ValueError(f"the output schema has no {EMIT_KIND_COLUMN} column: {names}")
    missing = [k for k in key_columns if k not in names]
    if not key_columns or missing:
        raise ValueError(f"key columns {missing or key_columns} are not output columns {names}")
    if target.kind == "postgres":
        return PostgresWindowWriter(target, pipeline_name, schema, key_columns)
    if target.kind == "parquet":
        return ParquetWriter(target.path, pipeline_name, "target")
    if target.kind == "console":
        return ConsoleWindowWriter(pipeline_name)
    raise PipelineConfigError("target.kind", f"unknown target kind {target.kind!r}",
                              'use "postgres", "parquet" or "console"')


def make_dead_letter_writer(dead_letter: DeadLetter, pipeline_name: str) -> DeadLetterWriter:
    """The writer for ``[dead_letter]``."""
    if dead_letter.kind == "postgres":
        return PostgresDeadLetterWriter(dead_letter, pipeline_name)
    if dead_letter.kind == "parquet":
        return ParquetWriter(dead_letter.path, pipeline_name, "dead_letter")
    raise PipelineConfigError("dead_letter.kind", f"unknown dead-letter kind {dead_letter.kind!r}",
                              'use "parquet" or "postgres"')


# ---------------------------------------------------------------------------------------------
# Type mapping and row conversion


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
    return [_normalize_column(rows.column(n)).to_pylist() for n in names]


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


# ---------------------------------------------------------------------------------------------
# Secrets


def redact_url(url: str) -> str:
    """``url`` with any password removed (``postgresql://u:***@h/db``; ``password=***``)."""
    out = re.sub(r"(://[^:/?#@\s]*):[^@/?#\s]*@", r"\1:***@", url)
    out = re.sub(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", out)
    return out


def _scrub(text: str, secrets: Iterable[str | None]) -> str:
    """Remove passwords from an error text; withhold it when a short password cannot be removed."""
    text = redact_url(text)
    for secret in secrets:
        if not secret or secret not in text:
            continue
        if len(secret) >= 4:
            text = text.replace(secret, "***")
        else:
            return "(details withheld: they may contain the password)"
    return text


def _error_text(exc: BaseException, secrets: Iterable[str | None]) -> str:
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = primary or str(exc) or type(exc).__name__
    text = " ".join(text.split())
    return _scrub(text, secrets)


# ---------------------------------------------------------------------------------------------
# PostgreSQL


class _PostgresTable:
    """Connection handling shared by the postgres target and dead-letter writers."""

    def __init__(self, url: str | None, table: str | None, pipeline_name: str, key: str) -> None:
        if not url or not table:
            raise PipelineConfigError(f"{key}.url", "url and table are required for postgres",
                                      'e.g. url = "${EMATIX_TARGET_URL}", table = "public.t"')
        self.pipeline_name = pipeline_name
        self.key = key
        self._raw_url = url
        parts = table.split(".")
        if len(parts) > 2 or not all(parts):
            raise PipelineConfigError(f"{key}.table", f"{table!r} is not schema.table", 'e.g. "public.t"')
        self.schema_name: str | None = parts[0] if len(parts) == 2 else None
        self.table_name = parts[-1]
        self.table_text = table
        self.ident = (sql.Identifier(self.schema_name, self.table_name) if self.schema_name
                      else sql.Identifier(self.table_name))
        self._url: str | None = None
        self._password: str | None = None
        self._where = "PostgreSQL"
        self._conn: psycopg.Connection | None = None
        # Parse eagerly when possible so the description names the host; a URL that does not
        # parse is reported by open().
        try:
            self._resolve()
        except PipelineConfigError:
            pass

    # -- url

    def _resolve(self) -> str:
        if self._url is None:
            url = self._raw_url  # resolved by the caller (PipelineSpec.resolved)
            try:
                info = conninfo_to_dict(url)
            except Exception:
                raise PipelineConfigError(f"{self.key}.url", "is not a valid PostgreSQL connection URL",
                                          'use "postgresql://user@host:port/dbname" (password from the environment)') from None
            self._password = info.get("password")
            host = info.get("host") or info.get("hostaddr") or "localhost"
            port = info.get("port") or "5432"
            db = info.get("dbname") or info.get("user") or "?"
            self._where = f"{host}:{port}/{db}"
            self._url = url
        return self._url

    def _secrets(self) -> list[str | None]:
        return [self._password, os.environ.get("PGPASSWORD")]

    def _fail(self, action: str, exc: BaseException) -> TargetError:
        err = TargetError(f"pipeline {self.pipeline_name!r}: {action} {self.table_text!r} on "
                          f"{self._where} failed: {_error_text(exc, self._secrets())}")
        # Connection trouble may pass; a value or a login PostgreSQL refuses will be refused again.
        if access_denied(exc) or (isinstance(exc, psycopg.Error)
                                  and not isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))):
            err.terminal = True
        return err

    # -- connection

    def connect(self) -> psycopg.Connection:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        url = self._resolve()
        kwargs: dict[str, Any] = {"autocommit": False}
        if "connect_timeout" not in conninfo_to_dict(url):
            kwargs["connect_timeout"] = _CONNECT_TIMEOUT_S
        try:
            conn = psycopg.connect(url, **kwargs)
        except Exception as exc:  # psycopg.OperationalError, socket errors, ...
            raise self._fail("connecting for table", exc) from None
        if conn.info.server_version < _MIN_SERVER_VERSION:
            version = conn.info.server_version
            conn.close()
            raise PipelineConfigError(f"{self.key}.url", f"PostgreSQL {version // 10000} on {self._where} is too old",
                                      "use PostgreSQL 15 or later (UNIQUE NULLS NOT DISTINCT)")
        self._conn = conn
        return conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _drop_broken_connection(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            if conn.closed or conn.broken:
                self._conn = None
            else:
                conn.rollback()
        except Exception:
            self.close()

    # -- catalog

    def qualified_text(self, conn: psycopg.Connection) -> str:
        return self.ident.as_string(conn)

    def table_oid(self, conn: psycopg.Connection) -> int | None:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)::oid", (self.qualified_text(conn),))
            row = cur.fetchone()
        return row[0] if row and row[0] is not None else None

    def ensure_schema(self, conn: psycopg.Connection) -> None:
        if not self.schema_name:
            return
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema_name,))
            if cur.fetchone() is None:
                cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema_name)))

    def columns(self, conn: psycopg.Connection, oid: int) -> dict[str, str]:
        with conn.cursor() as cur:
            cur.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                        "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (oid,))
            return {name: typ for name, typ in cur.fetchall()}

    def check_columns(self, conn: psycopg.Connection, oid: int, wanted: dict[str, str]) -> None:
        have = self.columns(conn, oid)
        missing = [c for c in wanted if c not in have]
        if missing:
            raise PipelineConfigError(
                f"{self.key}.table",
                f"table {self.table_text!r} on {self._where} lacks column(s) {', '.join(missing)} "
                f"(it has {', '.join(have) or 'none'})",
                "add the columns, or drop the table and set create_table = true to create it")
        for col, typ in wanted.items():
            if _canonical_type(have[col]) != _canonical_type(typ):
                log.warning("pipeline %r: column %r of %s is %s, the output type maps to %s; PostgreSQL will cast",
                            self.pipeline_name, col, self.table_text, have[col], typ)

    def missing_table_error(self) -> PipelineConfigError:
        return PipelineConfigError(f"{self.key}.table", f"table {self.table_text!r} does not exist on {self._where}",
                                   "set create_table = true, or create the table first")


def _canonical_type(name: str) -> str:
    name = name.lower().replace(" ", "")
    return {"timestampwithtimezone": "timestamptz", "timewithouttimezone": "time"}.get(name, name)


class PostgresWindowWriter:
    """Upserts closed windows into a PostgreSQL table (see the module docstring)."""

    idempotent = True

    def __init__(self, target: Target, pipeline_name: str, schema: pa.Schema, key_columns: list[str]) -> None:
        self._pg = _PostgresTable(target.url, target.table, pipeline_name, "target")
        self.create_table = bool(target.create_table)
        self.pipeline_name = pipeline_name
        self.columns = [n for n in schema.names if n != EMIT_KIND_COLUMN]
        self.key_columns = list(key_columns)
        self.value_columns = [c for c in self.columns if c not in self.key_columns]
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"duplicate output column names: {self.columns}")
        self.types = {n: postgres_type(schema.field(n).type, n, "target") for n in self.columns}
        self._opened = False

    @property
    def description(self) -> str:
        return f"postgres table {self._pg.table_text} on {self._pg._where} (upsert on {', '.join(self.key_columns)})"

    @property
    def table(self) -> str:
        return self._pg.table_text

    def open(self) -> None:
        conn = self._pg.connect()
        try:
            if self.create_table:
                self._pg.ensure_schema(conn)
                col_defs = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(self.types[c]))
                            for c in self.columns]
                ddl = sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, UNIQUE NULLS NOT DISTINCT ({}))").format(
                    self._pg.ident, sql.SQL(", ").join(col_defs),
                    sql.SQL(", ").join(sql.Identifier(k) for k in self.key_columns))
                with conn.cursor() as cur:
                    cur.execute(ddl)
            oid = self._pg.table_oid(conn)
            if oid is None:
                raise self._pg.missing_table_error()
            self._pg.check_columns(conn, oid, self.types)
            self._check_unique_key(conn, oid)
            conn.commit()
        except PipelineConfigError:
            self._pg._drop_broken_connection()
            raise
        except psycopg.Error as exc:
            self._pg._drop_broken_connection()
            raise self._pg._fail("preparing table", exc) from None
        self._opened = True

    def _check_unique_key(self, conn: psycopg.Connection, oid: int) -> None:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT i.indnullsnotdistinct, "
                "       array(SELECT a.attname::text FROM unnest(i.indkey) k "
                "             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k) "
                "FROM pg_index i WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid "
                "AND i.indpred IS NULL AND i.indexprs IS NULL", (oid,))
            indexes = cur.fetchall()
        wanted = set(self.key_columns)
        matching = [nnd for nnd, cols in indexes if set(cols) == wanted and len(cols) == len(wanted)]
        keys = ", ".join(self.key_columns)
        if not matching:
            raise PipelineConfigError(
                "target.table", f"table {self.table!r} on {self._pg._where} has no unique key on ({keys})",
                f"ALTER TABLE ... ADD UNIQUE NULLS NOT DISTINCT ({keys}), or let create_table = true create the table")
        if len(self.key_columns) > 1 and not any(matching):
            raise PipelineConfigError(
                "target.table", f"the unique key ({keys}) of {self.table!r} treats NULLs as distinct, "
                "so NULL group keys would duplicate rows",
                f"recreate it as UNIQUE NULLS NOT DISTINCT ({keys})")

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        _commit_write(self, batch_id, rows, f"writing batch {batch_id} to")

    def write_in_transaction(self, conn: psycopg.Connection, batch_id: int, rows: pa.Table) -> None:
        """Upsert ``rows`` using ``conn``'s current transaction; the caller commits.

        ``conn`` must not be in autocommit mode (the staging table lives until commit). psycopg
        errors propagate unchanged so that the caller can roll back its whole transaction.
        """
        if rows.num_rows == 0:
            return
        if conn.autocommit:
            raise ValueError("write_in_transaction needs a connection with autocommit = False")
        missing = [c for c in self.columns if c not in rows.column_names]
        if missing:
            raise ValueError(f"batch {batch_id} lacks output column(s) {missing}")
        cols = [sql.Identifier(c) for c in self.columns]
        keys = [sql.Identifier(c) for c in self.key_columns]
        stage = sql.Identifier(_STAGE_TABLE)
        ord_col = sql.Identifier(_ORD_COLUMN)
        col_list = sql.SQL(", ").join(cols)
        key_list = sql.SQL(", ").join(keys)
        values = [sql.Identifier(c) for c in self.value_columns]
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(stage))
            cur.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {}, 0::bigint AS {} FROM {} WITH NO DATA")
                        .format(stage, col_list, ord_col, self._pg.ident))
            data = _python_columns(rows, self.columns)
            with cur.copy(sql.SQL("COPY {} ({}, {}) FROM STDIN").format(stage, col_list, ord_col)) as copy:
                for i, row in enumerate(zip(*data)):
                    copy.write_row((*row, i))
            cur.execute(sql.SQL(
                "INSERT INTO {target} AS t ({cols}) "
                "SELECT {cols} FROM (SELECT DISTINCT ON ({keys}) {cols} FROM {stage} ORDER BY {keys}, {ord} DESC) s "
                "ON CONFLICT ({keys}) DO UPDATE SET {sets} WHERE ({old}) IS DISTINCT FROM ({new})").format(
                    target=self._pg.ident, cols=col_list, keys=key_list, stage=stage, ord=ord_col,
                    sets=sql.SQL(", ").join(sql.SQL("{} = EXCLUDED.{}").format(v, v) for v in values),
                    old=sql.SQL(", ").join(sql.SQL("t.{}").format(v) for v in values),
                    new=sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(v) for v in values)))
            cur.execute(sql.SQL("DROP TABLE {}").format(stage))

    def close(self) -> None:
        self._pg.close()
        self._opened = False


def _commit_write(writer: "PostgresWindowWriter | PostgresDeadLetterWriter", batch_id: int, rows: pa.Table,
                  action: str) -> None:
    """``write_in_transaction`` on the writer's own connection, committed; failures reconnect next time."""
    if rows.num_rows == 0:
        return
    conn = writer._pg.connect()
    if not writer._opened:
        writer.open()
    try:
        writer.write_in_transaction(conn, batch_id, rows)
        conn.commit()
    except psycopg.Error as exc:
        writer._pg._drop_broken_connection()
        raise writer._pg._fail(action, exc) from None
    except BaseException:
        writer._pg._drop_broken_connection()
        raise


class PostgresDeadLetterWriter:
    """Dead-letter rows into a fixed-shape PostgreSQL table, replaced per batch id on replay."""

    idempotent = True

    def __init__(self, dead_letter: DeadLetter, pipeline_name: str) -> None:
        self._pg = _PostgresTable(dead_letter.url, dead_letter.table, pipeline_name, "dead_letter")
        self.create_table = bool(dead_letter.create_table)
        self.pipeline_name = pipeline_name
        self._opened = False

    _TYPES = {"_batch_id": "bigint", "_source": "text", "_event_ts": "timestamptz", "_reason": "text",
              _PAYLOAD_COLUMN: "jsonb"}

    @property
    def description(self) -> str:
        return f"postgres dead-letter table {self._pg.table_text} on {self._pg._where}"

    @property
    def table(self) -> str:
        return self._pg.table_text

    def open(self) -> None:
        conn = self._pg.connect()
        try:
            if self.create_table:
                self._pg.ensure_schema(conn)
                index = sql.Identifier(f"{self._pg.table_name}_batch_id_idx"[:63])
                with conn.cursor() as cur:
                    cur.execute(sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (_batch_id bigint NOT NULL, _source text, "
                        "_event_ts timestamptz, _reason text, payload jsonb NOT NULL)").format(self._pg.ident))
                    cur.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (_batch_id)").format(index, self._pg.ident))
            oid = self._pg.table_oid(conn)
            if oid is None:
                raise self._pg.missing_table_error()
            self._pg.check_columns(conn, oid, self._TYPES)
            conn.commit()
        except PipelineConfigError:
            self._pg._drop_broken_connection()
            raise
        except psycopg.Error as exc:
            self._pg._drop_broken_connection()
            raise self._pg._fail("preparing dead-letter table", exc) from None
        self._opened = True

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        _commit_write(self, batch_id, rows, f"writing dead letters of batch {batch_id} to")

    def write_in_transaction(self, conn: psycopg.Connection, batch_id: int, rows: pa.Table) -> None:
        """Replace the batch's dead letters using ``conn``'s transaction; the caller commits."""
        if rows.num_rows == 0:
            return
        if conn.autocommit:
            raise ValueError("write_in_transaction needs a connection with autocommit = False")
        for c in ("_source", "_reason"):
            if c not in rows.column_names:
                raise ValueError(f"dead-letter rows of batch {batch_id} lack the {c} column")
        n = rows.num_rows
        sources = _python_columns(rows, ["_source"])[0]
        reasons = _python_columns(rows, ["_reason"])[0]
        if "_event_ts" in rows.column_names:
            ts = rows.column("_event_ts")
            if not pa.types.is_timestamp(ts.type):
                raise ValueError(f"_event_ts of batch {batch_id} is {ts.type}, not a timestamp")
            event_ts = _normalize_column(ts).to_pylist()
        else:
            event_ts = [None] * n
        payload_cols = [c for c in rows.column_names if c not in DEAD_LETTER_COLUMNS]
        payload_data = [rows.column(c).to_pylist() for c in payload_cols]
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DELETE FROM {} WHERE _batch_id = %s").format(self._pg.ident), (batch_id,))
            with cur.copy(sql.SQL("COPY {} (_batch_id, _source, _event_ts, _reason, payload) FROM STDIN")
                          .format(self._pg.ident)) as copy:
                for i in range(n):
                    payload = {c: _json_value(col[i]) for c, col in zip(payload_cols, payload_data)}
                    copy.write_row((batch_id, _text(sources[i]), event_ts[i], _text(reasons[i]),
                                    json.dumps(payload, allow_nan=False, ensure_ascii=False)))

    def close(self) -> None:
        self._pg.close()
        self._opened = False


def _text(v: Any) -> str | None:
    return None if v is None else str(v).replace("\x00", "\ufffd")


# ---------------------------------------------------------------------------------------------
# Parquet


class _BatchDirectories:
    """``<path>/batch_id=<N>/<part>.parquet``, each file replaced atomically on replay."""

    def __init__(self, path: str | None, pipeline_name: str, key: str) -> None:
        if not path:
            raise PipelineConfigError(f"{key}.path", "is required for parquet", "name an output directory")
        if path.startswith("file://"):
            path = path[len("file://"):]
        elif "://" in path:
            raise PipelineConfigError(f"{key}.path", f"{path!r} is not a local directory",
                                      "use a local path (remote file systems are not supported yet)")
        self.root = Path(path)
        self.pipeline_name = pipeline_name
        self.key = key

    def _fail(self, action: str, exc: BaseException) -> TargetError:
        return TargetError(f"pipeline {self.pipeline_name!r}: {action} under {str(self.root)!r} failed: {exc}")

    def open(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._recover()
        except OSError as exc:
            raise self._fail("preparing the parquet directory", exc) from None

    def _recover(self) -> None:
        """Remove temporary files a crash inside :meth:`write` left behind (readers skip them anyway)."""
        for entry in self.root.glob("batch_id=*/.*.tmp-*"):
            entry.unlink(missing_ok=True)

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        """Write ``batch_id=N/<part>.parquet`` with one atomic rename; a replay replaces the file."""
        if rows.num_rows == 0:
            return
        directory = self.root / f"batch_id={int(batch_id)}"
        final = directory / f"{part}.parquet"
        tmp = directory / f".{part}.parquet.tmp-{uuid.uuid4().hex[:12]}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                pq.write_table(rows, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            _fsync_dir(directory)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._fail(f"writing batch {batch_id}", exc) from None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class ParquetWriter:
    """Rows to ``<path>/batch_id=<N>/part-0.parquet``: windows (with ``_emit_kind``) or dead letters."""

    idempotent = True

    def __init__(self, path: str | None, pipeline_name: str, key: str) -> None:
        self._dirs = _BatchDirectories(path, pipeline_name, key)
        self.path = str(self._dirs.root)
        what = "dead-letter batch directories" if key == "dead_letter" else "batch directories"
        self.description = f"parquet {what} under {self.path}"

    def open(self) -> None:
        self._dirs.open()

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        self._dirs.write(batch_id, rows, part)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Console


class ConsoleWindowWriter:
    """Prints each batch's windows to stdout; replays print again (at-least-once)."""

    idempotent = False

    def __init__(self, pipeline_name: str) -> None:
        self.pipeline_name = pipeline_name
        self.description = "console (stdout)"

    def open(self) -> None:
        pass

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        if rows.num_rows == 0:
            return
        n = rows.num_rows
        text = rows.to_pandas().to_string(index=False)
        out = sys.stdout
        out.write(f"-- batch {batch_id}: {n} window{'' if n == 1 else 's'} --\n{text}\n")
        out.flush()

    def close(self) -> None:
        pass
