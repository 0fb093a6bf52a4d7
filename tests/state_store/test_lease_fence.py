"""The lease's fence, one contract over the three stores: every acquisition raises the lease epoch, a
take-over raises it while the old holder still has the lock, and a holder whose epoch moved on
commits nothing (its callbacks' writes included). Across processes: test_leases_across_processes.py."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any, Callable

import psycopg
import pytest
from psycopg import sql

from ematix_dagster.errors import LeaseHeld, LeaseLost
from state_store.contract import BatchCommit, PendingRow, StateStore, make_holder
from tests.state_store.contract_stores import record, segment

P = "fenced"
ALL = 2**62


class Scratch:
    """Where a batch's ``in_transaction`` callback writes: a table in the store's database (SQLite,
    PostgreSQL), beside a list of the batches whose callback ran at all (the only trace in memory)."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, store: StateStore) -> None:
        self.kind, self.ran = kind, []
        if kind == "sqlite":
            self.connect: Callable[[], Any] = lambda: sqlite3.connect(store.path)  # type: ignore[attr-defined]
            self.insert = "INSERT INTO scratch (batch) VALUES (?)"
        elif kind == "postgres":
            dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
            self.connect = lambda: psycopg.connect(dsn, autocommit=True)
            self.table = sql.Identifier(schema, "scratch")
            self.insert = sql.SQL("INSERT INTO {} (batch) VALUES (%s)").format(self.table)
        if kind != "in_memory":
            with self.connect() as conn:
                conn.execute(sql.SQL("CREATE TABLE {} (batch bigint)").format(self.table).as_string(conn)
                             if kind == "postgres" else "CREATE TABLE scratch (batch INTEGER)")

    def callback(self, batch_id: int) -> Callable[[Any], None]:
        def write(conn: Any) -> None:
            self.ran.append(batch_id)
            if conn is not None:
                conn.execute(self.insert, (batch_id,))
        return write

    def written(self) -> list[int]:
        if self.kind == "in_memory":
            return list(self.ran)
        with self.connect() as conn:
            query = sql.SQL("SELECT batch FROM {} ORDER BY 1").format(self.table).as_string(conn) \
                if self.kind == "postgres" else "SELECT batch FROM scratch ORDER BY 1"
            return [row[0] for row in conn.execute(query).fetchall()]


@pytest.fixture
def scratch(kind, request):
    return lambda store: Scratch(kind, request, store)


def batch(n: int, scratch: Scratch) -> BatchCommit:
    """Batch ``n`` with something of every kind a commit writes: record and offsets, a segment, a pending
    row and a callback's write."""
    return BatchCommit(record(P, n), segments=[segment(0, a=n)], in_transaction=[scratch.callback(n)],
                       pending_inserts=[PendingRow(1_000 + n, n, 0, 7, b"row %d" % n)])


def visible(store: StateStore) -> tuple:
    state = store.load(P)
    return state.record, state.segments, store.load_pending(P, ALL)


def committed(batches: list[int]) -> tuple:
    """What ``visible`` shows once exactly ``batches`` (made by :func:`batch`) were committed, in order."""
    return (record(P, batches[-1], output_watermark=7),  # the pending rows' event time keeps the output back
            [segment(0, a=n) for n in batches],
            [PendingRow(1_000 + n, n, 0, 7, b"row %d" % n) for n in batches])


def test_every_acquisition_raises_the_lease_epoch(make_store):
    a, b = make_store(), make_store()
    assert a.lease_epoch(P) is None
    a.acquire_lease(P, make_holder("first"))
    assert a.lease_epoch(P) == 1 and b.lease_epoch(P) is None
    a.acquire_lease(P, make_holder("first"))  # renewing its text is no new acquisition
    assert a.lease_epoch(P) == 1
    a.commit(BatchCommit(record(P, 0)))  # the first commit of a pipeline
    a.release_lease(P)
    assert a.lease_epoch(P) is None
    b.acquire_lease(P, make_holder("second"))
    assert b.lease_epoch(P) == 2
    b.reset(P)  # the holder's reset keeps the epoch it holds...
    b.commit(BatchCommit(record(P, 0)))  # ...so its next commit passes the fence
    b.close()
    c = make_store()
    c.reset(P)  # and a reset without the lease keeps it too: an epoch never goes back
    c.acquire_lease(P, make_holder("third"))
    assert c.lease_epoch(P) == 3 and c.load(P).record is None


