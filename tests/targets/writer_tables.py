"""Arrow batches, window schemas and table reads shared by the writer tests of tests/targets."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import psycopg
import pyarrow as pa
from psycopg import sql

from ematix_dagster.spec import Target
from ematix_dagster.targets import make_window_writer

UTC = dt.timezone.utc
PIPE = "clicks-per-minute"


def ts(minute: int, second: int = 0) -> dt.datetime:
    return dt.datetime(2024, 5, 1, 12, minute, second, tzinfo=UTC)


TS = pa.timestamp("us", tz="UTC")


def window_schema(group: list[tuple[str, pa.DataType]], aggs: list[tuple[str, pa.DataType]],
                  start: str = "window_start", end: str = "window_end") -> pa.Schema:
    return pa.schema([(start, TS), (end, TS), *group, *aggs, ("_emit_kind", pa.string())])


def batch(schema: pa.Schema, rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows)) if rows else [[] for _ in schema]
    return pa.table([pa.array(list(c), type=f.type) for c, f in zip(cols, schema)], schema=schema)


def select_df(dsn: str, query: sql.Composable, params=()) -> pd.DataFrame:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(query, params)
        names = [d.name for d in cur.description]
        return pd.DataFrame(cur.fetchall(), columns=names)


def table_rows(dsn: str, schema: str, table: str, order: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql.SQL("SELECT * FROM {} ORDER BY " + order).format(
            sql.Identifier(schema, table))).fetchall()


SIMPLE = window_schema([("user_id", pa.int64()), ("page", pa.string())],
                       [("n", pa.int64()), ("amount_sum", pa.float64())])
SIMPLE_KEY = ["window_start", "user_id", "page"]


def pg_target(dsn: str, table: str, create: bool = True) -> Target:
    return Target(kind="postgres", url=dsn, table=table, create_table=create)


def open_writer(target: Target, schema: pa.Schema = SIMPLE, key=SIMPLE_KEY):
    w = make_window_writer(target, PIPE, schema, list(key))
    w.open()
    return w
