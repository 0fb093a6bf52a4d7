"""The start-up state estimate against driver memory measured with tracemalloc.

The estimate's bytes per group (``ematix_dagster.streaming.state_size``, each aggregator's
``state_bytes`` and ``bytes_per_value``) are constants; these tests measure the real layout,
20,000 groups merged into ``FixedState`` the way a batch does, and fail when a constant drifts
more than a third from what Python allocates.
"""

from __future__ import annotations

import tracemalloc
from typing import Any, Callable

import pytest
from datasketches import hll_sketch

from ematix_dagster.spec import Aggregation, Window
from ematix_dagster.streaming.aggregators import make_aggregator
from ematix_dagster.streaming.emission import emit
from ematix_dagster.streaming.kinds import window_kind
from ematix_dagster.streaming.kinds.fixed.fixed_state import FixedState
from ematix_dagster.streaming.state_size import estimate_state

GROUPS = 20_000


def _sketch(i: int) -> bytes:
    s = hll_sketch(12)
    for j in range(3000):  # dense enough to be a full HLL image
        s.update(f"{i}-{j}")
    return s.serialize_compact()


# aggregation -> one partial per group (as the batch's Arrow column delivers it)
CASES: dict[str, tuple[Aggregation, Callable[[int], Any]]] = {
    "count": (Aggregation("count", "n"), lambda i: 3),
    "sum": (Aggregation("sum", "s", column="x"), lambda i: i * 1_000_003),
    "min": (Aggregation("min", "m", column="x"), lambda i: i * 1_000_003),
    "avg": (Aggregation("avg", "a", column="x"), lambda i: (i * 1.5, 3)),
    "first": (Aggregation("first", "f", column="x"), lambda i: (1_700_000_000_000_000 + i, f"v{i}")),
    "exact_distinct": (Aggregation("count_distinct", "d", column="x", mode="exact",
                                   max_distinct_values_per_group=100), lambda i: [f"value-{i}"]),
}


def _window(*aggs: Aggregation, hll_precision: int = 12) -> Window:
    return Window(kind="tumbling", duration_ms=60_000, max_groups_per_window=GROUPS, group_by=("user",),
                  aggregations=aggs, hll_precision=hll_precision)


def _traced_bytes_per_group(fill: Callable[[], None]) -> float:
    """Python memory ``fill`` leaves allocated, per group (what it made and dropped is not counted)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fill()
        return (tracemalloc.get_traced_memory()[0] - before) / GROUPS
    finally:
        tracemalloc.stop()


def _measured_bytes_per_group(window: Window, make_partials: Callable[[], list[list[Any]]],
                              key: Callable[[int], Any] = lambda i: f"user-{i:06d}") -> float:
    """Driver memory that stays allocated after one batch of ``GROUPS`` new groups is merged.

    Keys and partials are made inside the measurement, as the batch's Arrow conversion makes them;
    what the state keeps of them (key tuples, pairs, sets, sketch bytes) is then the state's.
    """
    state = FixedState(pipeline="p", kind=window_kind(window), aliases=["a"] * len(window.aggregations),
                       aggregators=[make_aggregator(a, True, window.hll_precision) for a in window.aggregations],
                       max_groups_per_window=GROUPS)

    def fill() -> None:
        state.merge([0] * GROUPS, [(key(i),) for i in range(GROUPS)], make_partials())
        state.take_column_changes()  # the commit's bookkeeping, not the state

    return _traced_bytes_per_group(fill)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bytes_per_group_match_the_measured_layout(case: str) -> None:
    agg, partial = CASES[case]
    window = _window(agg)
    measured = _measured_bytes_per_group(window, lambda: [[partial(i) for i in range(GROUPS)]])
    estimate = estimate_state(window)
    expected = estimate.bytes_per_group + estimate.bytes_per_distinct_value  # exact sets hold one value here
    assert abs(expected - measured) <= measured / 3, (case, expected, measured)


def test_one_integer_key_column_holds_no_key_object() -> None:
    """One BIGINT group-by column, the common case: each key is its own id, so a count + sum group
    costs its slots in the columns and its two boxed numbers, less than half the 282 bytes a group
    took as a dict of key tuples (the driver-state ceiling doubled, docs/decisions.md); the
    estimate, which cannot know the key's type at start-up, stays above it."""
    window = _window(CASES["count"][0], CASES["sum"][0])
    measured = _measured_bytes_per_group(window, lambda: [[3] * GROUPS, [i * 1_000_003 for i in range(GROUPS)]],
                                         key=lambda i: 7_000_000_000 + i)
    assert measured < 282 / 2 < estimate_state(window).bytes_per_group, measured


