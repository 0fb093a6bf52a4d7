"""A pipeline's stored segments replayed over its state rows.

:func:`replay` applies segments in order to a live map ``(window_start, key bytes) -> (window end,
accumulators, emitted flag, written row)``, the accumulators in whatever form the caller asks for:
the engine's restore takes them decoded (no blob per group on the way), and :func:`replayed` takes
them as ``codec.encode_state`` blobs, handing the readers of ``RecoveredState.groups`` (``ematix-dagster
check`` and ``state``, the Dagster checks, a restore that also loaded rows of schema 7) exactly the
rows a store of schema 7 would hold for the same state, so their checks and counts stay one code
path for rows and segments.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence, cast

from state_store.codec import encode_state
from state_store.contract import RecoveredState
from state_store.segments import Segment, decode_segment

#: (window_start, key bytes) -> (window end, accumulators, emitted flag or None, written row or None)
Live = dict[tuple[int, bytes], tuple[int | None, Any, bool | None, bytes | None]]


class SegmentFacts(NamedTuple):
    """What the compaction rule (``streaming.durable.segment_commit``) needs to know of one stored
    segment without reading it again: its operations (``len(segment)``), the largest window start
    it upserts (None: it upserts nothing) and its range delete's bound."""

    ops: int
    max_start: int | None
    deleted_before: int | None


@dataclass(frozen=True)
class SegmentSizes:
    """The facts of each stored segment in order (the compaction rule's inputs), and how many state
    rows were loaded with them."""

    segments: tuple[SegmentFacts, ...] = ()
    rows: int = 0


def dead_prefix(stored: Sequence[SegmentFacts], new: SegmentFacts | None = None) -> int:
    """How many of the oldest ``stored`` segments a replay no longer needs once ``new`` (a segment
    about to be appended after them; None: none) is stored too: the longest prefix in which each
    segment upserts nothing, or only starts below the largest range-delete bound of a segment after
    it.

    Why dropping them changes nothing: a segment's range delete and point deletes only remove rows
    that segments before it upserted (within a segment they apply before its upserts), and an
    upsert replaces a whole row. Each upsert of a dead segment is followed by a range delete that
    removes it (the bound is exclusive: a row at ``start == bound`` stays, so such a segment is not
    dead), and nothing after that range delete can see it again; the deletes of a dead segment only
    remove rows of segments before it, all dropped too since they are a prefix. So replaying the
    kept suffix from empty state leaves exactly the live rows that replaying everything leaves.
    """
    facts = [*stored, new] if new is not None else list(stored)
    bounds_after: list[int | None] = [None] * len(facts)  # the largest bound of the segments after i
    bound: int | None = None
    for i in range(len(facts) - 1, -1, -1):
        bounds_after[i] = bound
        own = facts[i].deleted_before
        if own is not None and (bound is None or own > bound):
            bound = own
    dead = 0
    for segment, after in zip(stored, bounds_after):
        if segment.max_start is not None and (after is None or segment.max_start >= after):
            break
        dead += 1
    return dead


def accumulator_rows(segment: Segment) -> Iterable[tuple]:
    """A segment's upserts' accumulators, one tuple per row."""
    return zip(*segment.accs) if segment.accs else (() for _ in segment.keys)


class _Starts:
    """The distinct window starts of a live map in a min-heap, each with its keys, so that a range
    delete pops the starts below its bound rather than walking every live entry: fixed windows commit
    one in nearly every delta, and a restore over many small deltas would otherwise be quadratic in
    the state. Invariant: ``keys[start]`` is the set of keys live at ``start`` (possibly empty), and
    ``heap`` holds each start of ``keys`` once."""

    def __init__(self, live: Live) -> None:
        self.keys: dict[int, set[bytes]] = {}
        for start, key in live:
            self.keys.setdefault(start, set()).add(key)
        self.heap = list(self.keys)
        heapq.heapify(self.heap)

    def add(self, at: Iterable[tuple[int, bytes]]) -> None:
        for start, key in at:
            keys = self.keys.get(start)
            if keys is None:
                self.keys[start] = keys = set()
                heapq.heappush(self.heap, start)
            keys.add(key)

    def discard(self, start: int, key: bytes) -> None:
        keys = self.keys.get(start)
        if keys is not None:  # an emptied start stays until a range delete pops it, not searched for now
            keys.discard(key)

    def pop_before(self, bound: int) -> Iterator[tuple[int, bytes]]:
        while self.heap and self.heap[0] < bound:
            start = heapq.heappop(self.heap)
            for key in self.keys.pop(start):
                yield start, key


def replay(live: Live, segments: list[bytes], where: str,
           accumulators: Callable[[Segment], Iterable[Any]] = accumulator_rows) -> SegmentSizes:
    """Apply ``segments`` in order to ``live``: each one's range delete and deletes, then its upserts
    (an upsert without a flag or a written row stores none, as a row's upsert does). ``where``
    names the pipeline and store in errors; each segment is named by its place in the load (0: the
    oldest stored, which after a dropped prefix is not seq 0).

    The starts index is built at the first range delete, so a replay without one (a base alone)
    never pays for it; from then on each segment costs what it changes, times a log factor."""
    facts = []
    starts: _Starts | None = None
    for place, blob in enumerate(segments):
        segment = decode_segment(blob, f"{where}, state segment {place}")
        facts.append(SegmentFacts(len(segment), max(segment.starts, default=None), segment.deleted_before))
        if segment.deleted_before is not None:
            if starts is None:
                starts = _Starts(live)
            for gone in starts.pop_before(segment.deleted_before):
                del live[gone]
        for gone in segment.deletes:
            live.pop(gone, None)
            if starts is not None:
                starts.discard(*gone)
        flags, written = cast(list, segment.emitted), cast(list, segment.written)  # decoded: always lists
        upserted = list(zip(segment.starts, segment.keys))
        live.update(zip(upserted, zip(segment.ends, accumulators(segment), flags, written)))
        if starts is not None:
            starts.add(upserted)
    return SegmentSizes(segments=tuple(facts))


def replayed(recovered: RecoveredState, where: str) -> tuple[RecoveredState, SegmentSizes]:
    """``recovered`` with its segments applied over its rows, as rows, and what the store holds."""
    rows = len(recovered.groups)
    if not recovered.segments:
        return recovered, SegmentSizes(rows=rows)
    flag, kept = recovered.emitted.get, recovered.written.get
    live: Live = {(start, key): (end, blob, flag((start, key)), kept((start, key)))
                  for start, end, key, blob in recovered.groups}
    sizes = replay(live, recovered.segments, where, lambda segment: map(encode_state, map(list, accumulator_rows(segment))))
    out = replace(recovered, groups=[(start, end, key, blob) for (start, key), (end, blob, _, _) in live.items()],
                  emitted={at: f for at, (_, _, f, _) in live.items() if f is not None},
                  written={at: w for at, (_, _, _, w) in live.items() if w is not None})
    return out, replace(sizes, rows=rows)


__all__ = ["Live", "SegmentFacts", "SegmentSizes", "accumulator_rows", "dead_prefix", "replay", "replayed"]
