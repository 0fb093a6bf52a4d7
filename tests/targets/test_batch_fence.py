"""The batch fence of the PostgreSQL window target (``ematix_written_batches``), against a real PostgreSQL:
a (query, batch) is written by one committed transaction, whatever replays or races.

A replay's rows differ from the first attempt's here, on purpose: an upsert of identical rows leaves
the table as it was, so only different rows show whether a replay wrote.
"""

from __future__ import annotations

import threading
from typing import Callable

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from ematix_dagster.errors import TargetError
from ematix_dagster.targets import PostgresWindowWriter, pg_fence
from ematix_dagster.targets.pg_fence import FENCE_TABLE
from tests.targets.writer_tables import SIMPLE, batch, open_writer, pg_target, table_rows, ts

QUERY = "5f0c3d0e-query-a"
OTHER_QUERY = "9b1e44a2-query-b"


def rows(n: int, users: int = 1) -> pa.Table:
    """``users`` windows of minute 0 whose count is ``n``: a replay with another ``n`` shows whether it wrote."""
    return batch(SIMPLE, [(ts(0), ts(1), u, "p", n, float(n), "final") for u in range(users)])


def counts(dsn: str, schema: str) -> list[int]:
    return [r[4] for r in table_rows(dsn, schema, "out", "user_id")]


def fence_rows(dsn: str, schema: str) -> list[tuple]:
    """(table_name, query_id, batch_id, table_oid is the current table's) of every fence row (none
    before the first batch written once makes the fence table)."""
    with psycopg.connect(dsn) as conn:
        if conn.execute("SELECT to_regclass(%s)", (f"{schema}.{FENCE_TABLE}",)).fetchone() == (None,):
            return []
        return conn.execute(sql.SQL(
            "SELECT table_name, query_id, batch_id, table_oid = to_regclass(%s)::oid FROM {} "
            "ORDER BY table_name, query_id, batch_id").format(sql.Identifier(schema, FENCE_TABLE)),
            (f"{schema}.out",)).fetchall()


def writer(dsn: str, schema: str) -> PostgresWindowWriter:
    w = open_writer(pg_target(dsn, f"{schema}.out"))
    assert isinstance(w, PostgresWindowWriter)
    return w


def test_a_batch_is_written_once_and_a_replay_writes_nothing(dsn, schema):
    w = writer(dsn, schema)
    w.write(0, rows(1))  # a batch fenced by the state store (driver mode): no fence table is made
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f"{schema}.{FENCE_TABLE}",)).fetchone() == (None,)
    assert w.write_batch_once(QUERY, 3, rows(1, users=2)) is True
    assert counts(dsn, schema) == [1, 1] and w.row_count() == 2

    assert w.write_batch_once(QUERY, 3, rows(7, users=3)) is False  # the replay: more rows, other values
    assert counts(dsn, schema) == [1, 1] and w.row_count() == 2
    assert fence_rows(dsn, schema) == [("out", QUERY, 3, True)]

    assert w.write_batch_once(QUERY, 4, rows(2)) is True  # the next batch writes
    assert counts(dsn, schema) == [2, 1] and w.row_count() == 2
    w.close()


def test_another_query_writes_the_same_batch_id(dsn, schema):
    """A new checkpoint (a new query id) counts batches from 0 again: its batch 3 is another batch."""
    w = writer(dsn, schema)
    assert w.write_batch_once(QUERY, 3, rows(1)) is True
    assert w.write_batch_once(OTHER_QUERY, 3, rows(5)) is True
    assert counts(dsn, schema) == [5]
    assert [r[1:3] for r in fence_rows(dsn, schema)] == [(QUERY, 3), (OTHER_QUERY, 3)]
    w.close()


def test_an_empty_batch_records_nothing(dsn, schema):
    w = writer(dsn, schema)
    assert w.write_batch_once(QUERY, 0, rows(1, users=0)) is False
    assert fence_rows(dsn, schema) == []
    assert w.write_batch_once(QUERY, 0, rows(1)) is True
    w.close()


def test_a_failed_write_leaves_no_fence_row_and_its_replay_writes(dsn, schema):
    w = writer(dsn, schema)
    with pytest.raises(ValueError, match="lacks output column"):  # after the claim, in its transaction
        w.write_batch_once(QUERY, 1, rows(1).drop_columns(["n"]))
    assert fence_rows(dsn, schema) == []

    with psycopg.connect(dsn) as conn:  # the engine's transaction, rolled back
        assert w.write_batch_once_in_transaction(conn, QUERY, 1, rows(2)) is True
        conn.rollback()
    assert fence_rows(dsn, schema) == [] and counts(dsn, schema) == []

    assert w.write_batch_once(QUERY, 1, rows(3)) is True
    assert counts(dsn, schema) == [3] and w.row_count() == 1
    w.close()