def test_a_full_hll_sketch_and_several_aggregations_at_once() -> None:
    aggs = [CASES[c][0] for c in ("count", "sum", "avg")] + [Aggregation("count_distinct", "h", column="x")]
    window = _window(*aggs)
    images = [_sketch(i) for i in range(100)]  # made outside: sketching is slow; each group gets a copy

    def partials() -> list[list[Any]]:
        return [[CASES[c][1](i) for i in range(GROUPS)] for c in ("count", "sum", "avg")] + [
            [bytearray(images[i % 100]) for i in range(GROUPS)]]  # merge keeps bytes(partial): its own copy

    measured = _measured_bytes_per_group(window, partials)
    expected = estimate_state(window).bytes_per_group
    assert abs(expected - measured) <= measured / 3, (expected, measured)


def test_exact_distinct_values_cost_the_stated_rate() -> None:
    agg = CASES["exact_distinct"][0]
    window = _window(agg)
    one = _measured_bytes_per_group(window, lambda: [[[f"value-{i}"] for i in range(GROUPS)]])
    many = _measured_bytes_per_group(window, lambda: [[[f"value-{i}-{j}" for j in range(21)] for i in range(GROUPS)]])
    rate = estimate_state(window).bytes_per_distinct_value
    measured = (many - one) / 20
    assert abs(rate - measured) <= measured / 3, (rate, measured)


@pytest.mark.parametrize("aggs", [(Aggregation("count", "n"),), (Aggregation("min", "m", column="x"),)],
                         ids=["count-with-prefix-sums", "min"])
def test_bytes_per_sliding_partial_match_the_measured_layout(aggs: tuple[Aggregation, ...]) -> None:
    """Sliding windows hold one partial per (key, event time): 10 event times for each of 2,000 keys,
    measured after an emit (which builds an additive window's prefix sums)."""
    from ematix_dagster.streaming.micro_batch import Engine

    window = Window(kind="sliding", duration_ms=60_000, max_events_per_group=100, max_groups_per_window=GROUPS,
                    group_by=("user",), aggregations=aggs)
    newest = 1_700_000_000_000_000 + GROUPS * 1_000

    def fill(state: Any) -> None:
        times = [1_700_000_000_000_000 + i * 1_000 for i in range(GROUPS)]
        state.merge(times, [(f"user-{i % 2_000:06d}",) for i in range(GROUPS)], [[3] * GROUPS])
        assert len(emit(state, None, newest + 1, 0)) == GROUPS  # every window final, nothing evicted
        state.take_column_changes()  # the commit's bookkeeping, not the state

    fill(Engine.for_window("p", window, ("s",), (False,)).state)  # a first run's one-time caches are not the state's
    state = Engine.for_window("p", window, ("s",), (False,)).state
    measured = _traced_bytes_per_group(lambda: fill(state))
    expected = estimate_state(window).bytes_per_group
    assert abs(expected - measured) <= measured / 3, (expected, measured)


def test_bytes_per_session_match_the_measured_layout() -> None:
    """Sessions are held as columns: one session for each of 20,000 keys (count and sum), measured
    after the commit took its bookkeeping."""
    from ematix_dagster.streaming.micro_batch import Engine

    window = Window(kind="session", gap_ms=30_000, max_session_duration_ms=3_600_000, max_groups_per_window=GROUPS,
                    group_by=("user",), aggregations=(CASES["count"][0], CASES["sum"][0]))
    state = Engine.for_window("p", window, ("s",), (False, True)).state

    def fill() -> None:
        times = [1_700_000_000_000_000 + i * 1_000 for i in range(GROUPS)]
        state.merge(times, [(f"user-{i:06d}",) for i in range(GROUPS)],
                    [[3] * GROUPS, [i * 1_000_003 for i in range(GROUPS)]], times)
        state.take_column_changes()  # the commit's bookkeeping, not the state

    measured = _traced_bytes_per_group(fill)
    expected = estimate_state(window).bytes_per_group
    assert abs(expected - measured) <= measured / 3, (expected, measured)
