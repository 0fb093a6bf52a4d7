"""Fixed-window state (``ematix_dagster/streaming/kinds/fixed/fixed_state.py``; no Spark): merges, emission, retention, caps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.streaming.aggregators import Count, Sum
from ematix_dagster.streaming.emission import emit
from ematix_dagster.streaming.kinds import FixedWindows
from ematix_dagster.streaming.kinds.fixed.fixed_state import FixedState
from ematix_dagster.streaming.kinds.kind_state import StoredColumns
from state_store.int_key_column import IntKeyColumn


def test_fixed_state_direct_emit_and_retention() -> None:
    st = FixedState(pipeline="p", kind=FixedWindows(10, 10), aggregators=[Count()], aliases=["n"],
                    max_groups_per_window=5)
    st.merge([0, 0, 10, 0], [("a",), (None,), ("a",), ("a",)], [[1, 2, 3, 4]])
    assert st.groups == {0: {("a",): [5], (None,): [2]}, 10: {("a",): [3]}}
    out = emit(st, before=None, watermark=9, retention=0).rows
    assert out == [] and st.open_windows(9) == 2
    out = emit(st, before=9, watermark=10, retention=3).rows
    # NULL group keys are a group of their own and sort first
    assert [(r.start, r.end, r.key, r.values, r.kind) for r in out] == [
        (0, 10, (None,), (2,), "final"), (0, 10, ("a",), (5,), "final")]
    assert st.open_windows(10) == 1 and set(st.windows) == {0, 10}
    assert emit(st, before=10, watermark=12, retention=3).rows == []  # emitted once only; 10 + 3 > 12
    assert set(st.windows) == {0, 10}
    # a retained window touched again makes corrections for the touched groups only
    st.merge([0], [("a",)], [[1]])
    out = emit(st, before=12, watermark=12, retention=3).rows
    assert [(r.start, r.key, r.values, r.kind) for r in out] == [(0, ("a",), (6,), "correction")]
    assert emit(st, before=12, watermark=13, retention=3).rows == []  # 10 + 3 <= 13: evicted
    assert set(st.windows) == {10} and st.open_windows(13) == 1
    assert st.flush_watermark == 20 and st.group_count == 1


def test_retractions_keep_the_written_rows_of_windows_their_emission_keeps_to_the_microsecond(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``[target] retractions`` a written row is remembered only if its window outlives the
    emission's eviction (``end + retention <= W`` evicts): the one ending at exactly ``W -
    retention`` is not, the one a microsecond later is, and its row is retracted when a late row
    reaches it."""
    st = FixedState("p", [Count()], ["n"], 5, FixedWindows(duration=10, hop=1), keeps_written=True)
    remembered: list[list[tuple]] = []
    remember = st.remember
    monkeypatch.setattr(st, "remember", lambda starts, ends, keys, values: (
        remembered.append(list(zip(starts, ends, keys, *values))), remember(starts, ends, keys, values)))
    st.merge([0, 1, 1], [("a",), ("a",), ("b",)], [[1, 2, 3]])  # [0, 10) and [1, 11)
    out = emit(st, before=None, watermark=15, retention=5, retractions=True).rows
    assert [(r.start, r.key, r.values, r.kind) for r in out] == [
        (0, ("a",), (1,), "final"), (1, ("a",), (2,), "final"), (1, ("b",), (3,), "final")]
    assert remembered == [[(1, 11, ("a",), 2), (1, 11, ("b",), 3)]]  # 10 + 5 <= 15: [0, 10) goes; 11 + 5 > 15
    assert set(st.windows) == {1} and st.written == {1: {("a",): (11, (2,)), ("b",): (11, (3,))}}
    st.merge([1], [("a",)], [[1]])  # late, under reopen: reaches the retained [1, 11)
    out = emit(st, before=15, watermark=15, retention=5, retractions=True).rows
    assert [(r.start, r.key, r.values, r.kind) for r in out] == [(1, ("a",), (2,), "retract"), (1, ("a",), (3,), "correction")]


def test_fixed_state_merges_a_run_column_by_column_and_a_repeated_group_row_by_row() -> None:
    st = FixedState(pipeline="p", kind=FixedWindows(10, 10), aggregators=[Count(), Sum(integral=True)],
                    aliases=["n", "s"], max_groups_per_window=3)
    st.merge([0, 0], [("a",), ("b",)], [[1, 2], [10, 20]])
    # old and new groups in one run, then one group twice in a run (not from Spark, still exact)
    st.merge([0, 0, 0, 0], [("c",), ("a",), ("a",), ("b",)], [[5, 1, 2, 3], [50, 1, None, 2]])
    assert st.groups == {0: {("a",): [4, 11], ("b",): [5, 22], ("c",): [5, 50]}}
    with pytest.raises(StateCapExceeded, match="max_groups_per_window=3"):
        st.merge([0, 0], [("a",), ("d",)], [[1, 1], [1, 1]])