def test_a_psycopg_failure_is_a_target_error_and_rolls_the_claim_back(dsn, schema):
    w = writer(dsn, schema)
    bad = batch(SIMPLE, [(ts(0), ts(1), 1, "p\x00", 1, 1.0, "final")])  # PostgreSQL text refuses NUL
    with pytest.raises(TargetError):
        w.write_batch_once(QUERY, 1, bad)
    assert fence_rows(dsn, schema) == []
    assert w.write_batch_once(QUERY, 1, rows(1)) is True
    w.close()


def test_a_table_dropped_and_created_again_takes_the_batch_again(dsn, schema):
    w = writer(dsn, schema)
    assert w.write_batch_once(QUERY, 1, rows(1)) is True
    assert w.write_batch_once(QUERY, 2, rows(2)) is True
    w.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, "out")))

    w = writer(dsn, schema)  # create_table = true: a new, empty table under the same name
    assert w.write_batch_once(QUERY, 2, rows(5)) is True
    assert counts(dsn, schema) == [5] and w.row_count() == 1
    # the old table's rows are gone: the takeover of batch 2 pruned batch 1's
    assert fence_rows(dsn, schema) == [("out", QUERY, 2, True)]
    assert w.write_batch_once(QUERY, 2, rows(6)) is False
    w.close()


def test_the_fence_keeps_only_the_batches_a_replay_can_ask_for(dsn, schema, monkeypatch):
    monkeypatch.setattr(pg_fence, "KEEP_BATCHES", 3)
    w = writer(dsn, schema)
    other = open_writer(pg_target(dsn, f"{schema}.other"))  # another target of the schema keeps its rows
    assert other.write_batch_once(QUERY, 0, rows(1)) is True
    assert w.write_batch_once(OTHER_QUERY, 0, rows(1)) is True  # another query's rows are its own to prune
    for batch_id in range(12):
        assert w.write_batch_once(QUERY, batch_id, rows(batch_id)) is True

    assert [r[1:3] for r in fence_rows(dsn, schema) if r[0] == "out"] == [
        (QUERY, 8), (QUERY, 9), (QUERY, 10), (QUERY, 11), (OTHER_QUERY, 0)]
    assert [r[:3] for r in fence_rows(dsn, schema) if r[0] == "other"] == [("other", QUERY, 0)]
    assert w.write_batch_once(QUERY, 11, rows(99)) is False  # the latest batch's replay
    assert w.write_batch_once(QUERY, 8, rows(99)) is False  # the margin
    assert counts(dsn, schema) == [11]
    w.close()
    other.close()


def _in_thread(call: Callable[[], bool]) -> tuple[threading.Thread, list[object]]:
    """``call`` on a thread of its own; its result or exception lands in the returned list."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed back to the test's thread
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


@pytest.mark.parametrize("first_commits", [True, False])
def test_a_writer_racing_an_open_claim_waits_for_its_end(dsn, schema, first_commits):
    """The second claim of a batch blocks on the first one's uncommitted key: after a commit it writes
    nothing, after a rollback it writes."""
    first, second = writer(dsn, schema), writer(dsn, schema)
    with psycopg.connect(dsn) as conn:
        assert first.write_batch_once_in_transaction(conn, QUERY, 5, rows(1)) is True
        thread, out = _in_thread(lambda: second.write_batch_once(QUERY, 5, rows(2)))
        thread.join(0.5)
        assert thread.is_alive()  # waiting on the first claim
        if first_commits:
            conn.commit()
        else:
            conn.rollback()
        thread.join(10)
    assert out == [not first_commits]
    assert counts(dsn, schema) == [1 if first_commits else 2] and second.row_count() == 1
    assert fence_rows(dsn, schema) == [("out", QUERY, 5, True)]
    first.close()
    second.close()


def test_writers_racing_on_one_batch_write_it_once(dsn, schema):
    writers = [writer(dsn, schema) for _ in range(4)]
    start = threading.Barrier(len(writers))

    def write(w: PostgresWindowWriter, n: int) -> bool:
        start.wait()
        return w.write_batch_once(QUERY, 9, rows(n, users=n))  # writer n writes n rows

    threads = [_in_thread(lambda w=w, n=n: write(w, n)) for n, w in enumerate(writers, start=1)]
    for thread, _ in threads:
        thread.join(10)
    results = [out[0] for _, out in threads]
    assert sorted(results) == [False, False, False, True]
    winner = results.index(True) + 1
    assert counts(dsn, schema) == [winner] * winner and writers[0].row_count() == winner
    for w in writers:
        w.close()
