"""Engine state <-> the state store's commit and recovery objects.

A restart is only a continuation if what a batch commits and what a restore reads back are exact
inverses. Both directions live here, free of Spark and of any store connection, so the runner and
the replay tests use one mapping instead of two copies that could drift apart.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Callable, Iterable, Protocol, Sequence

import pyarrow as pa

from ematix_dagster.streaming.emitted import GroupKey
from ematix_dagster.streaming.kinds import WindowKind
from ematix_dagster.streaming.kinds.kind_state import (
    ColumnChanges,
    KindState,
    StoredColumns,
    StoredGroup,
    StoredSize,
    WrittenRow,
)
from ematix_dagster.streaming.micro_batch import Engine
from ematix_dagster.streaming.watermark import Watermarks
from state_store.codec import (
    STATE_VERSION,
    decode_key,
    decode_keys,
    decode_state,
    encode_key,
    encode_keys,
    encode_state,
    encoded_key_array,
)
from state_store.contract import BatchCommit, PipelineRecord, RecoveredState, SourceProgress
from state_store.errors import RESTORE_OR_RESET, CorruptState
from state_store.loaded_groups import decode_groups, gc_paused
from state_store.segment_replay import Live, SegmentFacts, SegmentSizes, dead_prefix, replay, replayed
from state_store.segments import Segment, encode_segment


@dataclass(frozen=True)
class Provenance:
    """What produced the state, recorded beside it so a later start can refuse a mismatch."""

    query_id: str | None = None
    fingerprint: str | None = None
    fingerprint_doc: dict[str, Any] = field(default_factory=dict)


class Progress(Protocol):
    """Where a pipeline's driver stands, whatever its shape: what every committed record holds."""

    watermarks: Watermarks
    counters: Counter[str]
    last_batch_id: int | None


def pipeline_record(progress: Progress, pipeline: str, provenance: Provenance = Provenance(),
                    offsets: dict[str, str] | None = None, trigger_fired_at: int | None = None) -> PipelineRecord:
    """The record a batch commits: the one mapping from a driver's progress to the store's row."""
    marks = progress.watermarks
    return PipelineRecord(
        pipeline=pipeline, state_version=STATE_VERSION, query_id=provenance.query_id,
        last_batch_id=progress.last_batch_id, fingerprint=provenance.fingerprint,
        fingerprint_doc=provenance.fingerprint_doc, watermark=marks.global_wm,
        sources={n: SourceProgress(c.max_event_ts, c.last_arrival) for n, c in marks.clocks.items()},
        counters=dict(progress.counters), offsets=dict(offsets or {}), trigger_fired_at=trigger_fired_at,
    )


def restore_progress(progress: Progress, record: PipelineRecord) -> None:
    """The inverse of :func:`pipeline_record` for the parts every shape keeps."""
    progress.last_batch_id = record.last_batch_id
    progress.watermarks.restore(record.watermark, _sources(record))
    progress.counters.update(record.counters)


def _sources(record: PipelineRecord) -> dict[str, tuple[int | None, int | None]]:
    return {n: (p.max_event_ts, p.last_arrival) for n, p in record.sources.items()}


def batch_commit(engine: Engine, pipeline: str, provenance: Provenance = Provenance(),
                 offsets: dict[str, str] | None = None,
                 in_transaction: Sequence[Callable[[Any], None]] = ()) -> BatchCommit:
    """The store transaction for everything the engine changed since the last commit.

    Takes the engine's pending changes, so call it once per commit.
    """
    state = engine.state
    record = pipeline_record(engine, pipeline, provenance, offsets, engine.clock.fired_at_us)
    segments, rebase, dropped = segment_commit(state)
    return BatchCommit(record=record, in_transaction=list(in_transaction), segments=segments, rebase=rebase,
                       dropped_segments=dropped)


