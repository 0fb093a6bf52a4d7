"""Recovery on the pure core, without Spark: a restored engine continues exactly like one that never stopped.

The engine runs a sequence of batches once straight through, and once with a "crash" after every
batch: its changes go through the real codec into a real SQLite store, a new engine is restored
from what the store loads, and it continues. Both must emit the same rows, keep the same
watermarks and counters; a batch the store already holds is recognised by its id.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from ematix_dagster.spec import Aggregation, Window
from ematix_dagster.streaming.durable import batch_commit, restore_engine
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats
from state_store.sqlite import SqliteStateStore

S = 1_000_000
WINDOW = Window(kind="hopping", duration_ms=60_000, hop_ms=20_000, lateness_ms=5_000, late_data="reopen",
                allowed_lateness_ms=40_000, group_by=("k",), max_groups_per_window=100,
                aggregations=(Aggregation("count", "n"), Aggregation("sum", "v", column="v"),
                              Aggregation("count_distinct", "d", column="p", mode="exact",
                                          max_distinct_values_per_group=50),
                              Aggregation("first", "f", column="p")))


def _batches(seed: int = 3) -> list[BatchInput]:
    """Partials as Spark would send them: per (window start, key), with some late starts."""
    rng = random.Random(seed)
    out = []
    for b in range(8):
        starts, keys, parts = [], [], [[], [], [], []]
        for _ in range(6):
            start = (b * 20 + rng.choice([-60, -40, -20, 0, 20])) * S
            if start < 0:
                continue
            key = (rng.choice(["a", "b", None]),)
            if (start, key) in zip(starts, keys):
                continue
            starts.append(start)
            keys.append(key)
            parts[0].append(rng.randint(1, 4))
            parts[1].append(rng.randint(-5, 9))
            parts[2].append([f"p{rng.randint(0, 5)}" for _ in range(2)])
            parts[3].append((start + rng.randint(0, 9), f"x{rng.randint(0, 3)}"))
        out.append(BatchInput(batch_id=b, batch_time=(1000 + b) * S,
                              sources={"s": SourceStats(rows=len(starts), max_event_ts=(b * 20 + 30) * S)},
                              starts=starts, keys=keys, partials=parts))
    return out


#: without the exact distinct count (whose growing sets keep a window's groups in rows of their own),
#: windows are written whole and then group by group over that row
SCALARS = (0, 1, 3)


def _engine(scalars_only: bool = False) -> Engine:
    if scalars_only:
        window = dataclasses.replace(WINDOW, aggregations=tuple(WINDOW.aggregations[i] for i in SCALARS))
        return Engine.for_window("replay", window, ("s",), integral=(False, True, False))
    return Engine.for_window("replay", WINDOW, ("s",), integral=(False, True, False, False))


def _scalars(batch: BatchInput) -> BatchInput:
    return dataclasses.replace(batch, partials=[batch.partials[i] for i in SCALARS])


def _commit(store: SqliteStateStore, engine: Engine, written: list[str] | None = None) -> None:
    commit = batch_commit(engine, "replay")
    if written is not None:
        written += ["whole"] * len(commit.whole_windows) + ["group"] * len(commit.upserts)
    store.commit(commit)


def _restore(store: SqliteStateStore, scalars_only: bool) -> Engine:
    engine = _engine(scalars_only)
    restore_engine(engine, store.load("replay"))
    return engine


def _rows(result) -> list[tuple]:
    return [(r.start, r.key, r.values, r.kind) for r in result.rows]


@pytest.mark.parametrize("scalars_only", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_restore_after_every_batch_matches_an_uninterrupted_run(tmp_path, seed, scalars_only):
    batches = [_scalars(b) for b in _batches(seed)] if scalars_only else _batches(seed)
    straight = _engine(scalars_only)
    expected = [_rows(straight.process(b)) for b in batches]
    assert any(kind == "correction" for rows in expected for *_, kind in rows), "the data exercises reopen"

    store = SqliteStateStore(str(tmp_path / "state.db"))
    store.open()
    store.acquire_lease("replay", "test")
    try:
        got, written = [], []
        engine = _engine(scalars_only)
        for b in batches:
            if engine.last_batch_id is not None and b.batch_id <= engine.last_batch_id:
                pytest.fail("a new batch id was taken for a replay")
            got.append(_rows(engine.process(b)))
            _commit(store, engine, written)
            engine = _restore(store, scalars_only)  # "crash" and restart after every batch
            assert engine.last_batch_id == b.batch_id  # Spark's replay of b would be recognised and skipped
        assert got == expected
        assert set(written) == ({"whole", "group"} if scalars_only else {"group"})
        assert engine.watermarks.global_wm == straight.watermarks.global_wm
        assert engine.counters == straight.counters
        assert engine.state.windows == straight.state.windows
    finally:
        store.close()


def test_a_window_is_written_whole_once_half_its_groups_changed(tmp_path):
    """One row for a window most of whose groups changed, one row per group below half."""
    window = Window(kind="tumbling", duration_ms=60_000, lateness_ms=0, group_by=("k",), max_groups_per_window=100,
                    aggregations=(Aggregation("count", "n"),))
    engine = Engine.for_window("replay", window, ("s",), integral=(False,))
    store = SqliteStateStore(str(tmp_path / "state.db"))
    store.open()
    try:
        written = []
        for b, keys in enumerate([range(10), range(4), range(5, 10), [3]]):
            keys = [(f"k{i}",) for i in keys]
            engine.process(BatchInput(batch_id=b, batch_time=b * S, sources={"s": SourceStats(rows=len(keys))},
                                      starts=[0] * len(keys), keys=keys, partials=[[b + 1] * len(keys)]))
            commit = batch_commit(engine, "replay")
            written.append((len(commit.whole_windows), len(commit.upserts)))
            store.commit(commit)
        assert written == [(1, 0), (0, 4), (1, 0), (0, 1)]
        restored = Engine.for_window("replay", window, ("s",), integral=(False,))
        restore_engine(restored, store.load("replay"))
        assert restored.state.windows == engine.state.windows
        assert restored.state.windows[0][("k3",)] == [1 + 2 + 4] and restored.state.windows[0][("k9",)] == [1 + 3]
    finally:
        store.close()


@pytest.mark.parametrize("aggregation", [
    Aggregation("count", "n"),
    Aggregation("count_distinct", "d", column="v"),  # sketches: their own size, not their dense image
    Aggregation("count_distinct", "d", column="v", mode="exact", max_distinct_values_per_group=5),
])
@pytest.mark.parametrize("slack", [0, -1])
def test_a_window_too_big_for_one_row_is_written_group_by_group(monkeypatch, aggregation, slack):
    """A whole-window row is bounded by its size; exact distinct sets, which grow with their data,
    are always written group by group."""
    from datasketches import hll_sketch

    import ematix_dagster.streaming.durable as durable

    window = Window(kind="tumbling", duration_ms=60_000, lateness_ms=0, group_by=("k",), max_groups_per_window=100,
                    aggregations=(aggregation,))
    keys = [(f"k{i}",) for i in range(10)]
    sketch = hll_sketch(14)
    sketch.update("x")
    partial = [1] * 10 if aggregation.agg == "count" else [["x"]] * 10 if aggregation.mode == "exact" \
        else [sketch.serialize_compact()] * 10

    def commit_with(max_bytes: int):
        monkeypatch.setattr(durable, "WHOLE_WINDOW_MAX_BYTES", max_bytes)
        engine = Engine.for_window("replay", window, ("s",), integral=(False,))
        engine.process(BatchInput(batch_id=0, batch_time=0, sources={"s": SourceStats(rows=10)},
                                  starts=[0] * 10, keys=keys, partials=[partial]))
        return batch_commit(engine, "replay")

    if aggregation.mode == "exact":
        commit, whole = commit_with(1 << 30), False
    else:
        size = len(commit_with(1 << 30).whole_windows[0][2])
        assert size < 10 * (1 << 14)  # far below ten dense sketch images
        commit, whole = commit_with(size + slack), slack == 0
    assert (len(commit.whole_windows), len(commit.upserts)) == ((1, 0) if whole else (0, 10))


@pytest.mark.parametrize(("trigger", "retractions"), [
    ("every_batch", True), ({"interval_ms": 2_500}, True), ({"count": 5}, False)])
def test_restore_continues_emit_triggers_and_retractions_exactly(tmp_path, trigger, retractions):
    """Hidden row counts, the interval's last firing and the written rows survive every restart."""
    window = dataclasses.replace(WINDOW, aggregations=tuple(WINDOW.aggregations[i] for i in SCALARS),
                                 emit_trigger=trigger)
    counts_rows = window.emit_trigger.counts_rows
    batches = [dataclasses.replace(b, partials=[*b.partials, *([b.partials[0]] if counts_rows else [])])
               for b in map(_scalars, _batches(2))]

    def engine() -> Engine:
        return Engine.for_window("replay", window, ("s",), integral=(False, True, False), retractions=retractions)

    straight = engine()
    expected = [_rows(straight.process(b)) for b in batches]
    kinds = {kind for rows in expected for *_, kind in rows}
    assert {"early", "final", "correction"} <= kinds and (not retractions or "retract" in kinds)
    store = SqliteStateStore(str(tmp_path / "state.db"))
    store.open()
    store.acquire_lease("replay", "test")
    try:
        got, current = [], engine()
        for b in batches:
            got.append(_rows(current.process(b)))
            store.commit(batch_commit(current, "replay"))
            current = engine()
            restore_engine(current, store.load("replay"))
        assert got == expected
        assert current.clock.fired_at_us == straight.clock.fired_at_us
        assert current.state.written == straight.state.written
        assert current.state.windows == straight.state.windows
    finally:
        store.close()
