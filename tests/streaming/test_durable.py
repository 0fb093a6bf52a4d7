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
from ematix_dagster.streaming.durable import batch_commit, decoded_groups, decoded_written, restore_engine
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats
from state_store.codec import decode_key, encode_key
from state_store.contract import BatchCommit
from state_store.errors import CorruptState
from state_store.segment_replay import replayed
from state_store.segments import Segment, decode_segment, encode_segment
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


#: without the exact distinct count, whose sets a segment stores as msgpack bytes, the count and
#: sum are stored as typed int64 / float64 columns
SCALARS = (0, 1, 3)


def _engine(scalars_only: bool = False) -> Engine:
    if scalars_only:
        window = dataclasses.replace(WINDOW, aggregations=tuple(WINDOW.aggregations[i] for i in SCALARS))
        return Engine.for_window("replay", window, ("s",), integral=(False, True, False))
    return Engine.for_window("replay", WINDOW, ("s",), integral=(False, True, False, False))


def _scalars(batch: BatchInput) -> BatchInput:
    return dataclasses.replace(batch, partials=[batch.partials[i] for i in SCALARS])


def _commit(store: SqliteStateStore, engine: Engine) -> None:
    store.commit(batch_commit(engine, "replay"))


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
        got = []
        engine = _engine(scalars_only)
        for b in batches:
            if engine.last_batch_id is not None and b.batch_id <= engine.last_batch_id:
                pytest.fail("a new batch id was taken for a replay")
            got.append(_rows(engine.process(b)))
            _commit(store, engine)
            engine = _restore(store, scalars_only)  # "crash" and restart after every batch
            assert engine.last_batch_id == b.batch_id  # Spark's replay of b would be recognised and skipped
        assert got == expected
        assert engine.watermarks.global_wm == straight.watermarks.global_wm
        assert engine.counters == straight.counters
        assert engine.state.groups == straight.state.groups
    finally:
        store.close()


def test_a_commit_writes_the_changed_groups_and_an_eviction_as_a_range_delete(tmp_path):
    """Each commit's segment holds the groups the batch changed, not the whole window; a closed
    window leaves the store by one range delete, and the segments holding only its groups with it
    (a dead prefix), so the state is never rewritten as a base."""
    window = Window(kind="tumbling", duration_ms=60_000, lateness_ms=0, group_by=("k",), max_groups_per_window=100,
                    aggregations=(Aggregation("count", "n"),))
    engine = Engine.for_window("replay", window, ("s",), integral=(False,))
    store = SqliteStateStore(str(tmp_path / "state.db"))
    store.open()
    try:
        written = []
        batches = [(0, range(10), 0), (0, range(4), 0), (0, range(5, 8), 0), (60, [3], 61), (60, range(10), 61)]
        for b, (start_s, keys, max_s) in enumerate(batches):
            keys = [(f"k{i}",) for i in keys]
            engine.process(BatchInput(batch_id=b, batch_time=b * S, sources={"s": SourceStats(len(keys), max_s * S)},
                                      starts=[start_s * S] * len(keys), keys=keys, partials=[[b + 1] * len(keys)]))
            commit = batch_commit(engine, "replay")
            written += [(segment.base, sorted(decode_key(k)[0] for k in segment.keys), segment.deleted_before,
                         commit.dropped_segments)
                        for segment in (decode_segment(blob, "test") for blob in commit.segments)]
            store.commit(commit)
        k = [f"k{i}" for i in range(10)]
        assert written == [(False, k, None, 0), (False, k[:4], None, 0), (False, k[5:8], None, 0),
                           (False, ["k3"], 1, 3),  # W = 61 s: window 0 is final, then evicted (no retention)
                           (False, k, None, 0)]  # 12 operations stored for 10 rows: no base
        assert len(store.load("replay").segments) == 2
        restored = Engine.for_window("replay", window, ("s",), integral=(False,))
        restore_engine(restored, store.load("replay"))
        assert restored.state.groups == engine.state.groups == {60 * S: {(f"k{i}",): [5 + 4 * (i == 3)] for i in range(10)}}
    finally:
        store.close()


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
        assert current.state.groups == straight.state.groups
    finally:
        store.close()


SESSIONS = Window(kind="session", gap_ms=20_000, max_session_duration_ms=600_000, lateness_ms=5_000, late_data="reopen",
                  allowed_lateness_ms=40_000, group_by=("k",), max_groups_per_window=100,
                  aggregations=(Aggregation("count", "n"), Aggregation("sum", "v", column="v")))


