"""A pipeline's stored segments replayed over its state rows, as the rows they stand for.

Readers of a loaded state (the engine's restore, ``ematix-dagster check`` and ``state``, the
Dagster checks) all read ``RecoveredState.groups``, ``emitted`` and ``written``: the replay hands
them exactly the rows a store of schema 7 would hold for the same state (one ``codec.encode_state``
blob per group, the flags and written rows beside them), so the checks of a restore, the window-end
check and every count stay one code path for rows and segments.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import repeat

from state_store.base import RecoveredState
from state_store.codec import encode_state
from state_store.segments import Segment, decode_segment


@dataclass(frozen=True)
class SegmentSizes:
    """Operations stored in the base segment and in the deltas after it (the compaction rule's
    inputs), and whether state rows were loaded with them."""

    base: int = 0
    deltas: int = 0
    rows: int = 0


def replayed(recovered: RecoveredState, where: str) -> tuple[RecoveredState, SegmentSizes]:
    """``recovered`` with its segments applied in order over its rows (``where`` names the pipeline
    and store in errors; a segment's seq is added), and what the store holds."""
    rows = len(recovered.groups)
    if not recovered.segments:
        return recovered, SegmentSizes(rows=rows)
    groups = {(start, key): (end, blob) for start, end, key, blob in recovered.groups}
    emitted, written = dict(recovered.emitted), dict(recovered.written)
    sizes = [0, 0]
    for seq, blob in enumerate(recovered.segments):
        segment = decode_segment(blob, f"{where}, state segment {seq}")
        sizes[0 if seq == 0 and segment.base else 1] += len(segment)
        _apply(segment, groups, emitted, written)
    out = replace(recovered, groups=[(start, end, key, blob) for (start, key), (end, blob) in groups.items()],
                  emitted=emitted, written=written)
    return out, SegmentSizes(base=sizes[0], deltas=sizes[1], rows=rows)


def _apply(segment: Segment, groups: dict, emitted: dict, written: dict) -> None:
    """One segment's deletes, then its upserts (an upsert without a flag or a written row stores none,
    as a row's upsert does)."""
    if segment.deleted_before is not None:
        bound = segment.deleted_before
        for gone in [k for k in groups if k[0] < bound]:
            del groups[gone]
            emitted.pop(gone, None)
            written.pop(gone, None)
    for gone in segment.deletes:
        groups.pop(gone, None)
        emitted.pop(gone, None)
        written.pop(gone, None)
    at = list(zip(segment.starts, segment.keys))
    accs = list(map(list, zip(*segment.accs))) if segment.accs else [[] for _ in at]
    groups.update(zip(at, zip(segment.ends, map(encode_state, accs))))
    flags = repeat(None) if segment.emitted is None else segment.emitted
    for at_row, flag, kept in zip(at, flags, repeat(None) if segment.written is None else segment.written):
        if flag is None:
            emitted.pop(at_row, None)
        else:
            emitted[at_row] = flag
        if kept is None:
            written.pop(at_row, None)
        else:
            written[at_row] = kept


__all__ = ["SegmentSizes", "replayed"]