@pytest.mark.parametrize("spread", [
    10,  # starts on the grid of hops: sorted by radix over 16-bit hop counts
    5,  # off that grid, less than a hop apart (any start works in this state): sorted as int64
    10 << 17,  # more hops apart than 16 bits count: sorted as int64
])
def test_a_batch_in_hash_order_folds_each_groups_partials_in_batch_order(spread: int) -> None:
    """Spark's partials come in hash order; the merge sorts them by start and must keep the batch
    order of a group's partials within a start: float sums differ by order (1e16 + 1 rounds)."""
    rng = np.random.default_rng(7)
    n = 400
    starts = rng.integers(0, 3, n) * spread
    keys = [(k,) for k in rng.integers(0, 4, n).tolist()]
    totals = rng.choice([1e16, -1e16, 1.0, 3.0], n)
    st = FixedState("p", [Count(), Sum(integral=False)], ["n", "total"], 10, FixedWindows(10, 10))
    st.merge(starts, keys, [np.ones(n, np.int64), totals])
    expected: dict[int, dict[tuple, list]] = {}
    for start, key, total in zip(starts.tolist(), keys, totals.tolist()):  # plain Python, in batch order
        held = expected.setdefault(start, {}).setdefault(key, [0, 0.0])
        held[0] += 1
        held[1] += total
    assert st.groups == {start: dict(sorted(groups.items())) for start, groups in sorted(expected.items())}
    reordered = {start: {key: sum(sorted(t for s_, k, t in zip(starts.tolist(), keys, totals.tolist())
                                          if (s_, k) == (start, key))) for key in groups}
                 for start, groups in expected.items()}
    assert reordered != {start: {k: v[1] for k, v in groups.items()} for start, groups in expected.items()}, \
        "the order of the partials must matter to the sums"


@pytest.mark.parametrize("odd_key", [(None,), (True,), (7, 1), (2**64,), (7.0,)])
def test_integer_keys_move_to_an_index_when_another_key_arrives(odd_key: tuple) -> None:
    """One-integer keys are their own ids until a key of another shape arrives: the groups held
    then keep their accumulators, and a NULL, a bool, a float or a big int stays what it was."""
    st = FixedState(pipeline="p", kind=FixedWindows(10, 10), aggregators=[Count(), Sum(integral=True)],
                    aliases=["n", "s"], max_groups_per_window=10)
    model: dict[int, dict[tuple, list[int]]] = {}

    def merge(starts: list[int], keys: list[tuple], counts: list[int], sums: list[int]) -> None:
        st.merge(starts, keys, [counts, sums])
        for start, key, n, s in zip(starts, keys, counts, sums):
            held = model.setdefault(start, {}).setdefault(key, [0, 0])
            held[0] += n
            held[1] += s

    merge([0, 0, 10], [(7,), (-3,), (7,)], [1, 2, 3], [10, 20, 30])
    merge([0, 0, 10], [odd_key, (7,), (5,)], [4, 5, 6], [40, 50, 60])
    merge([10, 10], [odd_key, (-3,)], [7, 8], [70, 80])
    assert st.groups == model
    assert all(type(k[0]) is type(o[0]) for k, o in zip(sorted(st.groups[0], key=repr), sorted(model[0], key=repr)))
    out = emit(st, before=None, watermark=20, retention=0).rows
    assert {(r.start, r.key): r.values for r in out} == {(s, k): tuple(v) for s, ks in model.items() for k, v in ks.items()}


def test_typed_partials_fold_into_typed_columns_exactly_as_python_values_would() -> None:
    """Counts and float sums that arrive as NumPy arrays (as ``spark.batch.convert.partial_lists`` hands
    them to fixed windows) are held in typed columns; a batch whose float partials hold a NULL
    (Python values) turns that column to objects. Ground truth: the partials added up in batch
    order by plain Python, a group with only NULL sums keeping None, a first partial of -0.0 kept."""
    st = FixedState("p", [Count(), Sum(integral=False)], ["n", "s"], 10, FixedWindows(duration=10, hop=10))
    model: dict[tuple[int, tuple], list] = {}

    def merge(starts: list[int], keys: list[int], counts: list[int], sums: list[float | None],
              typed: tuple[bool, bool] = (True, True)) -> None:
        partials = [np.array(counts, np.int64) if typed[0] else counts, np.array(sums, np.float64) if typed[1] else sums]
        st.merge(np.array(starts, np.int64), IntKeyColumn(np.array(keys, np.int64)), partials)
        for start, key, n, s in zip(starts, keys, counts, sums):
            held = model.setdefault((start, (key,)), [0, None])
            held[0] += n
            held[1] = held[1] if s is None else s if held[1] is None else held[1] + s

    merge([0, 0, 10, 0, 10], [7, 3, 7, 9, 4], [1, 2, 3, 4, 1], [0.1, -0.0, 2.5, 1e300, -0.0])
    merge([10, 0, 0, 0, 10], [8, 7, 7, 5, 7], [5, 6, 7, 8, 9], [1.0, 0.2, 0.3, float("inf"), -2.5])  # starts out of order, (0, 7) twice
    assert [column.dtype for column in st.windows[0].accs] == [np.int64, np.float64]
    merge([0, 0, 20], [3, 11, 11], [1, 1, 1], [1.5, None, None], (True, False))  # a NULL sum: objects
    assert [column.dtype for column in st.windows[0].accs] == [np.int64, object]
    merge([20, 20, 10], [11, 12, 8], [2, 3, 4], [3.0, -0.0, 0.5])  # an object column takes arrays too
    groups = {(start, key): accs for start, by_key in st.groups.items() for key, accs in by_key.items()}
    assert groups == model and [type(v) for v in groups[(20, (11,))]] == [int, float]
    assert groups[(0, (9,))][1] == 1e300 and all(math.copysign(1.0, groups[k][1]) == -1.0 for k in [(10, (4,)), (20, (12,))])
    assert groups[(0, (11,))] == [1, None]
    changes = st.take_column_changes(everything=True)
    again = FixedState("p", [Count(), Sum(integral=False)], ["n", "s"], 10, FixedWindows(duration=10, hop=10))
    again.restore(StoredColumns(changes.starts.tolist(), changes.ends.tolist(), changes.keys,
                                [column.tolist() for column in changes.accs]), None)
    assert again.groups == st.groups
    out = emit(st, before=None, watermark=30, retention=0).rows
    assert {(r.start, r.key): r.values for r in out} == {k: tuple(v) for k, v in model.items()}
