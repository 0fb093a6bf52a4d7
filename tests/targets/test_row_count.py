"""The table size the PostgreSQL target writers keep with each commit (``ematix_row_counts``, Dagster's
``dagster/row_count``), against a real PostgreSQL: after every kind of write it equals ``count(*)``.

Each sequence is chosen so that a count of rows *written* would differ from the table's size (a key
twice in a batch, updates, unchanged replays, retractions of absent keys, a replay that replaces
more rows than it writes), so a writer that merely added ``rows.num_rows`` fails here.
"""

from __future__ import annotations

import datetime as dt
import threading
from types import SimpleNamespace
from typing import cast

import psycopg
import pyarrow as pa
from psycopg import sql

from ematix_dagster.metrics import default_metrics
from ematix_dagster.spark.batch.batch_step import BatchStep, EngineCall
from ematix_dagster.spec import PipelineSpec, Target
from ematix_dagster.streaming.durable import Provenance
from ematix_dagster.targets import (
    ConsoleWriter,
    CountsRows,
    ParquetWriter,
    PostgresTable,
    PostgresWindowWriter,
    WindowWriter,
    make_row_writer,
    make_window_writer,
)
from ematix_dagster.targets.pg_count import COUNT_TABLE, RowCount
from tests.targets.writer_tables import PIPE, SIMPLE, SIMPLE_KEY, TS, UTC, batch, open_writer, pg_target, ts

ROWS = pa.schema([("user_id", pa.int64()), ("page", pa.string()), ("amount", pa.float64()), ("_event_ts", TS)])


def window(minute: int, user: int | None, page: str | None, n: int, kind: str = "final") -> tuple:
    return (ts(minute), ts(minute + 1), user, page, n, float(n), kind)


def count_star(dsn: str, schema: str, table: str = "out") -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table))).fetchone()
    assert row is not None
    return int(row[0])


def counted(writer: CountsRows, dsn: str, schema: str, table: str = "out") -> int:
    """The writer's count, checked against the table's ``count(*)``."""
    n = writer.row_count()
    assert n == count_star(dsn, schema, table)
    assert n is not None
    return n


