"""The compaction rule of state segments (schema step 8, ``streaming.durable.segment_commit``) on
session, sliding and fixed windows, each committed to a store and restored from it after every
batch: the output stays its oracle's; replaying the stored segments from empty state gives exactly
the engine's state, and the engine's record of them (``StoredSize``) is what a replay reads; the
store never holds more operations than twice the state's rows. Sliding and fixed windows turn over
by dropping dead prefixes (``BatchCommit.dropped_segments``), not by rewriting the state as a base;
sessions, evicted by point deletes, still rebase."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from functools import partial
from typing import Any, Callable, Iterator

import pytest

from ematix_dagster.streaming.durable import batch_commit, restore_engine
from ematix_dagster.streaming.kinds.kind_state import StoredSize
from ematix_dagster.streaming.micro_batch import Engine
from state_store.memory import InMemoryStateStore
from state_store.segment_replay import Live, replay
from state_store.segments import decode_segment
from tests.e2e.test_sessions_reopen import INTEGRAL, feed, params, window_of
from tests.e2e.trigger_oracle import Config, TriggerOracle
from tests.streaming.session_oracle import Oracle, canon
from tests.streaming.sliding_oracle import INTEGRAL as SLIDING_INTEGRAL
from tests.streaming.sliding_oracle import Harness, Params
from tests.streaming.sliding_oracle import Oracle as SlidingOracle
from tests.streaming.test_emission_oracle import engine_for, engine_rows, oracle_rows, spark_input


@pytest.fixture
def store() -> Iterator[InMemoryStateStore]:
    store = InMemoryStateStore(f"compaction-{uuid.uuid4().hex[:8]}")
    store.open()
    yield store
    store.close()
    InMemoryStateStore.forget(store.name)


def committed_and_restored(store: InMemoryStateStore, name: str, engine: Engine, fresh: Callable[[], Engine],
                           seen: Counter[str]) -> Engine:
    """Commit ``engine``'s batch, check what the store holds against the engine's state, and return
    a ``fresh()`` engine restored from the store (``engine`` is spent: its whole state was taken)."""
    commit = batch_commit(engine, name)
    store.commit(commit)
    seen["rebases"] += commit.rebase
    seen["dropped"] += commit.dropped_segments
    seen["commits"] += 1
    recovered = store.load(name)
    stored: Live = {}
    sizes = replay(stored, recovered.segments, name)
    assert engine.state.stored_size.segments == list(sizes.segments)  # the rule's bookkeeping is the store's
    rows = engine.state.state_rows
    assert sum(s.ops for s in sizes.segments) <= 2 * rows, "the store holds at most twice the state"
    if commit.rebase:  # one base of the whole state, nothing before it
        assert len(recovered.segments) == 1 and decode_segment(recovered.segments[0], name).base
        assert sizes.segments[0].ops == rows
    again = batch_commit(engine, name)  # nothing changed: nothing to append, drop or rebase
    assert (again.segments, again.rebase, again.dropped_segments) == ([], False, 0)
    engine.state.stored_size = StoredSize(from_rows=True)  # the next commit writes the whole state as a base
    whole: Live = {}
    replay(whole, batch_commit(engine, name).segments, name)
    assert stored == whole, "replaying the stored segments from empty state gives the engine's state"
    restored = fresh()
    restore_engine(restored, recovered)
    return restored


def _session_batches(seed: int, n: int) -> list[list[tuple]]:
    """Rows (key, seconds, v) moving forward in time with some late ones, a few keys active at once."""
    rng, out, now = random.Random(seed), [], 0
    for _ in range(n):
        now += rng.choice([3, 8, 20, 60])
        rows = [(rng.choice("abcdefgh"), max(0, now - rng.choice([0, 0, 0, 5, 30, 200])), rng.randint(-5, 9))
                for _ in range(rng.randint(1, 12))]
        out.append(rows)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_sessions_compact_and_the_restored_engine_continues_exactly(store, seed):
    batches = _session_batches(seed, 40)
    oracle, rng, name, seen = Oracle(params()), random.Random(seed), f"sessions-{seed}", Counter[str]()

    def fresh() -> Engine:
        return Engine.for_window(name, window_of(), ("a",), INTEGRAL)

    engine = fresh()
    for batch_id, rows in enumerate(batches):
        plain, result = feed(engine, batch_id, rows, rng)
        assert (canon([r for r in result.rows if r.kind == "retract"]),
                canon([r for r in result.rows if r.kind != "retract"])) == oracle.batch(plain), (seed, batch_id)
        engine = committed_and_restored(store, name, engine, fresh, seen)
    assert 0 < seen["rebases"] < len(batches), f"both deltas and rebases were written: {seen}"


class _StoredSliding(Harness):
    """The sliding harness with its simulated store replaced by a real one, restored from after every batch."""

    def __init__(self, p: Params, seed: int, store: InMemoryStateStore, seen: Counter[str]) -> None:
        super().__init__(p, seed)
        self.real, self.seen = store, seen

    def commit(self) -> None:
        self.engine = committed_and_restored(
            self.real, "p", self.engine,
            lambda: Engine.for_window("p", self.p.window(), sources=("s",), integral=self.p.pick(SLIDING_INTEGRAL)),
            self.seen)


def _sliding_batches(rng: random.Random, n: int) -> Iterator[list[tuple]]:
    """``n`` batches of rows (key, event time µs, v) over 30 keys, a 10 ms window spanning a few
    batches, some rows up to 3 ms late."""
    t = 0
    for _ in range(n):
        rows = []
        for _ in range(rng.randint(20, 40)):
            t += rng.randint(0, 200)
            late = rng.choice([0, 0, rng.randint(0, 3_000)])
            rows.append(((f"k{rng.randrange(30)}",), max(0, t - late) // 100 * 100, rng.randint(-5, 9)))
        yield rows


@pytest.mark.parametrize("policy", ["drop", "reopen"])
@pytest.mark.parametrize("seed", range(3))
def test_sliding_windows_drop_dead_prefixes_instead_of_rebasing(store, seed, policy):
    rng, seen = random.Random(seed), Counter[str]()
    p = Params(duration_ms=10, lateness_ms=rng.choice([0, 3]), policy=policy, allowed_ms=15 if policy == "reopen" else 0)
    oracle, harness = SlidingOracle(p), _StoredSliding(p, seed, store, seen)
    for i, rows in enumerate(_sliding_batches(rng, 60)):
        assert harness.batch(rows) == oracle.batch(rows), (seed, i)
    assert seen["dropped"] > seen["commits"] // 2 and seen["rebases"] == 0, seen


def _fixed_batches(rng: random.Random, n: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """``n`` batches (batch time µs, rows) over 100 keys, each 5 to 15 s of event time after the one
    before (a 20 s window spans a few), some rows late."""
    t = 0
    for i in range(n):
        t += rng.choice([5, 10, 15])
        rows = [{"_event_ts": max(0, t - rng.choice([0, 0, 1, 3, 8])) * 1_000_000, "k": f"k{rng.randrange(100)}",
                 "v": rng.randint(-3, 9)} for _ in range(rng.randint(30, 60))]
        yield (1_000 + i) * 1_000_000, rows


@pytest.mark.parametrize("kind,hop_ms,most_rebases", [("tumbling", None, 3), ("hopping", 10_000, 45)])
@pytest.mark.parametrize("policy", ["drop", "reopen"])
def test_fixed_windows_drop_dead_prefixes_instead_of_rebasing(store, kind, hop_ms, most_rebases, policy):
    """Tumbling windows turn over by drops alone; a hopping window takes upserts of its groups in
    every batch it spans, which only a rebase removes (measured: 76 to 92 of these 180 commits
    rebased by the former rule, which weighed the deltas against the last base)."""
    seen = Counter[str]()
    for seed in range(3):
        rng = random.Random(seed)
        cfg = Config(kind=kind, duration_ms=20_000, hop_ms=hop_ms, lateness_ms=rng.choice([0, 5_000]),
                     late_data=policy, allowed_lateness_ms=10_000 if policy == "reopen" else 0)
        engine, oracle, name = engine_for(cfg), TriggerOracle(cfg), f"fixed-{seed}"
        for batch_id, (time_us, rows) in enumerate(_fixed_batches(rng, 60)):
            got = engine_rows(engine.process(spark_input(engine, cfg, batch_id, time_us, rows)))
            assert got == oracle_rows(oracle.batch(time_us, rows)), (cfg, batch_id)
            engine = committed_and_restored(store, name, engine, partial(engine_for, cfg), seen)
    assert seen["dropped"] > seen["commits"] // 3 and seen["rebases"] <= most_rebases, seen
