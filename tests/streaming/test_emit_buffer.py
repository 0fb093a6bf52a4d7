"""``[emit] sql``'s buffer (docs/contract/delayed-windows.md): replacement by key, cancel by retract, flush rows wait,
release order, the cap, and the store round trip. Expected values are written out by hand from the contract's rules."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.sql.release_plan import RELEASE_NOW
from ematix_dagster.streaming.emit_buffer import EmitBuffer
from ematix_dagster.streaming.emitted import Emitted, EmittedRow


def _at(*release_us: int | None) -> pa.Array:
    """Release times as the stage hands them over."""
    return pa.array(release_us, pa.int64())


def _rows(*rows: tuple) -> Emitted:
    out = Emitted()
    out.add_rows(EmittedRow(start, end, (key,), (value,), kind) for start, end, key, value, kind in rows)
    return out


def _out(emitted: Emitted) -> list[tuple]:
    return [(r.start, r.key[0], r.values[0], r.kind) for r in emitted.rows]


def _store_round_trip(buf: EmitBuffer) -> EmitBuffer:
    """A buffer restored from what the commits would have stored."""
    again = EmitBuffer(buf.pipeline, buf.max_buffered_rows)
    again.restore([w.stored() for w in (*buf.rows.values(), *buf.retracts.values())])
    assert again.rows == buf.rows and again.retracts == buf.retracts
    return again


def test_a_pending_row_is_replaced_takes_the_newer_release_time_and_keeps_its_kind() -> None:
    buf = EmitBuffer("p", 10)
    first = buf.process(0, _rows((0, 60, "a", 1, "early")), _at(200), watermark=50)
    assert _out(first.released) == [] and [p.key for p in first.changes.inserts] == [(200, 0, 0)]
    second = buf.process(1, _rows((0, 60, "a", 2, "final")), _at(300), watermark=250)  # 200 reached, but replaced
    assert _out(second.released) == [] and second.changes.deletes == [(200, 0, 0)]
    assert [p.key for p in second.changes.inserts] == [(300, 1, 0)]
    buf = _store_round_trip(buf)
    third = buf.process(2, Emitted(), _at(), watermark=300)
    assert _out(third.released) == [(0, "a", 2, "final")] and third.changes.deletes == [(300, 1, 0)] and third.pending == 0


def test_a_correction_of_a_pending_final_leaves_as_final_and_a_released_final_is_corrected() -> None:
    buf = EmitBuffer("p", 10)
    buf.process(0, _rows((0, 60, "a", 1, "final"), (0, 60, "b", 5, "final")), _at(100, 100), watermark=60)
    out = buf.process(1, _rows((0, 60, "a", 2, "correction")), _at(100), watermark=100)
    assert _out(out.released) == [(0, "b", 5, "final"), (0, "a", 2, "final")]  # same release: arrival order
    out = buf.process(2, _rows((0, 60, "b", 6, "correction")), _at(100), watermark=110)
    assert _out(out.released) == [(0, "b", 6, "correction")] and out.changes.inserts == [] and out.changes.deletes == []


def test_a_retract_cancels_a_pending_row_and_one_of_a_released_row_leaves_at_once_first() -> None:
    buf = EmitBuffer("p", 10)
    buf.process(0, _rows((0, 60, "a", 1, "early"), (0, 60, "b", 1, "early")), _at(RELEASE_NOW, 500), watermark=10)
    out = buf.process(1, _rows((0, 60, "a", 1, "retract"), (0, 60, "b", 1, "retract"),
                               (0, 60, "a", 2, "early"), (0, 60, "b", 2, "early")), _at(RELEASE_NOW, 500, 500, 500),
                      watermark=20)
    assert _out(out.released) == [(0, "a", 1, "retract")]  # b's pending early is cancelled, never written
    assert out.cancelled == 1 and out.changes.deletes == [(500, 0, 1)]
    assert sorted(p.key for p in out.changes.inserts) == [(500, 1, 2), (500, 1, 3)]
    # a row due now and the batch's own immediate rows: retracts first, then by (release, arrival, position)
    buf2 = EmitBuffer("p", 10)
    buf2.process(0, _rows((60, 120, "c", 1, "final")), _at(150), watermark=120)
    out = buf2.process(1, _rows((0, 60, "d", 7, "retract"), (0, 60, "d", 8, "correction")), _at(100, 100),
                       watermark=160)
    assert _out(out.released) == [(0, "d", 7, "retract"), (0, "d", 8, "correction"), (60, "c", 1, "final")]


def test_a_row_no_branch_releases_is_counted_and_drops_the_row_it_replaces() -> None:
    buf = EmitBuffer("p", 10)
    buf.process(0, _rows((0, 60, "a", 1, "early")), _at(500), watermark=10)
    out = buf.process(1, _rows((0, 90, "a", 2, "final")), _at(None), watermark=100)
    assert out.not_released == 1 and out.changes.deletes == [(500, 0, 0)] and out.pending == 0 and _out(out.released) == []
    out = buf.process(2, _rows((0, 90, "a", 2, "retract")), _at(None), watermark=100)  # of that never-released row
    assert out.not_released == 1 and _out(out.released) == []


def test_with_retractions_a_correction_after_the_retract_of_a_pending_final_leaves_as_final() -> None:
    buf = EmitBuffer("p", 10)
    buf.process(0, _rows((0, 60, "a", 1, "final")), _at(100), watermark=60)
    out = buf.process(1, _rows((0, 60, "a", 1, "retract"), (0, 60, "a", 2, "correction")), _at(100, 100), watermark=100)
    assert _out(out.released) == [(0, "a", 2, "final")] and out.cancelled == 1


def test_the_flush_releases_nothing_and_its_rows_wait_for_a_later_batch() -> None:
    buf = EmitBuffer("p", 10)
    buf.process(3, _rows((0, 60, "a", 1, "early"), (0, 60, "b", 1, "early")), _at(RELEASE_NOW, 40), watermark=30)
    out = buf.process(3, _rows((0, 60, "a", 1, "retract"), (0, 60, "a", 2, "final"), (0, 60, "b", 2, "final"),
                               (60, 120, "c", 1, "final")), _at(10, 10, 10, 20), watermark=30, first_seq=2, flush=True)
    assert _out(out.released) == [] and out.pending == 4  # a's retract and final, b's final (its early replaced), c's
    assert out.changes.deletes == [(40, 3, 1)]
    assert sorted(p.key for p in out.changes.inserts) == [(RELEASE_NOW, 3, 2), (10, 3, 3), (10, 3, 4), (20, 3, 5)]
    assert out.output_watermark == 30 and buf.output_watermark(200) == 60
    buf = _store_round_trip(buf)
    later = buf.process(4, Emitted(), _at(), watermark=30)
    assert _out(later.released) == [(0, "a", 1, "retract"), (0, "a", 2, "final"), (0, "b", 2, "final"),
                                    (60, "c", 1, "final")]
    assert later.pending == 0 and later.output_watermark == 30


def test_the_output_watermark_is_held_by_the_smallest_pending_window_end() -> None:
    buf = EmitBuffer("p", 10)
    out = buf.process(0, _rows((0, 60, "a", 1, "final"), (60, 120, "a", 1, "final")), _at(1000, 1000), watermark=500)
    assert out.output_watermark == 60
    assert buf.process(1, Emitted(), _at(), watermark=None).output_watermark is None


def test_more_pending_rows_than_the_cap_fail_loud() -> None:
    buf = EmitBuffer("p", 1)
    with pytest.raises(StateCapExceeded, match="max_buffered_rows = 1"):
        buf.process(0, _rows((0, 60, "a", 1, "final"), (0, 60, "b", 1, "final")), _at(100, 100), watermark=60)