def test_a_fenced_holder_commits_nothing_even_when_it_keeps_its_lock(make_store, scratch):
    a, b = make_store(), make_store()
    old, new = make_holder("old-run"), make_holder("new-run")
    writes = scratch(a)
    a.acquire_lease(P, old)
    a.commit(batch(0, writes))
    asked: list[str | None] = []
    with pytest.raises(LeaseHeld) as refused:
        b.acquire_lease(P, new, take_over=lambda holder: asked.append(holder) is not None)  # says no
    assert asked == [old] and type(refused.value) is LeaseHeld and old in str(refused.value)
    a.commit(batch(1, writes))  # a take-over that was declined fences nothing
    with pytest.raises(LeaseHeld, match=r"fenced at epoch 2 but which did not let go within 0\.2 s") as timed_out:
        b.acquire_lease(P, new, take_over=lambda holder: True, take_over_wait_s=0.2)
    assert type(timed_out.value) is LeaseHeld and timed_out.value.holder == old and b.lease_epoch(P) is None
    with pytest.raises(LeaseLost) as lost:
        a.commit(batch(2, writes))
    err = lost.value
    assert isinstance(err, LeaseHeld) and err.terminal
    assert (err.pipeline, err.holder, err.epoch, err.held_epoch, err.batch) == (P, new, 2, 1, 2)
    assert (f"pipeline '{P}': the lease in {a.description} was taken over by {new} (epoch 2, this run held "
            "epoch 1); batch 2 was not committed: this run stops") == str(err)
    assert visible(b) == committed([0, 1]) and writes.written() == [0, 1]
    for action, undone in ((lambda: a.reset(P), "the reset"), (lambda: a.migrate_state(P), "the migration")):
        with pytest.raises(LeaseLost, match=f"{undone} was not done"):
            action()
    assert visible(b) == committed([0, 1])
    a.release_lease(P)  # the fenced run stops: its lock goes
    b.acquire_lease(P, new)  # a plain acquisition now, at the next epoch
    assert b.lease_epoch(P) == 3
    b.commit(batch(2, writes))
    assert visible(a) == committed([0, 1, 2]) and writes.written() == [0, 1, 2]


def test_a_take_over_waits_for_the_fenced_holder_to_let_go(make_store, scratch):
    a, b = make_store(), make_store()
    old, new = make_holder("old-run"), make_holder("new-run")
    writes = scratch(a)
    a.acquire_lease(P, old)
    a.commit(batch(0, writes))
    failures: list[BaseException] = []

    def take_over() -> None:
        try:
            b.acquire_lease(P, new, take_over=lambda holder: holder == old, take_over_wait_s=30)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    taker = threading.Thread(target=take_over)
    taker.start()
    done, deadline = [0], time.monotonic() + 30
    while True:  # the old holder commits on until the fence refuses it
        n = done[-1] + 1
        try:
            a.commit(batch(n, writes))
        except LeaseLost as exc:
            assert exc.batch == n and exc.holder == new and (exc.epoch, exc.held_epoch) == (2, 1)
            break
        done.append(n)
        assert time.monotonic() < deadline, "the take-over never fenced the holder"
        time.sleep(0.02)
    assert visible(b) == committed(done) and writes.written() == done
    assert taker.is_alive(), failures  # it waits for the old holder's lock
    a.release_lease(P)
    taker.join(30)
    assert not taker.is_alive() and not failures
    assert b.lease_epoch(P) == 2 and a.lease_holder(P) == new
    b.commit(batch(n, writes))
    assert visible(a) == committed([*done, n]) and writes.written() == [*done, n]