def micros(t: dt.datetime) -> int:
    return (t - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


def create_simple_table(dsn: str, schema: str, table: str, rows: int) -> None:
    """The window target's table made by hand (not by a writer), holding ``rows`` rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        ident = sql.Identifier(schema, table)
        conn.execute(sql.SQL("CREATE TABLE {} (window_start timestamptz, window_end timestamptz, user_id bigint, "
                             "page text, n bigint, amount_sum double precision, "
                             "UNIQUE NULLS NOT DISTINCT (window_start, user_id, page))").format(ident))
        for i in range(rows):
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, 'p', 1, 1.0)").format(ident), (ts(0), ts(1), i))


# ---------------------------------------------------------------------------------------------
# window target


def test_window_count_follows_new_rows_updates_replays_and_retractions(dsn, schema):
    w = open_writer(pg_target(dsn, f"{schema}.out"))
    assert counted(w, dsn, schema) == 0
    # a key twice in one batch (the last wins), a NULL group key: 4 rows written, 3 rows stored
    w.write(0, batch(SIMPLE, [window(0, 1, "a", 1), window(0, 1, "a", 2), window(0, None, None, 1),
                              window(1, 2, "b", 1)]))
    assert counted(w, dsn, schema) == 3
    corrections = batch(SIMPLE, [window(0, 1, "a", 5, "correction"), window(2, 3, "c", 1)])
    w.write(1, corrections)  # an update adds nothing, a new key one
    assert counted(w, dsn, schema) == 4
    w.write(1, corrections)  # a replay rewrites nothing
    assert counted(w, dsn, schema) == 4
    w.write(2, batch(SIMPLE, [window(1, 2, "b", 1, "retract"), window(9, 9, "z", 1, "retract")]))  # one absent
    assert counted(w, dsn, schema) == 3
    w.write(3, batch(SIMPLE, [window(0, None, None, 1, "retract"), window(0, None, None, 7, "early")]))
    assert counted(w, dsn, schema) == 3  # retracted and written again in one batch
    w.close()


def test_a_rolled_back_write_leaves_the_count_and_reading_it_disturbs_no_transaction(dsn, schema):
    w = open_writer(pg_target(dsn, f"{schema}.out"))
    w.write(0, batch(SIMPLE, [window(0, 1, "a", 1), window(0, 2, "a", 1)]))
    with psycopg.connect(dsn) as conn:
        w.write_in_transaction(conn, 1, batch(SIMPLE, [window(1, 1, "a", 1), window(0, 1, "a", 1, "retract")]))
        assert w.row_count() == 2  # the committed size, read beside the open transaction
        conn.rollback()
    assert counted(w, dsn, schema) == 2
    with psycopg.connect(dsn) as conn:  # the same-transaction path commits the count with the rows
        w.write_in_transaction(conn, 1, batch(SIMPLE, [window(1, 1, "a", 1), window(1, 2, "a", 1),
                                                       window(0, 1, "a", 1, "retract")]))
        conn.commit()
    assert counted(w, dsn, schema) == 3
    w.close()


def test_a_backfill_counts_the_range_it_deleted_and_the_rows_it_wrote(dsn, schema):
    w = open_writer(pg_target(dsn, f"{schema}.out"))
    w.write(0, batch(SIMPLE, [window(m, u, "a", 1) for m in range(4) for u in (1, 2)]))
    assert counted(w, dsn, schema) == 8
    during: list[int | None] = []
    deleted = w.replace_windows(micros(ts(1)), micros(ts(3)), batch(SIMPLE, [window(2, 1, "a", 9)]),
                                [lambda _conn: during.append(w.row_count())])
    assert deleted == 4
    assert during == [8]  # read inside the writer's open transaction, which then commits
    assert counted(w, dsn, schema) == 5
    w.close()
    # an empty range's backfill never opens its writer: the delete is still counted
    unopened = PostgresWindowWriter(pg_target(dsn, f"{schema}.out"), PIPE, SIMPLE, SIMPLE_KEY, False)
    assert unopened.replace_windows(micros(ts(0)), micros(ts(1)), batch(SIMPLE, [])) == 2
    assert counted(unopened, dsn, schema) == 3
    unopened.close()


def test_an_existing_table_is_counted_once_when_first_opened(dsn, schema):
    create_simple_table(dsn, schema, "out", rows=3)
    w = open_writer(pg_target(dsn, f"{schema}.out", create=False))
    assert counted(w, dsn, schema) == 3
    w.close()
    with psycopg.connect(dsn, autocommit=True) as conn:  # a row the writers do not know of ...
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, 99, 'x', 1, 1.0)").format(
            sql.Identifier(schema, "out")), (ts(5), ts(6)))
    w.open()
    assert w.row_count() == 3  # ... is not counted again: no count(*) per open
    with psycopg.connect(dsn, autocommit=True) as conn:  # deleting the count's row has it counted again
        conn.execute(sql.SQL("DELETE FROM {} WHERE table_name = 'out'").format(sql.Identifier(schema, COUNT_TABLE)))
    assert w.row_count() is None
    w.write(0, batch(SIMPLE, [window(7, 1, "a", 1)]))
    assert counted(w, dsn, schema) == 5
    w.close()


def test_a_table_dropped_and_created_again_is_counted_afresh(dsn, schema):
    """The count's row names the table by OID: a table of the same name made anew does not inherit it."""
    w = open_writer(pg_target(dsn, f"{schema}.out", create=True))
    w.write(0, batch(SIMPLE, [window(1, 1, "a", 1), window(2, 1, "a", 1)]))
    assert counted(w, dsn, schema) == 2
    w.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, "out")))
    create_simple_table(dsn, schema, "out", rows=1)
    assert w.row_count() is None  # the old count names a table that is gone
    w.open()
    assert counted(w, dsn, schema) == 1
    w.write(1, batch(SIMPLE, [window(3, 2, "b", 1)]))
    assert counted(w, dsn, schema) == 2
    w.close()
    with psycopg.connect(dsn, autocommit=True) as conn:  # dropped again, and the next write comes before an open
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, "out")))
    create_simple_table(dsn, schema, "out", rows=0)
    with psycopg.connect(dsn) as conn:  # a write in another transaction (the store's) meets the stale row
        w.write_in_transaction(conn, 2, batch(SIMPLE, [window(4, 3, "c", 1)]))
        conn.commit()
    assert counted(w, dsn, schema) == 1
    w.close()


def test_writers_opening_at_once_make_one_count_table(dsn, schema):
    create_simple_table(dsn, schema, "a", rows=0)
    create_simple_table(dsn, schema, "b", rows=2)
    first = psycopg.connect(dsn)
    try:
        RowCount(PostgresTable(dsn, f"{schema}.a", PIPE, "target")).ensure(first)  # not committed yet
        b = make_window_writer(pg_target(dsn, f"{schema}.b", create=False), PIPE, SIMPLE, SIMPLE_KEY)
        failures: list[BaseException] = []
        opening = threading.Thread(target=lambda: _capture(b.open, failures))
        opening.start()
        opening.join(0.5)
        assert opening.is_alive()  # waits for the first writer's count table
        first.commit()
        opening.join(10)
    finally:
        first.close()
    assert failures == []
    assert counted(b, dsn, schema, "b") == 2
    b.close()