def segment_commit(state: KindState) -> tuple[list[bytes], bool, int]:
    """(segments, rebase, dropped_segments) of a state held as columns: its changes as one delta
    segment appended after dropping the stored prefix it makes dead, or the whole state as one base
    segment replacing everything stored (``BatchCommit.rebase``).

    The rule (docs/decisions.md, "Compaction:"): drop the longest stored prefix that
    ``dead_prefix`` finds dead once this delta is stored, so that windows closed by a range delete
    (fixed and sliding ones) leave the store by themselves, not through a rewrite of the whole
    state; then rebase only when what stays stored and this delta would hold more operations than
    twice the state's rows (dead rows no prefix drop reaches: sessions, evicted by point deletes),
    so the store holds, and a restore reads, at most about twice the state; and always on the first
    commit after a restore from rows of schema 7, which replaces them (the migration from rows, in
    one transaction).
    """
    changes = state.take_column_changes()
    size = state.stored_size
    new = _facts(changes) if len(changes) else None
    dropped = dead_prefix(size.segments, new)
    kept = size.segments[dropped:]
    if size.from_rows or sum(stored.ops for stored in kept) + len(changes) > 2 * state.state_rows:
        whole = state.take_column_changes(everything=True)
        state.stored_size = StoredSize([_facts(whole)])
        return [_segment(state, whole, base=True)], True, 0
    if new is None:
        size.segments = kept
        return [], False, dropped
    size.segments = [*kept, new]
    return [_segment(state, changes, base=False)], False, dropped


def _facts(changes: ColumnChanges) -> SegmentFacts:
    starts = changes.starts
    return SegmentFacts(len(changes), int(starts.max()) if len(starts) else None, changes.deleted_before)


def _segment(state: KindState, changes: ColumnChanges, base: bool) -> bytes:
    keys = encoded_key_array(changes.keys)
    if changes.key_rows is not None:  # each key encoded once, repeated by Arrow
        keys = keys.take(pa.array(changes.key_rows))
    written: list[bytes | None] | None = None
    if state.keeps_written:  # the written row travels with its group (schema step 6)
        held = state.written
        written = []
        for start, key in zip(changes.starts.tolist(), changes.row_keys()):
            by_key = held.get(start)
            row = by_key.get(key) if by_key is not None else None
            written.append(None if row is None else encode_state([row[0], *row[1]]))
    return encode_segment(Segment(
        base=base, starts=changes.starts, ends=changes.ends, keys=keys, emitted=changes.emitted, written=written,
        accs=changes.accs, deletes=list(zip([start for start, _ in changes.deletes], encode_keys([key for _, key in changes.deletes]))),
        deleted_before=changes.deleted_before))


def decoded_written(recovered: RecoveredState) -> dict[int, dict[GroupKey, WrittenRow]]:
    """The stored written rows in the shape ``StateBase.written`` holds them."""
    out: dict[int, dict[GroupKey, WrittenRow]] = {}
    for (start, encoded), blob in recovered.written.items():
        out.setdefault(start, {})[decode_key(encoded)] = _written_row(blob)
    return out


def _written_row(blob: bytes) -> WrittenRow:
    end, *values = decode_state(blob)
    return end, tuple(values)




def restore_engine(engine: Engine, recovered: RecoveredState, store: str | None = None) -> PipelineRecord | None:
    """Continue ``engine`` from what a store loaded; returns the record (None: nothing committed yet).

    ``store`` names the store in the messages of state that does not decode or fit. The groups
    reach the engine as columns (``StoredColumns``): segments are columns already, and an object
    per group on the way was most of a large restore's time.
    """
    if recovered.record is None:
        return None
    with gc_paused():  # millions of small containers, none in a cycle: all gone again when it ends
        sizes = _restore(engine, recovered, recovered.record, store)
    engine.state.stored_size = StoredSize(list(sizes.segments), from_rows=sizes.rows > 0)
    return recovered.record


