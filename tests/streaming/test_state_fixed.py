"""Fixed-window state (``ematix_dagster/streaming/state/fixed.py``; no Spark): merges, emission, retention, caps."""

from __future__ import annotations

import pytest

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.streaming.aggregators import Count, Sum
from ematix_dagster.streaming.emission import emit
from ematix_dagster.streaming.state.fixed import FixedState
from ematix_dagster.streaming.windows import FixedWindows


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
