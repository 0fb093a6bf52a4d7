"""Schema step 7's range release: ``BatchCommit.pending_released_up_to`` deletes every pending row due
by W in one statement (a row pipeline's release), on the three stores."""

from __future__ import annotations

from state_store.contract import BatchCommit
from tests.state_store.contract_stores import record
from tests.state_store.test_pending_rows import ALL, P, row


def test_a_range_release_deletes_every_row_due_by_its_bound(make_store):
    """``pending_released_up_to``: the rows with ``release_us <= bound`` leave (whatever their arrival
    batch), the later ones and another pipeline's stay; a replay releasing the same range again is no
    error; it combines with the batch's inserts above the bound."""
    store = make_store()
    rows = [row(-5, 0, 0), row(100, 0, 1, n=1), row(100, 1, 0, n=2), row(101, 0, 2, n=3), row(300, 1, 1, n=4)]
    store.commit(BatchCommit(record(P, 1), pending_inserts=rows))
    store.commit(BatchCommit(record("another", 0), pending_inserts=[row(1, 0, 0)]))
    later = row(101, 2, 0, n=5)
    store.commit(BatchCommit(record(P, 2), pending_inserts=[later], pending_released_up_to=100))
    for s in (store, make_store()):
        assert s.load_pending(P, ALL) == [rows[3], later, rows[4]]
        assert s.load_pending("another", ALL) == [row(1, 0, 0)]
    store.commit(BatchCommit(record(P, 3), pending_released_up_to=100))  # a replay: nothing left to delete
    assert store.load_pending(P, ALL) == [rows[3], later, rows[4]]
    store.commit(BatchCommit(record(P, 4), pending_released_up_to=ALL))
    assert store.load_pending(P, ALL) == [] and store.pending_summary(P).rows == 0