def test_a_missing_count_row_made_by_two_writers_at_once_counts_both(dsn, schema):
    w = open_writer(pg_target(dsn, f"{schema}.out"))
    w.write(0, batch(SIMPLE, [window(0, 1, "a", 1)]))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, COUNT_TABLE)))
    failures: list[BaseException] = []
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        w.write_in_transaction(first, 1, batch(SIMPLE, [window(1, 1, "a", 1)]))  # counts the table: 2

        def write_second() -> None:
            w.write_in_transaction(second, 2, batch(SIMPLE, [window(2, 1, "a", 1)]))  # waits for first's row
            second.commit()

        writing = threading.Thread(target=lambda: _capture(write_second, failures))
        writing.start()
        writing.join(0.5)
        assert writing.is_alive()
        first.commit()
        writing.join(10)
    assert failures == []
    assert counted(w, dsn, schema) == 3
    w.close()


def _capture(call, failures: list[BaseException]) -> None:
    try:
        call()
    except BaseException as exc:  # handed back to the test's thread
        failures.append(exc)


# ---------------------------------------------------------------------------------------------
# row pipeline target


def test_row_target_without_key_counts_a_replay_that_replaces_its_batch(dsn, schema):
    w = make_row_writer(pg_target(dsn, f"{schema}.out"), PIPE, ROWS, [])
    w.open()
    rows = [(1, "a", 1.0, ts(0)), (1, "a", 1.0, ts(0)), (2, "b", 2.0, ts(1))]  # duplicates are kept
    w.write(0, batch(ROWS, rows))
    w.write(1, batch(ROWS, rows[:2]))
    assert counted(w, dsn, schema) == 5
    w.write(1, batch(ROWS, rows[:1]))  # a replay of batch 1 with fewer rows: 2 deleted, 1 written
    assert counted(w, dsn, schema) == 4
    with psycopg.connect(dsn) as conn:
        w.write_in_transaction(conn, 2, batch(ROWS, rows))
        conn.rollback()
    assert counted(w, dsn, schema) == 4
    w.close()


def test_row_target_with_key_counts_new_keys_only(dsn, schema):
    w = make_row_writer(pg_target(dsn, f"{schema}.out"), PIPE, ROWS, ["user_id", "page"])
    w.open()
    w.write(0, batch(ROWS, [(1, "a", 1.0, ts(0)), (1, "a", 2.0, ts(1)), (None, None, 0.0, ts(1))]))
    assert counted(w, dsn, schema) == 2
    later = batch(ROWS, [(1, "a", 3.0, ts(2)), (2, "b", 1.0, ts(2)), (None, None, 0.0, ts(1))])
    w.write(1, later)  # an update, a new key, an unchanged row
    w.write(1, later)
    assert counted(w, dsn, schema) == 3
    w.close()


# ---------------------------------------------------------------------------------------------
# who has a count, and the batch step's accessor


def step(target: WindowWriter) -> BatchStep:
    return BatchStep(spec=cast(PipelineSpec, None), call=cast(EngineCall, SimpleNamespace(schema=SIMPLE)),
                     target=target, dead_letter=None, store=None, metrics=default_metrics(), progress=print,
                     provenance=Provenance())


def test_the_batch_step_reads_the_postgres_count_and_other_targets_have_none(dsn, schema, tmp_path):
    w = make_window_writer(pg_target(dsn, f"{schema}.out"), PIPE, SIMPLE, SIMPLE_KEY)
    assert step(w).target_row_count() is None  # never opened: no count yet
    w.open()
    w.write(0, batch(SIMPLE, [window(0, 1, "a", 1), window(0, 1, "a", 2)]))
    assert step(w).target_row_count() == 1
    w.close()
    assert step(w).target_row_count() == 1  # after the runner closed the writer, too
    parquet = ParquetWriter(str(tmp_path), PIPE, "target")
    console = ConsoleWriter(PIPE, "window")
    assert not isinstance(parquet, CountsRows) and not isinstance(console, CountsRows)
    assert step(parquet).target_row_count() is None and step(console).target_row_count() is None
    assert isinstance(make_row_writer(Target(kind="postgres", url=dsn, table="t"), PIPE, ROWS, []), CountsRows)
