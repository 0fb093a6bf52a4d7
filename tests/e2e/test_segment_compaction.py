"""The compaction rule of state segments (schema step 8, ``streaming.durable.segment_commit``), on
session windows restored from the store after every batch: the output stays the session oracle's,
the first stored segment is always a base, and the deltas after it never hold more operations than
it (so the store holds, and a restore reads, at most about twice the state)."""

from __future__ import annotations

import random
import uuid

from ematix_dagster.streaming.durable import batch_commit, restore_engine
from ematix_dagster.streaming.micro_batch import Engine
from state_store.memory import InMemoryStateStore
from state_store.segments import decode_segment
from tests.e2e.test_sessions_reopen import INTEGRAL, feed, params, window_of
from tests.streaming.session_oracle import Oracle, canon


def _batches(seed: int, n: int) -> list[list[tuple]]:
    """Rows (key, seconds, v) moving forward in time with some late ones, a few keys active at once."""
    rng, out, now = random.Random(seed), [], 0
    for _ in range(n):
        now += rng.choice([3, 8, 20, 60])
        rows = [(rng.choice("abcdefgh"), max(0, now - rng.choice([0, 0, 0, 5, 30, 200])), rng.randint(-5, 9))
                for _ in range(rng.randint(1, 12))]
        out.append(rows)
    return out


def test_segments_compact_and_the_restored_engine_continues_exactly():
    store = InMemoryStateStore(f"compaction-{uuid.uuid4().hex[:8]}")
    store.open()
    try:
        for seed in range(3):
            batches = _batches(seed, 40)
            oracle = Oracle(params())
            rng = random.Random(seed)
            name = f"compaction-{seed}"
            engine = Engine.for_window(name, window_of(), ("a",), INTEGRAL)
            rebases = 0
            for batch_id, rows in enumerate(batches):
                plain, result = feed(engine, batch_id, rows, rng)
                want = oracle.batch(plain)
                assert (canon([r for r in result.rows if r.kind == "retract"]),
                        canon([r for r in result.rows if r.kind != "retract"])) == want, (seed, batch_id)
                commit = batch_commit(engine, name)
                rebases += commit.rebase
                store.commit(commit)
                recovered = store.load(name)
                segments = [decode_segment(blob, "test") for blob in recovered.segments]
                assert segments and segments[0].base and not any(s.base for s in segments[1:])
                assert sum(map(len, segments[1:])) <= len(segments[0]), (seed, batch_id)
                if commit.rebase:  # one base of the whole state, nothing before it
                    assert len(segments) == 1 and len(segments[0]) == engine.state.state_rows
                engine = Engine.for_window(name, window_of(), ("a",), INTEGRAL)
                restore_engine(engine, recovered)
            assert 1 < rebases < len(batches), "both deltas and rebases were written"
    finally:
        store.close()
        InMemoryStateStore.forget(store.name)
