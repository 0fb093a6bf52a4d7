"""Row-pipeline writers (make_row_writer) against a real PostgreSQL and real parquet files (no mocks)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg import sql

from ematix_dagster.errors import PipelineConfigError, TargetError
from ematix_dagster.spec import Target
from ematix_dagster.targets import RowWriter, make_row_writer
from tests.targets.writer_tables import PIPE, TS, UTC, batch, pg_target, select_df, table_rows, ts

#: a row pipeline's SELECT output, in SELECT order
ROWS = pa.schema([("user_id", pa.int64()), ("page", pa.string()), ("amount", pa.float64()), ("_event_ts", TS)])
KEY = ["user_id", "page"]


def open_rows(target: Target, schema: pa.Schema = ROWS, key=()) -> RowWriter:
    w = make_row_writer(target, PIPE, schema, list(key))
    w.open()
    return w


def table_columns(dsn: str, schema: str, table: str) -> list[tuple[str, str]]:
    df = select_df(dsn, sql.SQL("SELECT column_name, data_type FROM information_schema.columns "
                                "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position"),
                   (schema, table))
    return list(zip(df.column_name, df.data_type))


def create(dsn: str, schema: str, table: str, columns: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (" + columns + ")").format(sql.Identifier(schema, table)))


# ---------------------------------------------------------------------------------------------
# postgres without a key: rows replaced per _batch_id


def test_no_key_replay_of_a_batch_leaves_exactly_one_copy(dsn, schema):
    w = open_rows(pg_target(dsn, f"{schema}.out"))
    assert isinstance(w, RowWriter) and w.idempotent
    assert "127.0.0.1:5432/test" in w.description and "_batch_id" in w.description
    w.write(0, batch(ROWS, [(1, "home", 1.5, ts(0)), (2, None, None, ts(1))]))
    # a duplicate the SQL produced is a row like any other: both copies stay
    batch_1 = batch(ROWS, [(1, "cart", 2.0, ts(2)), (1, "cart", 2.0, ts(2))])
    w.write(1, batch_1)
    w.write(1, batch_1)  # the replay after a crash
    w.write(2, batch(ROWS, []))  # empty: nothing written
    w.close()
    assert table_rows(dsn, schema, "out", "_batch_id, user_id, page NULLS FIRST") == [
        (1, "home", 1.5, ts(0), 0),
        (2, None, None, ts(1), 0),
        (1, "cart", 2.0, ts(2), 1),
        (1, "cart", 2.0, ts(2), 1),
    ]
    assert table_columns(dsn, schema, "out") == [
        ("user_id", "bigint"), ("page", "text"), ("amount", "double precision"),
        ("_event_ts", "timestamp with time zone"), ("_batch_id", "bigint")]
    with psycopg.connect(dsn) as conn:
        not_null = conn.execute("SELECT attnotnull FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                                "AND attname = '_batch_id'", (f"{schema}.out",)).fetchone()[0]
        indexes = [r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = %s "
                                              "AND tablename = 'out'", (schema,))]
    assert not_null is True
    assert len(indexes) == 1 and indexes[0].endswith("(_batch_id)")


def test_no_key_empty_replay_deletes_nothing(dsn, schema):
    # The decision shared with every writer: an empty batch is a no-op (a real replay recomputes
    # the same rows, so it is never empty where the first attempt was not).
    w = open_rows(pg_target(dsn, f"{schema}.out"))
    w.write(4, batch(ROWS, [(1, "a", 1.0, ts(0))]))
    w.write(4, batch(ROWS, []))
    w.close()
    assert table_rows(dsn, schema, "out", "1") == [(1, "a", 1.0, ts(0), 4)]


def test_values_of_every_type_round_trip(dsn, schema):
    out = pa.schema([("i64", pa.int64()), ("i32", pa.int32()), ("f64", pa.float64()), ("s", pa.string()),
                     ("t", TS), ("naive", pa.timestamp("ms")), ("dec", pa.decimal128(12, 3)), ("b", pa.bool_()),
                     ("d", pa.date32()), ("bin", pa.binary())])
    w = open_rows(pg_target(dsn, f"{schema}.typed"), out)
    w.write(3, batch(out, [
        (-7, 2_000_000_000, -0.25, 'tab\tnew\nline\\ "q" ü', dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC),
         dt.datetime(2024, 5, 1, 12, 0, 0, 123000), Decimal("-123456789.125"), False, dt.date(2024, 2, 29), b"\x00\xff"),
        (None, None, None, None, None, None, None, None, None, None),
    ]))
    w.close()
    assert table_rows(dsn, schema, "typed", "i64 NULLS LAST") == [
        (-7, 2_000_000_000, -0.25, 'tab\tnew\nline\\ "q" ü', dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC),
         dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC), Decimal("-123456789.125"), False,
         dt.date(2024, 2, 29), b"\x00\xff", 3),
        (None, None, None, None, None, None, None, None, None, None, 3),
    ]
    assert [t for _, t in table_columns(dsn, schema, "typed")] == [
        "bigint", "integer", "double precision", "text", "timestamp with time zone", "timestamp with time zone",
        "numeric", "boolean", "date", "bytea", "bigint"]


# ---------------------------------------------------------------------------------------------
# postgres with a key: upserts, the last row of a key in a batch wins


def test_key_upserts_across_batches_last_row_of_a_key_in_a_batch_wins(dsn, schema):
    w = open_rows(pg_target(dsn, f"{schema}.out"), key=KEY)
    assert "upsert on user_id, page" in w.description
    w.write(0, batch(ROWS, [(1, "a", 1.0, ts(0)), (None, None, 5.0, ts(0)), (2, None, 7.0, ts(1))]))
    batch_1 = batch(ROWS, [
        (1, "a", 3.0, ts(2)),
        (None, None, 6.0, ts(1)),
        (1, "a", 2.0, ts(1)),      # last of (1, "a"): wins although its _event_ts is smaller
        (None, None, 4.0, ts(2)),  # NULL key values are one key: last of (NULL, NULL)
        (3, "b", 1.0, ts(3)),
    ])
    w.write(1, batch_1)
    with psycopg.connect(dsn) as conn:
        before = conn.execute(sql.SQL("SELECT xmin::text, * FROM {} ORDER BY 2, 3").format(
            sql.Identifier(schema, "out"))).fetchall()
    w.write(1, batch_1)  # the replay
    w.close()
    with psycopg.connect(dsn) as conn:
        after = conn.execute(sql.SQL("SELECT xmin::text, * FROM {} ORDER BY 2, 3").format(
            sql.Identifier(schema, "out"))).fetchall()
    assert after == before  # identical, and not even rewritten
    assert table_rows(dsn, schema, "out", "user_id NULLS FIRST, page NULLS FIRST") == [
        (None, None, 4.0, ts(2)),
        (1, "a", 2.0, ts(1)),
        (2, None, 7.0, ts(1)),
        (3, "b", 1.0, ts(3)),
    ]
    assert [c for c, _ in table_columns(dsn, schema, "out")] == ["user_id", "page", "amount", "_event_ts"]
    cons = select_df(dsn, sql.SQL(
        "SELECT c.contype, i.indnullsnotdistinct, "
        "  array(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, o) "
        "        JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.o) AS cols "
        "FROM pg_constraint c JOIN pg_index i ON i.indexrelid = c.conindid WHERE c.conrelid = to_regclass(%s)"),
        (f"{schema}.out",))
    assert [(r.contype, bool(r.indnullsnotdistinct), list(r.cols)) for r in cons.itertuples()] == [("u", True, KEY)]


def test_key_of_every_column_keeps_one_row_per_key(dsn, schema):
    out = pa.schema([("user_id", pa.int64()), ("page", pa.string())])
    w = open_rows(pg_target(dsn, f"{schema}.out"), out, key=KEY)
    rows = batch(out, [(1, "a"), (None, None), (1, "a"), (None, None)])
    w.write(0, rows)
    w.write(1, rows)
    w.close()
    assert table_rows(dsn, schema, "out", "user_id NULLS FIRST") == [(None, None), (1, "a")]


@pytest.mark.parametrize("key, committed", [
    ((), [(1, "a", 1.0, ts(0), 0), (2, "b", 2.0, ts(1), 1)]),
    (KEY, [(1, "a", 1.0, ts(0)), (2, "b", 2.0, ts(1))]),
], ids=["no-key", "key"])
def test_write_in_transaction_commits_only_with_the_caller(dsn, schema, key, committed):
    w = open_rows(pg_target(dsn, f"{schema}.out"), key=key)
    w.write(0, batch(ROWS, [(1, "a", 1.0, ts(0))]))
    first = table_rows(dsn, schema, "out", "user_id")
    with psycopg.connect(dsn) as conn:
        w.write_in_transaction(conn, 0, batch(ROWS, [(1, "a", 9.0, ts(5))]))  # replaces / updates (1, "a")
        w.write_in_transaction(conn, 1, batch(ROWS, [(7, "z", 0.0, ts(9))]))
        conn.rollback()
    assert table_rows(dsn, schema, "out", "user_id") == first
    with psycopg.connect(dsn) as conn:
        w.write_in_transaction(conn, 1, batch(ROWS, [(2, "b", 2.0, ts(1))]))
        conn.commit()
    assert table_rows(dsn, schema, "out", "user_id") == committed
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(ValueError, match="autocommit"):
        w.write_in_transaction(conn, 2, batch(ROWS, [(3, "c", 3.0, ts(2))]))
    w.close()


# ---------------------------------------------------------------------------------------------
# tables that do not fit, and configuration refused


@pytest.mark.parametrize("key, columns, pattern", [
    ((), "user_id bigint, page text, _event_ts timestamptz, _batch_id bigint", r"lacks column\(s\) amount"),
    ((), "user_id bigint, page text, amount float8, _event_ts timestamptz", r"lacks column\(s\) _batch_id"),
    (KEY, "user_id bigint, page text, amount float8, _event_ts timestamptz", r"no unique key on \(user_id, page\)"),
    (["page"], "user_id bigint, page text UNIQUE, amount float8, _event_ts timestamptz", "treats NULLs as distinct"),
], ids=["no-amount", "no-batch-id", "no-unique-key", "nulls-distinct"])
def test_existing_table_that_does_not_fit_is_refused(dsn, schema, key, columns, pattern):
    create(dsn, schema, "bad", columns)
    w = make_row_writer(pg_target(dsn, f"{schema}.bad", create=False), PIPE, ROWS, list(key))
    with pytest.raises(PipelineConfigError, match=pattern):
        w.open()
    w.close()


def test_existing_tables_with_extra_columns_and_any_key_order_are_used(dsn, schema):
    create(dsn, schema, "plain", "note text DEFAULT 'x', _batch_id bigint, _event_ts timestamptz, "
                                 "amount float8, page text, user_id bigint")
    create(dsn, schema, "keyed", "user_id bigint, page text, amount float8, _event_ts timestamptz, "
                                 "UNIQUE NULLS NOT DISTINCT (page, user_id)")
    for table, key in (("plain", ()), ("keyed", KEY)):
        w = open_rows(pg_target(dsn, f"{schema}.{table}", create=False), key=key)
        w.write(5, batch(ROWS, [(1, None, 1.0, ts(0))]))
        w.close()
    assert table_rows(dsn, schema, "plain", "1") == [("x", 5, ts(0), 1.0, None, 1)]
    assert table_rows(dsn, schema, "keyed", "1") == [(1, None, 1.0, ts(0))]


def test_missing_table_without_create_table_is_config_error(dsn, schema):
    w = make_row_writer(pg_target(dsn, f"{schema}.absent", create=False), PIPE, ROWS, [])
    with pytest.raises(PipelineConfigError, match="does not exist.*create_table = true"):
        w.open()
    w.close()


@pytest.mark.parametrize("dtype", [pa.list_(pa.int64()), pa.struct([("x", pa.int64())])], ids=["list", "struct"])
def test_unsupported_arrow_type_is_refused_naming_the_column(dsn, schema, dtype):
    out = ROWS.append(pa.field("tags", dtype))
    for key in ((), KEY):
        with pytest.raises(PipelineConfigError, match="column 'tags' has type .* no PostgreSQL mapping"):
            make_row_writer(pg_target(dsn, f"{schema}.out"), PIPE, out, list(key))


def test_key_and_column_names_are_checked(dsn, schema, tmp_path):
    target = pg_target(dsn, f"{schema}.out")
    with pytest.raises(PipelineConfigError, match=r"^target\.key: .*'nope'"):
        make_row_writer(target, PIPE, ROWS, ["user_id", "nope"])
    with pytest.raises(PipelineConfigError, match=r"^target\.key: "):
        make_row_writer(target, PIPE, ROWS, ["page", "page"])
    with pytest.raises(PipelineConfigError, match=r"^transform\.sql: the output column _batch_id"):
        make_row_writer(target, PIPE, ROWS.append(pa.field("_batch_id", pa.int64())), [])
    for other in (Target(kind="parquet", path=str(tmp_path)), Target(kind="console")):
        with pytest.raises(PipelineConfigError, match=r"^target\.key: .*only a postgres target upserts"):
            make_row_writer(other, PIPE, ROWS, KEY)


def test_data_errors_are_terminal_and_passwords_never_shown(dsn, schema):
    create(dsn, schema, "small", "user_id smallint, page text, amount float8, _event_ts timestamptz, _batch_id bigint")
    w = open_rows(pg_target(dsn, f"{schema}.small", create=False))
    with pytest.raises(TargetError, match="batch 3") as info:
        w.write(3, batch(ROWS, [(100_000, "a", 1.0, ts(0))]))
    assert info.value.terminal is True
    w.write(4, batch(ROWS, [(100, "a", 1.0, ts(0))]))  # the writer recovers
    w.close()
    assert table_rows(dsn, schema, "small", "1") == [(100, "a", 1.0, ts(0), 4)]

    w = make_row_writer(Target(kind="postgres", url="postgresql://u:s3cret@127.0.0.1:5432/test", table="public.out",
                               create_table=True), PIPE, ROWS, [])
    with pytest.raises(TargetError) as info:
        w.write(0, batch(ROWS, [(1, "a", 1.0, ts(0))]))
    assert "s3cret" not in str(info.value) and "public.out" in str(info.value) and info.value.terminal is True
    w.close()


# ---------------------------------------------------------------------------------------------
# parquet and console


def test_parquet_row_target_writes_batch_directories(tmp_path):
    root = tmp_path / "rows"
    out = pa.schema([("page", pa.string()), ("dec", pa.decimal128(8, 2)), ("_event_ts", TS), ("n", pa.int32())])
    w = make_row_writer(Target(kind="parquet", path=str(root)), PIPE, out, [])
    assert isinstance(w, RowWriter) and w.idempotent and str(root) in w.description
    w.open()
    w.write(0, batch(out, [("a", Decimal("1.50"), ts(0), 1), (None, None, None, None)]))
    w.write(1, batch(out, [("b", Decimal("-2.25"), ts(1), 2)]))
    w.write(1, batch(out, [("b", Decimal("-2.25"), ts(1), 2)]))  # the replay replaces the file
    w.write(2, batch(out, []))
    w.close()
    assert sorted(p.name for p in root.iterdir()) == ["batch_id=0", "batch_id=1"]
    assert [p.name for p in (root / "batch_id=1").iterdir()] == ["part-0.parquet"]
    b0 = pq.read_table(root / "batch_id=0" / "part-0.parquet")
    assert b0.schema == out  # the SELECT's columns, in its order, nothing added
    assert b0.to_pylist() == [{"page": "a", "dec": Decimal("1.50"), "_event_ts": ts(0), "n": 1},
                              {"page": None, "dec": None, "_event_ts": None, "n": None}]
    assert pq.read_table(root / "batch_id=1" / "part-0.parquet").column("n").to_pylist() == [2]


def test_console_row_target_prints_each_batch(capsys):
    w = make_row_writer(Target(kind="console"), PIPE, ROWS, [])
    assert isinstance(w, RowWriter) and w.idempotent is False
    w.open()
    w.write(2, batch(ROWS, [(1, "home", 2.5, ts(0))]))
    w.write(3, batch(ROWS, []))
    w.write(4, batch(ROWS, [(1, "home", 2.5, ts(0)), (None, None, None, None)]))
    w.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "-- batch 2: 1 row --"
    assert lines[1].split() == ["user_id", "page", "amount", "_event_ts"]
    assert lines[2].split() == ["1", "home", "2.5", "2024-05-01", "12:00:00+00:00"]
    assert lines[3] == "-- batch 4: 2 rows --"
    assert len(lines) == 7  # nothing for the empty batch
