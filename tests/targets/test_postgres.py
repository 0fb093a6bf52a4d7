"""The PostgreSQL window writer against a real PostgreSQL (no mocks): DDL, upserts, errors that never show the
password."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from ematix_dagster.errors import PipelineConfigError, TargetError
from ematix_dagster.spec import DeadLetter, Target
from ematix_dagster.targets import WindowWriter, make_dead_letter_writer, make_window_writer, redact_url
from tests.pg import drop_schema
from tests.targets.writer_tables import (
    PIPE,
    SIMPLE,
    SIMPLE_KEY,
    TS,
    UTC,
    batch,
    open_writer,
    pg_target,
    select_df,
    table_rows,
    ts,
    window_schema,
)

# ---------------------------------------------------------------------------------------------
# postgres target: DDL


def test_create_table_types_and_nulls_not_distinct_key(dsn, schema):
    out = window_schema(
        [("g_int", pa.int64()), ("g_str", pa.string()), ("g_dbl", pa.float64()), ("g_bool", pa.bool_()),
         ("g_ts", TS), ("g_date", pa.date32()), ("g_dec", pa.decimal128(12, 3))],
        [("c32", pa.int32()), ("f32", pa.float32()), ("bin", pa.binary()), ("naive_ts", pa.timestamp("us")),
         ("i16", pa.int16())])
    key = ["window_start", "g_int", "g_str", "g_dbl", "g_bool", "g_ts", "g_date", "g_dec"]
    w = open_writer(pg_target(dsn, f"{schema}.typed"), out, key)
    assert isinstance(w, WindowWriter) and w.idempotent
    w.close()

    cols = select_df(dsn, sql.SQL(
        "SELECT column_name, data_type, numeric_precision, numeric_scale FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = 'typed' ORDER BY ordinal_position"), (schema,))
    expected = {
        "window_start": "timestamp with time zone", "window_end": "timestamp with time zone",
        "g_int": "bigint", "g_str": "text", "g_dbl": "double precision", "g_bool": "boolean",
        "g_ts": "timestamp with time zone", "g_date": "date", "g_dec": "numeric", "c32": "integer",
        "f32": "real", "bin": "bytea", "naive_ts": "timestamp with time zone", "i16": "smallint",
    }
    assert list(cols.column_name) == list(expected)  # declared order, no _emit_kind
    assert dict(zip(cols.column_name, cols.data_type)) == expected
    dec = cols[cols.column_name == "g_dec"].iloc[0]
    assert (dec.numeric_precision, dec.numeric_scale) == (12, 3)

    cons = select_df(dsn, sql.SQL(
        "SELECT c.contype, i.indnullsnotdistinct, "
        "  array(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, o) "
        "        JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.o) AS cols "
        "FROM pg_constraint c JOIN pg_index i ON i.indexrelid = c.conindid "
        "WHERE c.conrelid = to_regclass(%s)"), (f"{schema}.typed",))
    assert len(cons) == 1
    assert cons.contype[0] == "u"
    assert bool(cons.indnullsnotdistinct[0]) is True
    assert list(cons.cols[0]) == key


def test_open_is_repeatable_and_create_schema(dsn, schema):
    # A schema that does not exist yet is created, a second open on the existing table passes.
    new_schema = schema + "_new"
    try:
        for _ in range(2):
            open_writer(pg_target(dsn, f"{new_schema}.t")).close()
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{new_schema}.t",)).fetchone()[0]
    finally:
        drop_schema(dsn, new_schema)


def test_missing_table_without_create_table_is_config_error(dsn, schema):
    w = make_window_writer(pg_target(dsn, f"{schema}.absent", create=False), PIPE, SIMPLE, SIMPLE_KEY)
    with pytest.raises(PipelineConfigError, match="does not exist.*create_table = true"):
        w.open()
    w.close()


def test_existing_table_checks_columns_and_unique_key(dsn, schema):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(
            "CREATE TABLE {} (window_start timestamptz, window_end timestamptz, user_id bigint, page text, n bigint)"
        ).format(sql.Identifier(schema, "no_sum")))
        conn.execute(sql.SQL(
            "CREATE TABLE {} (window_start timestamptz, window_end timestamptz, user_id bigint, page text, "
            "n bigint, amount_sum double precision)").format(sql.Identifier(schema, "no_key")))
        conn.execute(sql.SQL(
            "CREATE TABLE {} (window_start timestamptz, window_end timestamptz, user_id bigint, page text, "
            "n bigint, amount_sum double precision, UNIQUE (window_start, user_id, page))"
        ).format(sql.Identifier(schema, "nulls_distinct")))
        conn.execute(sql.SQL(
            "CREATE TABLE {} (extra text DEFAULT 'x', window_start timestamptz, window_end timestamptz, "
            "user_id bigint, page text, n bigint, amount_sum double precision, "
            "UNIQUE NULLS NOT DISTINCT (page, user_id, window_start))").format(sql.Identifier(schema, "good")))

    cases = {"no_sum": "lacks column.*amount_sum", "no_key": "no unique key",
             "nulls_distinct": "treats NULLs as distinct"}
    for table, pattern in cases.items():
        w = make_window_writer(pg_target(dsn, f"{schema}.{table}", create=False), PIPE, SIMPLE, SIMPLE_KEY)
        with pytest.raises(PipelineConfigError, match=pattern):
            w.open()
        w.close()

    # Extra columns and a different key column order are fine.
    w = open_writer(pg_target(dsn, f"{schema}.good", create=False))
    w.write(0, batch(SIMPLE, [(ts(0), ts(1), 1, None, 2, 1.5, "final")]))
    w.close()
    assert table_rows(dsn, schema, "good", "window_start") == [("x", ts(0), ts(1), 1, None, 2, 1.5)]


# ---------------------------------------------------------------------------------------------
# postgres target: upserts


def read_simple(dsn: str, schema: str, table: str = "out") -> dict[tuple, tuple]:
    rows = table_rows(dsn, schema, table, "window_start, user_id NULLS FIRST, page NULLS FIRST")
    result = {(r[0], r[2], r[3]): (r[1], r[4], r[5]) for r in rows}
    assert len(result) == len(rows), "one row per key"
    return result


def test_upsert_null_group_keys_keep_one_row_per_key(dsn, schema):
    w = open_writer(pg_target(dsn, f"{schema}.out"))
    first = [
        (ts(0), ts(1), 1, "home", 3, 10.0, "final"),
        (ts(0), ts(1), None, "home", 1, 1.0, "final"),
        (ts(0), ts(1), None, None, 2, None, "final"),
        (ts(0), ts(1), 1, None, 5, 2.5, "final"),
    ]
    w.write(0, batch(SIMPLE, first))
    # The same NULL keys again in a later batch (corrections) must update, not insert.
    w.write(1, batch(SIMPLE, [
        (ts(0), ts(1), None, None, 7, 7.5, "correction"),
        (ts(0), ts(1), None, "home", 4, 4.0, "correction"),
        (ts(1), ts(2), None, None, 1, 0.5, "final"),
    ]))
    w.close()
    expected = {
        (ts(0), 1, "home"): (ts(1), 3, 10.0),
        (ts(0), None, "home"): (ts(1), 4, 4.0),
        (ts(0), None, None): (ts(1), 7, 7.5),
        (ts(0), 1, None): (ts(1), 5, 2.5),
        (ts(1), None, None): (ts(2), 1, 0.5),
    }
    assert read_simple(dsn, schema) == expected


def test_replaying_a_batch_leaves_the_table_identical(dsn, schema):
    w = open_writer(pg_target(dsn, f"{schema}.out"))
    rows = batch(SIMPLE, [(ts(m), ts(m + 1), u, p, m * 10 + u, m / 3, "final")
                          for m in range(3) for u in range(4) for p in ("a", None)])
    w.write(5, rows)
    with psycopg.connect(dsn) as conn:
        before = conn.execute(sql.SQL("SELECT xmin::text, * FROM {} ORDER BY 2, 4, 5").format(
            sql.Identifier(schema, "out"))).fetchall()
    w.write(5, rows)
    w.close()
    with psycopg.connect(dsn) as conn:
        after = conn.execute(sql.SQL("SELECT xmin::text, * FROM {} ORDER BY 2, 4, 5").format(
            sql.Identifier(schema, "out"))).fetchall()
    assert len(before) == 24
    # Same contents, and unchanged rows are not even rewritten (same xmin).
    assert after == before


def test_correction_updates_and_last_row_of_a_key_in_a_batch_wins(dsn, schema):
    w = open_writer(pg_target(dsn, f"{schema}.out"))
    w.write(0, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 1, 1.0, "final")]))
    w.write(1, batch(SIMPLE, [
        (ts(0), ts(1), 1, "a", 2, 2.0, "correction"),
        (ts(0), ts(1), 1, "a", 3, 3.0, "correction"),
        (ts(0), ts(1), None, None, 1, 1.0, "final"),
        (ts(0), ts(1), None, None, 9, 9.0, "correction"),
    ]))
    w.close()
    assert read_simple(dsn, schema) == {
        (ts(0), 1, "a"): (ts(1), 3, 3.0),
        (ts(0), None, None): (ts(1), 9, 9.0),
    }


def test_values_of_every_type_round_trip(dsn, schema):
    out = window_schema(
        [("g_dec", pa.decimal128(10, 2)), ("g_date", pa.date32()), ("g_bool", pa.bool_()), ("g_bin", pa.binary())],
        [("nan", pa.float64()), ("naive", pa.timestamp("ms")), ("text", pa.string()), ("i32", pa.int32())])
    key = ["window_start", "g_dec", "g_date", "g_bool", "g_bin"]
    w = open_writer(pg_target(dsn, f"{schema}.typed"), out, key)
    rows = [
        (ts(0), ts(1), Decimal("12.34"), dt.date(2024, 5, 1), True, b"\x00\xffab", float("nan"),
         dt.datetime(2024, 5, 1, 12, 0, 0, 123000), "tab\tnew\nline\\ \"q\" ü", 7, "final"),
        (ts(0), ts(1), None, None, None, None, float("inf"), None, "", None, "final"),
    ]
    w.write(0, batch(out, rows))
    w.write(0, batch(out, rows))  # replay with NULL and NaN keys/values: still one row each
    w.close()
    got = table_rows(dsn, schema, "typed", "g_dec NULLS LAST")
    assert len(got) == 2
    a, b = got
    assert a[:6] == (ts(0), ts(1), Decimal("12.34"), dt.date(2024, 5, 1), True, b"\x00\xffab")
    assert math.isnan(a[6])
    assert a[7] == dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)  # naive = UTC
    assert a[8:] == ("tab\tnew\nline\\ \"q\" ü", 7)
    assert b == (ts(0), ts(1), None, None, None, None, math.inf, None, "", None)


def test_mixed_case_and_reserved_identifiers(dsn, schema):
    mixed_schema = "Mixed_" + schema
    out = window_schema([("UserId", pa.int64()), ("select", pa.string())], [("Count", pa.int64())],
                        start="Window_Start", end="end")
    try:
        w = open_writer(pg_target(dsn, f"{mixed_schema}.ClicksPerMin"), out, ["Window_Start", "UserId", "select"])
        w.write(0, batch(out, [(ts(0), ts(1), 1, "x", 2, "final"), (ts(0), ts(1), None, None, 1, "final")]))
        w.write(1, batch(out, [(ts(0), ts(1), 1, "x", 5, "correction")]))
        w.close()
        rows = table_rows(dsn, mixed_schema, "ClicksPerMin", '"UserId" NULLS LAST')
        assert rows == [(ts(0), ts(1), 1, "x", 5), (ts(0), ts(1), None, None, 1)]
        cols = select_df(dsn, sql.SQL("SELECT column_name FROM information_schema.columns "
                                      "WHERE table_schema = %s AND table_name = 'ClicksPerMin' "
                                      "ORDER BY ordinal_position"), (mixed_schema,))
        assert list(cols.column_name) == ["Window_Start", "end", "UserId", "select", "Count"]
    finally:
        drop_schema(dsn, mixed_schema)


def test_description_names_the_server_and_empty_batch_is_noop(dsn, schema):
    # Writers get URLs resolved (PipelineSpec.resolved): tests/e2e/test_env_placeholders.py covers ${NAME}.
    w = make_window_writer(Target(kind="postgres", url=dsn, table=f"{schema}.out", create_table=True),
                           PIPE, SIMPLE, SIMPLE_KEY)
    assert "127.0.0.1:5432/test" in w.description
    w.open()
    w.write(0, batch(SIMPLE, []))
    w.close()
    assert table_rows(dsn, schema, "out", "1") == []


def test_write_in_transaction_commits_only_with_the_caller(dsn, schema):
    w = open_writer(pg_target(dsn, f"{schema}.out"))
    rows = batch(SIMPLE, [(ts(0), ts(1), 1, "a", 1, 1.0, "final")])
    with psycopg.connect(dsn) as conn:
        w.write_in_transaction(conn, 0, rows)
        conn.rollback()
    assert read_simple(dsn, schema) == {}
    with psycopg.connect(dsn) as conn:
        w.write_in_transaction(conn, 0, rows)
        w.write_in_transaction(conn, 1, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 2, 2.0, "correction")]))
        conn.execute(sql.SQL("CREATE TABLE {} (x int)").format(sql.Identifier(schema, "state_marker")))
        conn.commit()
    w.close()
    assert read_simple(dsn, schema) == {(ts(0), 1, "a"): (ts(1), 2, 2.0)}
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(ValueError, match="autocommit"):
        w.write_in_transaction(conn, 2, rows)


# ---------------------------------------------------------------------------------------------
# postgres errors never show the password


@pytest.mark.parametrize("url", [
    "postgresql://u:s3cret@127.0.0.1:1/test",          # nothing listens on port 1
    "postgresql://u:s3cret@127.0.0.1:5432/test",       # no such role
    "host=127.0.0.1 port=1 dbname=test user=u password=s3cret",
])
def test_connection_errors_name_the_target_but_not_the_password(url):
    w = make_window_writer(Target(kind="postgres", url=url, table="public.out", create_table=True),
                           PIPE, SIMPLE, SIMPLE_KEY)
    assert "s3cret" not in w.description
    with pytest.raises(TargetError) as info:
        w.open()
    text = str(info.value)
    assert "s3cret" not in text and "s3cret" not in repr(info.value)
    assert PIPE in text and "public.out" in text and "127.0.0.1" in text and "/test" in text
    # Nothing listening may pass (a retry may help); a refused login is refused again (terminal).
    assert info.value.terminal is ("5432" in url)
    w.close()

    dl = make_dead_letter_writer(DeadLetter(kind="postgres", url=url, table="dlq", create_table=True), PIPE)
    with pytest.raises(TargetError) as info:
        dl.write(0, pa.table({"_source": ["s"], "_reason": ["late"]}))
    assert "s3cret" not in str(info.value) and "dlq" in str(info.value)


def test_data_errors_are_terminal_target_errors(dsn, schema):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(
            "CREATE TABLE {} (window_start timestamptz, window_end timestamptz, user_id integer, page text, "
            "n smallint, amount_sum double precision, UNIQUE NULLS NOT DISTINCT (window_start, user_id, page))"
        ).format(sql.Identifier(schema, "small")))
    w = open_writer(pg_target(dsn, f"{schema}.small", create=False))
    with pytest.raises(TargetError, match="batch 3") as info:
        w.write(3, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 100_000, 1.0, "final")]))
    assert info.value.terminal is True
    # The writer recovers: the next write on the same writer works.
    w.write(4, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 100, 1.0, "final")]))
    w.close()
    assert table_rows(dsn, schema, "small", "1") == [(ts(0), ts(1), 1, "a", 100, 1.0)]


def test_redact_url():
    assert redact_url("postgresql://u:s3cret@h:5/db") == "postgresql://u:***@h:5/db"
    assert "s3cret" not in redact_url("host=h password=s3cret dbname=x")
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
