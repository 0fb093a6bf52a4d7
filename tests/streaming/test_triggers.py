"""Emit triggers and retractions on the driver (``streaming/emission.py``, ``streaming/triggers.py``;
no Spark): docs/contract/emission.md, worked out by hand batch by batch.

Every expected row is written out in the test; the end-to-end tests against the pandas oracle are
in ``tests/e2e/test_emit_triggers.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from ematix_dagster.spec import Aggregation, Window
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats
from ematix_dagster.streaming.triggers import TriggerClock

MS = 1_000
S = 1_000_000


def _engine(trigger: Any, retractions: bool = False, **kw: Any) -> Engine:
    base: dict[str, Any] = dict(kind="tumbling", duration_ms=10_000, max_groups_per_window=100, group_by=("k",),
                                aggregations=(Aggregation("count", "n"),), source_idleness_ms=3_600_000,
                                emit_trigger=trigger)
    base.update(kw)
    window = Window(**base)
    window.validate()
    return Engine.for_window("p", window, sources=("s",), integral=(False,), retractions=retractions)


def _batch(engine: Engine, batch_id: int, time_s: float, max_s: float | None, starts_s: list[float],
           keys: list[str | None], counts: list[int], lasts_s: list[float] = ()) -> list[tuple]:
    """One batch of partials (``counts``: each partial's rows; the hidden trigger count, where the
    state keeps one, is the same number); the rows written, in order, times in seconds."""
    columns = [counts] * len(engine.state.aggregators)
    result = engine.process(BatchInput(
        batch_id=batch_id, batch_time=int(time_s * S),
        sources={"s": SourceStats(rows=sum(counts), max_event_ts=None if max_s is None else int(max_s * S))},
        starts=[int(t * S) for t in starts_s], keys=[(k,) for k in keys], partials=columns,
        lasts=[int(t * S) for t in lasts_s]))
    return [(r.start / S, r.end / S, r.key[0], r.values[0], r.kind) for r in result.rows]


def test_every_batch_writes_changed_open_groups_early_then_one_final() -> None:
    eng = _engine("every_batch")
    assert _batch(eng, 0, 0, 3, [0, 0], ["a", "b"], [2, 1]) == [(0, 10, "a", 2, "early"), (0, 10, "b", 1, "early")]
    assert _batch(eng, 1, 1, 4, [0], ["a"], [1]) == [(0, 10, "a", 3, "early")]  # b did not change
    assert _batch(eng, 2, 2, 12, [10], ["c"], [1]) == [
        (0, 10, "a", 3, "final"), (0, 10, "b", 1, "final"), (10, 20, "c", 1, "early")]


def test_every_batch_with_retractions_repeats_each_superseded_row_first() -> None:
    eng = _engine("every_batch", retractions=True)
    assert _batch(eng, 0, 0, 3, [0, 0], ["a", None], [2, 1]) == [
        (0, 10, None, 1, "early"), (0, 10, "a", 2, "early")]  # NULL keys sort first
    assert _batch(eng, 1, 1, 4, [0], ["a"], [1]) == [(0, 10, "a", 2, "retract"), (0, 10, "a", 3, "early")]
    assert _batch(eng, 2, 2, 12, [10], ["c"], [1]) == [
        (0, 10, None, 1, "retract"), (0, 10, "a", 3, "retract"),
        (0, 10, None, 1, "final"), (0, 10, "a", 3, "final"), (10, 20, "c", 1, "early")]


def test_count_fires_when_a_multiple_of_n_is_crossed_in_the_batch() -> None:
    eng = _engine({"count": 2})
    assert _batch(eng, 0, 0, 1, [0, 0], ["a", "b"], [1, 3]) == [(0, 10, "b", 3, "early")]  # a: 0 -> 1
    assert _batch(eng, 1, 1, 2, [0, 0], ["a", "b"], [1, 1]) == [(0, 10, "a", 2, "early"), (0, 10, "b", 4, "early")]
    assert _batch(eng, 2, 2, 3, [0], ["b"], [1]) == []  # b: 4 -> 5 stays at 2 multiples
    assert _batch(eng, 3, 3, 10, [], [], []) == [(0, 10, "a", 2, "final"), (0, 10, "b", 5, "final")]


def test_interval_fires_for_every_group_changed_since_its_last_firing() -> None:
    eng = _engine({"interval_ms": 10_000})
    assert _batch(eng, 0, 0, 1, [0, 0], ["a", "b"], [1, 1]) == [(0, 10, "a", 1, "early"), (0, 10, "b", 1, "early")]
    assert _batch(eng, 1, 5, 2, [0], ["a"], [1]) == []  # not due before 10 s
    # due: a changed in batch 1, c in this batch; b not since the firing at 0 s
    assert _batch(eng, 2, 10, 3, [0], ["c"], [1]) == [(0, 10, "a", 2, "early"), (0, 10, "c", 1, "early")]
    assert _batch(eng, 3, 25, 4, [], [], []) == []  # due, nothing changed: the timer restarts at 25 s
    assert eng.clock.fired_at_us == 25 * S
    assert _batch(eng, 4, 30, 5, [0], ["b"], [1]) == []  # 30 s < 25 s + 10 s


def test_the_flush_writes_finals_after_early_rows_and_closes_everything() -> None:
    eng = _engine("every_batch", retractions=True)
    assert _batch(eng, 0, 0, 3, [0], ["a"], [2]) == [(0, 10, "a", 2, "early")]
    flushed = eng.flush(0, 0)
    assert [(r.start / S, r.key[0], r.values[0], r.kind) for r in flushed.rows] == [
        (0, "a", 2, "retract"), (0, "a", 2, "final")]


def test_reopen_correction_after_final_never_an_early() -> None:
    eng = _engine("every_batch", retractions=True, late_data="reopen", allowed_lateness_ms=20_000)
    assert _batch(eng, 0, 0, 12, [0], ["a"], [1]) == [(0, 10, "a", 1, "final")]
    assert _batch(eng, 1, 1, 13, [0, 10], ["a", "a"], [1, 1]) == [
        (0, 10, "a", 1, "retract"), (0, 10, "a", 2, "correction"), (10, 20, "a", 1, "early")]
    assert _batch(eng, 2, 2, 14, [0], ["b"], [1]) == [(0, 10, "b", 1, "correction")]  # first rows after its close


@pytest.mark.parametrize("retractions", [False, True])
def test_session_merge_retracts_the_early_rows_of_the_keys_that_disappear(retractions: bool) -> None:
    eng = _engine("every_batch", retractions, kind="session", duration_ms=None, gap_ms=5_000,
                  max_session_duration_ms=100_000, lateness_ms=100_000)
    assert _batch(eng, 0, 0, 0, [0], ["a"], [1], [0]) == [(0, 5, "a", 1, "early")]
    assert _batch(eng, 1, 1, 10, [10], ["a"], [1], [10]) == [(10, 15, "a", 1, "early")]
    # a row at 5 s bridges both: (10, a) disappears; with retractions (0, a)'s row is superseded too
    superseded = [(0, 5, "a", 1, "retract")] if retractions else []
    assert _batch(eng, 2, 2, 10, [5], ["a"], [1], [5]) == [
        *superseded, (10, 15, "a", 1, "retract"), (0, 15, "a", 3, "early")]


@pytest.mark.parametrize(("parts", "fires"), [(1, True), (2, False)])
def test_session_count_trigger_starts_a_merged_session_from_the_sum_of_its_parts(parts: int, fires: bool) -> None:
    eng = _engine({"count": 3}, kind="session", duration_ms=None, gap_ms=5_000, max_session_duration_ms=100_000,
                  lateness_ms=100_000)
    assert _batch(eng, 0, 0, 10, [0, 10], ["a", "a"], [parts, parts], [1, 11]) == []  # below 3 each
    # a row at 5 s bridges both: 1 + 1 + 1 = 3 crosses 3 (from 2); 2 + 2 + 1 = 5 does not (from 4),
    # though it would from either part's count alone
    expected = [(0, 16, "a", 2 * parts + 1, "early")] if fires else []
    assert _batch(eng, 1, 1, 10, [5], ["a"], [1], [5]) == expected


def test_trigger_clock_is_due_in_the_first_batch_and_every_interval_after() -> None:
    from ematix_dagster.spec.trigger import EmitTrigger

    clock = TriggerClock(EmitTrigger(kind="interval", interval_ms=1_000))
    assert clock.scope(123) == "open"
    clock.fired(123)
    assert (clock.scope(123 + 999 * MS), clock.scope(123 + 1_000 * MS)) == ("closing", "open")
    assert TriggerClock(EmitTrigger()).scope(0) == "closing"
    assert TriggerClock(EmitTrigger(kind="every_batch")).scope(0) == "changed"
