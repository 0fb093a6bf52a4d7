"""``segment_replay.dead_prefix`` on hand-made segment facts, and against replay itself: dropping
the prefix it names leaves exactly the live rows that replaying every segment leaves."""

from __future__ import annotations

import random

import pytest

from state_store import codec
from state_store.segment_replay import SegmentFacts, dead_prefix, replay
from state_store.segments import Segment, encode_segment

F = SegmentFacts


def test_nothing_is_dead_without_a_later_range_delete():
    assert dead_prefix([F(3, 10, None), F(2, 12, None)], F(1, 13, None)) == 0
    assert dead_prefix([F(3, 10, None), F(2, 12, 8)]) == 0  # a segment's own bound removes only what came before it
    assert dead_prefix([], F(1, 5, 99)) == 0 and dead_prefix([]) == 0


def test_segments_below_a_later_bound_or_without_upserts_are_dead():
    assert dead_prefix([F(3, 10, None), F(2, 12, None)], F(1, 20, 13)) == 2  # the new segment's bound
    assert dead_prefix([F(3, 10, None), F(2, 12, None), F(1, 30, 11)]) == 1  # a stored later bound
    assert dead_prefix([F(1, None, 5), F(1, None, None), F(3, 40, None)]) == 2  # deletes only: nothing to keep
    assert dead_prefix([F(3, 10, None), F(1, None, None), F(2, 12, None)], F(1, 30, 11)) == 2
    assert dead_prefix([F(3, 10, None), F(2, 50, None), F(2, 12, None)], F(1, 60, 20)) == 1  # a prefix only


def test_the_bound_is_exclusive():
    """A row at the bound's own start stays live, so a segment whose largest start is the bound is not dead."""
    assert dead_prefix([F(3, 10, None)], F(1, 20, 10)) == 0
    assert dead_prefix([F(3, 10, None)], F(1, 20, 11)) == 1
    assert dead_prefix([F(3, 10, None), F(1, 12, 10), F(1, 14, None)]) == 0


def test_the_largest_later_bound_counts_not_the_last():
    assert dead_prefix([F(3, 10, None), F(1, 30, 25), F(1, 31, 5)]) == 1


def _segment(rng: random.Random, now: int) -> Segment:
    """Upserts near ``now`` (some late), a point delete now and then, a range delete behind ``now`` often."""
    at = {(max(0, now - rng.choice([0, 0, 1, 4, 9])), codec.encode_key((rng.choice("abc"),))) for _ in range(rng.randrange(4))}
    starts = [s for s, _ in at]
    return Segment(starts=starts, ends=[s + 5 for s in starts], keys=[k for _, k in at], emitted=[None] * len(at),
                   written=[None] * len(at), accs=[[rng.randrange(9) for _ in at]],
                   deletes=[(now - 2, codec.encode_key(("a",)))] if rng.random() < 0.2 else [],
                   deleted_before=now - rng.randrange(2, 6) if rng.random() < 0.6 else None)


@pytest.mark.parametrize("seed", range(20))
def test_replaying_the_kept_suffix_leaves_what_replaying_everything_leaves(seed):
    rng = random.Random(seed)
    blobs, now, dropped_some = [], 0, False
    for _ in range(30):
        now += rng.randrange(3)
        blobs.append(encode_segment(_segment(rng, now)))
        everything: dict = {}
        facts = replay(everything, blobs, "here").segments
        dead = dead_prefix(facts[:-1], facts[-1])
        kept: dict = {}
        replay(kept, blobs[dead:], "here")
        assert kept == everything, (seed, dead)
        dropped_some |= dead > 0
        blobs = blobs[dead:]
    assert dropped_some
