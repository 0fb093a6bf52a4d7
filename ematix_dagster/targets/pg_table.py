"""One PostgreSQL table a writer or a Dagster check works on: its URL, connection and catalog.

Shared so that both name the table and ``host:port/dbname`` alike and never show a password.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Collection, Mapping, Sequence

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from ematix_dagster.columns import BATCH_ID
from ematix_dagster.errors import PipelineConfigError, StoreConfigError, TargetError
from ematix_dagster.targets.pg_types import _canonical_type
from state_store.pg_url import access_denied, error_text, parse_url

log = logging.getLogger(__name__)

_MIN_SERVER_VERSION = 150000  # UNIQUE NULLS NOT DISTINCT
_CONNECT_TIMEOUT_S = 10


class PostgresTable:
    """Connection handling shared by the postgres writers and the Dagster target-key check."""

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
        self.where = "PostgreSQL"
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
                info = parse_url(url)  # from here on its password is cut out of every text
            except StoreConfigError:
                raise PipelineConfigError(f"{self.key}.url", "is not a valid PostgreSQL connection URL",
                                          'use "postgresql://user@host:port/dbname" (password from the environment)') from None
            host = info.get("host") or info.get("hostaddr") or "localhost"
            port = info.get("port") or "5432"
            db = info.get("dbname") or info.get("user") or "?"
            self.where = f"{host}:{port}/{db}"
            self._url = url
        return self._url

    def error(self, action: str, exc: BaseException) -> TargetError:
        err = TargetError(f"pipeline {self.pipeline_name!r}: {action} {self.table_text!r} on "
                          f"{self.where} failed: {error_text(exc)}")
        # Connection trouble may pass; a value or a login PostgreSQL refuses will be refused again.
        if access_denied(exc) or (isinstance(exc, psycopg.Error)
                                  and not isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))):
            err.terminal = True
        return err

    # -- connection

    def connect(self) -> psycopg.Connection:
        """The writer's connection (opened once, reused by every batch it writes)."""
        if self._conn is None or self._conn.closed:
            self._conn = self.new_connection()
        return self._conn

    def new_connection(self, autocommit: bool = False) -> psycopg.Connection:
        """A connection of its own, for a read that must not run inside the writer's transaction
        (nor from another thread on the writer's connection); the caller closes it."""
        url = self._resolve()
        kwargs: dict[str, Any] = {"autocommit": autocommit}
        if "connect_timeout" not in conninfo_to_dict(url):
            kwargs["connect_timeout"] = _CONNECT_TIMEOUT_S
        try:
            conn = psycopg.connect(url, **kwargs)
        except Exception as exc:  # psycopg.OperationalError, socket errors, ...
            raise self.error("connecting for table", exc) from None
        if conn.info.server_version < _MIN_SERVER_VERSION:
            version = conn.info.server_version
            conn.close()
            raise PipelineConfigError(f"{self.key}.url", f"PostgreSQL {version // 10000} on {self.where} is too old",
                                      "use PostgreSQL 15 or later (UNIQUE NULLS NOT DISTINCT)")
        return conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def drop_broken_connection(self) -> None:
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
                f"table {self.table_text!r} on {self.where} lacks column(s) {', '.join(missing)} "
                f"(it has {', '.join(have) or 'none'})",
                "add the columns, or drop the table and set create_table = true to create it")
        for col, typ in wanted.items():
            if _canonical_type(have[col]) != _canonical_type(typ):
                log.warning("pipeline %r: column %r of %s is %s, the output type maps to %s; PostgreSQL will cast",
                            self.pipeline_name, col, self.table_text, have[col], typ)

    def unique_indexes(self, conn: psycopg.Connection, oid: int) -> list[tuple[list[str], bool]]:
        """The table's plain unique indexes: (columns, NULLS NOT DISTINCT) each."""
        with conn.cursor() as cur:
            cur.execute(
                "SELECT array(SELECT a.attname::text FROM unnest(i.indkey) k "
                "             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k), "
                "       i.indnullsnotdistinct "
                "FROM pg_index i WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid "
                "AND i.indpred IS NULL AND i.indexprs IS NULL", (oid,))
            return [(list(cols), bool(nnd)) for cols, nnd in cur.fetchall()]

    def check_unique_key(self, conn: psycopg.Connection, oid: int, key: Sequence[str],
                         nullable: Collection[str]) -> None:
        """Refuse a table without a unique index on exactly ``key`` (any order): ``ON CONFLICT`` needs
        one. When a ``nullable`` key column may hold NULL, the index must be ``NULLS NOT DISTINCT``,
        or every row with a NULL key value would be inserted anew instead of updating its key."""
        wanted = set(key)
        matching = [nnd for cols, nnd in self.unique_indexes(conn, oid)
                    if set(cols) == wanted and len(cols) == len(wanted)]
        keys = ", ".join(key)
        if not matching:
            raise PipelineConfigError(
                f"{self.key}.table", f"table {self.table_text!r} on {self.where} has no unique key on ({keys})",
                f"ALTER TABLE ... ADD UNIQUE NULLS NOT DISTINCT ({keys}), or let create_table = true create the table")
        if wanted & set(nullable) and not any(matching):
            raise PipelineConfigError(
                f"{self.key}.table", f"the unique key ({keys}) of {self.table_text!r} treats NULLs as distinct, "
                "so NULL key values would duplicate rows",
                f"recreate it as UNIQUE NULLS NOT DISTINCT ({keys})")

    # -- DDL (run only with create_table = true)

    def create(self, cur: psycopg.Cursor, types: Mapping[str, str], unique_key: Sequence[str] = (),
               not_null: Collection[str] = ()) -> None:
        """``CREATE TABLE IF NOT EXISTS`` with ``types``' columns in their order, and a
        ``UNIQUE NULLS NOT DISTINCT`` constraint on ``unique_key`` when one is given (the upsert key:
        NULL key values form one key)."""
        parts = [sql.SQL("{} {}{}").format(sql.Identifier(c), sql.SQL(t), sql.SQL(" NOT NULL" if c in not_null else ""))
                 for c, t in types.items()]
        if unique_key:
            parts.append(sql.SQL("UNIQUE NULLS NOT DISTINCT ({})").format(
                sql.SQL(", ").join(sql.Identifier(k) for k in unique_key)))
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(self.ident, sql.SQL(", ").join(parts)))

    def create_batch_id_index(self, cur: psycopg.Cursor) -> None:
        """The index a replay's ``DELETE ... WHERE _batch_id = N`` uses, named ``<table>_batch_id_idx``."""
        index = sql.Identifier(f"{self.table_name}{BATCH_ID}_idx"[:63])
        cur.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
            index, self.ident, sql.Identifier(BATCH_ID)))

    def prepare(self, create: Callable[[psycopg.Cursor], None] | None, types: dict[str, str], what: str,
                check: Callable[[psycopg.Connection, int], None] | None = None) -> None:
        """Create the table (``create``, when the spec asks) and check its columns and (``check``)
        its key, in one transaction; any failure drops the connection so the next try starts clean."""
        conn = self.connect()
        try:
            if create is not None:
                self.ensure_schema(conn)
                with conn.cursor() as cur:
                    create(cur)
            oid = self.table_oid(conn)
            if oid is None:
                raise self.missing_table_error()
            self.check_columns(conn, oid, types)
            if check is not None:
                check(conn, oid)
            conn.commit()
        except PipelineConfigError:
            self.drop_broken_connection()
            raise
        except psycopg.Error as exc:
            self.drop_broken_connection()
            raise self.error(f"preparing {what}", exc) from None

    def missing_table_error(self) -> PipelineConfigError:
        return PipelineConfigError(f"{self.key}.table", f"table {self.table_text!r} does not exist on {self.where}",
                                   "set create_table = true, or create the table first")