def _restore(engine: Engine, recovered: RecoveredState, record: PipelineRecord, store: str | None) -> SegmentSizes:
    state, where = engine.state, _where(engine.state.pipeline, store)
    if recovered.segments and not recovered.groups:  # segments alone: replayed decoded, no blob per group
        live: Live = {}
        sizes = replay(live, recovered.segments, where)
        groups, written = _live_columns(where, live)
        check_window_ends(state.pipeline, state.kind, zip(groups.starts, groups.ends, repeat(None), repeat(None)),
                          store)
    else:
        recovered, sizes = replayed(recovered, where)
        check_window_ends(state.pipeline, state.kind, recovered.groups, store)
        groups = StoredColumns.from_rows(decoded_groups(state.pipeline, recovered, store,
                                                        ends_stored=state.kind.ends_stored))
        written = decoded_written(recovered)
    engine.restore(record.last_batch_id, record.watermark, _sources(record), record.counters, groups, store=store,
                   written=written, trigger_fired_at_us=record.trigger_fired_at)
    return sizes


def _live_columns(where: str, live: Live) -> tuple[StoredColumns, dict[int, dict[GroupKey, WrittenRow]]]:
    """Replayed segments (``state_store.segment_replay.replay``) in the shapes ``Engine.restore``
    takes. Each key is decoded once: where keys repeat (a key in several windows) through a dict
    of the distinct ones, which costs more than it saves when none does."""
    if not live:
        return StoredColumns([], [], [], []), {}
    starts, encoded = zip(*live)
    ends, accs, flags, blobs = zip(*live.values())
    written: dict[int, dict[GroupKey, WrittenRow]] = {}
    try:
        distinct = set(encoded)
        if len(distinct) == len(encoded):
            keys = decode_keys(encoded)
        else:
            decoded = dict(zip(distinct, decode_keys(list(distinct))))
            keys = list(map(decoded.__getitem__, encoded))
        if blobs.count(None) < len(blobs):
            for start, key, blob in zip(starts, keys, blobs):
                if blob is not None:
                    written.setdefault(start, {})[key] = _written_row(blob)
    except CorruptState as exc:
        raise CorruptState(f"{where}: {exc}") from None
    return StoredColumns.of(starts, ends, keys, accs, flags), written


def decoded_groups(pipeline: str, recovered: RecoveredState, store: str | None = None,
                   ends_stored: bool = False) -> list[StoredGroup]:
    """The loaded groups as rows (what ``check_groups`` vets; a restore makes them columns once);
    with ``ends_stored`` (a kind whose start names no end) each group's stored end and emitted flag
    (None: not stored) come along."""
    windows = decode_groups(pipeline, recovered.groups, store)
    if not ends_stored:
        return [StoredGroup(start, None, key, accs) for start, by_key in windows.items() for key, accs in by_key.items()]
    ends = {(start, key): end for start, end, key, _ in recovered.groups}
    flags = recovered.emitted
    out = []
    for start, by_key in windows.items():
        for key, accs in by_key.items():
            encoded = encode_key(key)
            out.append(StoredGroup(start, ends[(start, encoded)], key, accs, flags.get((start, encoded))))
    return out


def check_window_ends(pipeline: str, kind: WindowKind, groups: Iterable[tuple[int, int | None, Any, Any]],
                      store: str | None = None) -> None:
    """Every stored window end is one the engine's window kind allows for its start.

    A mismatch means the state was written for other windows (the spec's fingerprint catches a
    changed spec first) or the store's ``window_end`` was filled wrongly; continuing would emit
    rows with the wrong bounds. A None end (an old row with no recorded duration) is the kind's.
    """
    checked: set[tuple[int, int]] = set()
    for start, end, _key, _blob in groups:
        if end is None or (start, end) in checked:
            continue
        if not kind.valid_end(start, end):
            raise CorruptState(f"{_where(pipeline, store)}: window {start} is stored with end {end}, but its window kind gives "
                               f"{kind.end_rule(start)}", way_out=RESTORE_OR_RESET)
        checked.add((start, end))


def _where(pipeline: str, store: str | None) -> str:
    return f"pipeline {pipeline!r}" + (f" in {store}" if store else "")