def _session_batches() -> list[BatchInput]:
    """One-event partial sessions of a few keys, some late (so some sessions merge and some are emitted)."""
    rng = random.Random(5)
    out = []
    for b in range(8):
        events = sorted(dict.fromkeys(((b * 20 + rng.choice([-30, -10, 0, 10])) * S, (rng.choice(["a", "b", None]),))
                                      for _ in range(6)), key=lambda event: event[0])
        times = [t for t, _ in events if t >= 0]
        keys = [key for t, key in events if t >= 0]
        out.append(BatchInput(batch_id=b, batch_time=(1000 + b) * S,
                              sources={"s": SourceStats(rows=len(times), max_event_ts=(b * 20 + 10) * S)},
                              starts=times, keys=keys, partials=[[1] * len(times), [rng.randint(-5, 9) for _ in times]],
                              lasts=times))
    return out


@pytest.mark.parametrize("kind", ["fixed", "session"])
def test_a_restore_from_segments_and_one_from_the_same_groups_as_rows_hold_the_same_state(tmp_path, kind):
    """The segments' columns (``restore_engine``) and the rows a store of schema 7 would hold for
    them (``replayed``, ``decoded_groups``) restore exactly the same state."""
    if kind == "fixed":
        def engine() -> Engine:
            return _engine(scalars_only=True)
        batches = [_scalars(b) for b in _batches(2)]
    else:
        def engine() -> Engine:
            return Engine.for_window("replay", SESSIONS, ("s",), integral=(False, True))
        batches = _session_batches()

    def held(engine: Engine):
        return engine.state.groups if kind == "fixed" else engine.state.sessions

    store = SqliteStateStore(str(tmp_path / "state.db"))
    store.open()
    store.acquire_lease("replay", "test")
    try:
        running = engine()
        for b in batches:
            running.process(b)
            store.commit(batch_commit(running, "replay"))
            loaded = store.load("replay")
            from_segments = engine()
            restore_engine(from_segments, loaded)
            rows, _ = replayed(loaded, "test")
            from_rows = engine()
            from_rows.restore(loaded.record.last_batch_id, loaded.record.watermark, {}, {},
                              decoded_groups("replay", rows, ends_stored=from_rows.state.kind.ends_stored),
                              written=decoded_written(rows))
            assert held(from_segments) == held(from_rows) == held(running)
            assert from_segments.state.written == from_rows.state.written == running.state.written
        assert held(running), "the batches leave state to restore"
    finally:
        store.close()


@pytest.mark.parametrize(("segment", "fragments"), [
    (Segment(starts=[60 * S], ends=[120 * S], keys=[encode_key(("b",))], emitted=None, written=None, accs=[[1]]),
     ["window_start 60000000", "group ('b',)", "1 accumulators are stored, but the pipeline has 2 aggregations"]),
    (Segment(starts=[60 * S], ends=[120 * S], keys=[b"\x01?"], emitted=None, written=None, accs=[[1], [2]]),
     ["pipeline 'replay'", "group key is corrupt"]),
])
def test_a_restore_from_segments_names_the_group_that_does_not_fit(tmp_path, segment, fragments):
    """Groups replayed from segments of different widths, or a key that does not decode among
    keys that do, are reported as a restore from rows reports them."""
    window = Window(kind="tumbling", duration_ms=60_000, group_by=("k",), max_groups_per_window=100,
                    aggregations=(Aggregation("count", "n"), Aggregation("sum", "v", column="v")))
    engine = Engine.for_window("replay", window, ("s",), integral=(False, True))
    engine.process(BatchInput(batch_id=0, batch_time=0, sources={"s": SourceStats(2, 70 * S)}, starts=[0, 60 * S],
                              keys=[("a",), ("a",)], partials=[[1, 2], [3, 4]]))
    store = SqliteStateStore(str(tmp_path / "state.db"))
    store.open()
    try:
        store.commit(batch_commit(engine, "replay"))
        record = store.load("replay", groups=False).record
        store.commit(BatchCommit(record=record, segments=[encode_segment(segment)]))
        with pytest.raises(CorruptState) as raised:
            restore_engine(Engine.for_window("replay", window, ("s",), integral=(False, True)), store.load("replay"))
        assert all(fragment in str(raised.value) for fragment in fragments), str(raised.value)
    finally:
        store.close()
