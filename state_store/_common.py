"""Pieces shared by the three stores: version checks on load, record <-> JSON, lease helpers."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, TypeVar

from state_store import codec, whole_window
from state_store.contract import BatchCommit, PipelineRecord, SourceProgress, TakeOver
from state_store.errors import RESTORE_OR_RESET, CorruptState, LeaseHeld, LeaseLost, StateVersionError
from state_store.names import PIPELINES_TABLE
from state_store.pending import check_pending


def where(pipeline: str | None, store: str) -> str:
    return f"pipeline {pipeline!r} in {store}" if pipeline else store


def check_record_version(record: PipelineRecord, store: str) -> None:
    if record.state_version is not None and record.state_version > codec.STATE_VERSION:
        raise StateVersionError(
            f"{where(record.pipeline, store)}: state version {record.state_version} is newer than this code "
            f"({codec.STATE_VERSION}); upgrade ematix-dagster")


def bring_forward(pipeline: str, store: str, rows: list[tuple[int, int | None, bytes, bytes]]
                  ) -> tuple[list[tuple[int, int | None, bytes, bytes]], int]:
    """Check every blob's version byte; migrate older blobs in memory (the rows are not rewritten).

    ``rows`` are ``(window_start, window_end, key, blob)``. A blob whose version byte is not a
    state version raises ``CorruptState``, a newer one ``StateVersionError``, both naming the
    pipeline, the window and the store. Bodies of current-version blobs are decoded later by the
    caller (``loaded_groups.decode_groups``).
    """
    current = codec.STATE_VERSION
    stale = [i for i, row in enumerate(rows) if not row[3] or row[3][0] != current]
    if not stale:
        return rows, 0
    rows = list(rows)
    for i in stale:
        start, end, key, blob = rows[i]
        try:
            version = codec.state_version(blob)
            blob = codec.migrate(bytes(blob), version, current)
        except (CorruptState, StateVersionError) as exc:
            raise type(exc)(f"{where(pipeline, store)}: window {start}, key {bytes(key).hex()}: {exc}") from None
        rows[i] = (start, end, key, blob)
    return rows, len(stale)


def fill_window_ends(rows: list[tuple[int, int | None, bytes, bytes]], record: PipelineRecord
                     ) -> list[tuple[int, int | None, bytes, bytes]]:
    """Rows stored before schema step 3 whose end the step could not fill: ``start + duration``.

    The duration is the one the state was written with (the record's ``fingerprint_doc``); without
    one the end stays None and the engine takes it from its window kind.
    """
    if all(row[1] is not None for row in rows):
        return rows
    duration_ms = record.fingerprint_doc.get("window.duration_ms")
    if type(duration_ms) is not int:
        return rows
    size = duration_ms * 1_000
    return [(start, start + size if end is None else end, key, blob) for start, end, key, blob in rows]


def sources_to_json(sources: dict[str, SourceProgress]) -> str:
    # an array keeps the source order (jsonb would sort object keys)
    return json.dumps([[name, p.max_event_ts, p.last_arrival] for name, p in sources.items()])


#: The pipelines-table columns a load reads, in the order ``record_from_row`` expects.
PIPELINE_COLUMNS = ("state_version", "query_id", "last_batch_id", "fingerprint", "fingerprint_doc", "watermark",
                    "sources", "counters", "lease_holder", "pending_migration", "trigger_fired_at",
                    "release_watermark", "last_batch_rows", "output_watermark")


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_int_or_none(value: Any) -> bool:
    return value is None or type(value) is int


def _fingerprint_doc_problem(doc: Any) -> str | None:
    return None if isinstance(doc, dict) else "expected a JSON object"


def _sources_problem(items: Any) -> str | None:
    if not isinstance(items, list):
        return "expected a JSON array of [source name, max event time, last arrival]"
    for item in items:
        if (not isinstance(item, list) or len(item) != 3 or not isinstance(item[0], str)
                or not _is_int_or_none(item[1]) or not _is_int_or_none(item[2])):
            return f"entry {item!r:.80} is not [source name, max event time or null, last arrival or null]"
    return None


def _counters_problem(counters: Any) -> str | None:
    if not isinstance(counters, dict):
        return "expected a JSON object of counter name -> integer"
    for name, n in counters.items():
        if not _is_int(n):
            return f"counter {name!r:.80} is {n!r:.80}, not an integer"
    return None


def _json_column(pipeline: str, store: str | None, column: str, value: Any, default: Any,
                 problem_of: Callable[[Any], str | None]) -> Any:
    """A JSON column of the pipelines-table row (text in SQLite, jsonb in PostgreSQL), shape-checked."""
    if value is None:
        return default
    problem: str | None
    try:
        doc = json.loads(value) if isinstance(value, (str, bytes, bytearray)) else value
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        problem = f"it is not valid JSON ({exc})"
    else:
        problem = problem_of(doc)
        if problem is None:
            return doc
    text = value if isinstance(value, str) else repr(value)
    raise CorruptState(
        f"{where(pipeline, store or 'the state store')}: column {column!r} of the pipelines table "
        f"({PIPELINES_TABLE}) is corrupt: {problem}; it holds {text[:120]!r}{'...' if len(text) > 120 else ''}",
        way_out=RESTORE_OR_RESET)


def _int_column(pipeline: str, store: str | None, column: str, value: Any) -> int | None:
    """An integer column of the pipelines-table row: an int or NULL, anything else is ``CorruptState``."""
    if _is_int_or_none(value):
        return value
    raise CorruptState(
        f"{where(pipeline, store or 'the state store')}: column {column!r} of the pipelines table "
        f"({PIPELINES_TABLE}) is corrupt: expected an integer or NULL; it holds {value!r:.120}",
        way_out=RESTORE_OR_RESET)


def record_from_row(pipeline: str, row: tuple, offsets: dict[str, str], store: str | None = None) -> PipelineRecord:
    """The pipelines-table row (in ``PIPELINE_COLUMNS`` order) as a record; JSON as text or jsonb.

    A JSON column that does not parse, or parses to another shape, and a ``trigger_fired_at`` that
    is not an integer or NULL, raise ``CorruptState`` naming the pipeline, ``store`` (the store's
    description) and the column.
    """
    record = PipelineRecord(
        pipeline=pipeline, state_version=row[0], query_id=row[1], last_batch_id=row[2], fingerprint=row[3],
        fingerprint_doc=_json_column(pipeline, store, "fingerprint_doc", row[4], {}, _fingerprint_doc_problem),
        watermark=row[5],
        sources={name: SourceProgress(max_event_ts=m, last_arrival=a) for name, m, a in
                 _json_column(pipeline, store, "sources", row[6], [], _sources_problem)},
        counters=_json_column(pipeline, store, "counters", row[7], {}, _counters_problem),
        pending_migration=bool(row[9]),
        trigger_fired_at=_int_column(pipeline, store, "trigger_fired_at", row[10]),
        release_watermark=_int_column(pipeline, store, "release_watermark", row[11]),
        last_batch_rows=_int_column(pipeline, store, "last_batch_rows", row[12]),
        output_watermark=_int_column(pipeline, store, "output_watermark", row[13]))
    record.offsets = ordered_offsets(record.sources, offsets)
    return record


def ordered_offsets(record_sources: Iterable[str], offsets: dict[str, str]) -> dict[str, str]:
    """Offsets in the record's source order, then any others by name."""
    out = {name: offsets[name] for name in record_sources if name in offsets}
    for name in sorted(offsets):
        out.setdefault(name, offsets[name])
    return out


def check_batch(batch: BatchCommit) -> None:
    """Types a store relies on (the databases check the same through their column types); the pending
    rows' (schema step 7) with ``state_store.pending.check_pending``."""
    if not isinstance(batch.record, PipelineRecord) or not batch.record.pipeline:
        raise TypeError("BatchCommit.record must be a PipelineRecord with a pipeline name")
    for name in ("trigger_fired_at", "release_watermark", "last_batch_rows"):
        if not _is_int_or_none(getattr(batch.record, name)):
            raise TypeError(f"record.{name} must be an int or None, got {getattr(batch.record, name)!r:.200}")
    if type(batch.rebase) is not bool or set(map(type, batch.segments)) - {bytes} or not all(batch.segments):
        raise TypeError("BatchCommit.segments must be non-empty bytes blobs and rebase a bool")
    if type(batch.dropped_segments) is not int or batch.dropped_segments < 0 or (batch.dropped_segments and batch.rebase):
        raise TypeError("BatchCommit.dropped_segments must be an int >= 0, and 0 with rebase (which deletes every "
                        "segment itself)")
    for name, offset in batch.record.offsets.items():
        if not isinstance(name, str) or not isinstance(offset, str):
            raise TypeError("record.offsets must map source names to offset JSON text")
    if batch.pending_inserts or batch.pending_released or batch.pending_released_up_to is not None \
            or type(batch.pending_inserts) is not list or type(batch.pending_released) is not list:
        check_pending(batch)


def expand_windows(pipeline: str, store: str, rows: list[tuple[int, int | None, bytes, bytes]]
                   ) -> list[tuple[int, int | None, bytes, bytes]]:
    """Stored rows as one per group: a whole-window row (``whole_window.WINDOW_KEY``) becomes its groups,
    except those that have a row of their own (a later batch changed them one by one)."""
    whole = [row for row in rows if not row[2]]
    if not whole:
        return rows
    out = [row for row in rows if row[2]]
    own = {(start, key) for start, _, key, _ in out}
    for start, end, _, blob in whole:
        try:
            groups = whole_window.window_groups(blob)
        except CorruptState as exc:
            raise CorruptState(f"{where(pipeline, store)}: window {start}: {exc}", way_out=RESTORE_OR_RESET) from None
        out += [(start, end, key, group) for key, group in groups if (start, key) not in own]
    return out


def bring_forward_stored(pipeline: str, store: str, rows: list[tuple[int, int | None, bytes, bytes]]
                         ) -> tuple[list[tuple[int, int | None, bytes, bytes]], int]:
    """:func:`bring_forward` for rows as stored (the migration job rewrites them in place): a
    whole-window row's groups are brought forward and it stays one row. Returns the rows and how
    many groups were migrated."""
    out, migrated = bring_forward(pipeline, store, [row for row in rows if row[2]])
    for start, end, key, blob in (row for row in rows if not row[2]):
        groups = expand_windows(pipeline, store, [(start, end, key, blob)])
        groups, n = bring_forward(pipeline, store, groups)
        if n:
            blob = whole_window.window_blob(codec.STATE_VERSION, [g[2] for g in groups], [g[3] for g in groups])
        out.append((start, end, key, blob))
        migrated += n
    return out, migrated


def lease_held(pipeline: str, store: str, holder: str | None) -> LeaseHeld:
    text = holder or "another process (holder text not written yet)"
    err = LeaseHeld(
        f"pipeline {pipeline!r} is already running: its lease in {store} is held by {text}; "
        "wait for that run to end or stop it (a crashed holder frees the lease when its process ends)")
    err.pipeline = pipeline
    err.holder = text
    return err


#: a pipeline's stored lease epoch and holder text, as a fence check reads them (None: no pipeline row)
LeaseRow = tuple[int, str | None] | None
Lock = TypeVar("Lock")
_POLL_S = 0.1  # how often a take-over looks whether the fenced holder let go of its lock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSteps(Generic[Lock]):
    """A store's own parts of an acquisition, which :func:`take_lease` puts in order. ``Lock`` is
    what holds the store's lock (a file descriptor, an advisory lock's key)."""

    #: (the lock, None) when this call took it; (None, the holder's text or None) when another holds it
    try_lock: Callable[[], tuple[Lock | None, str | None]]
    unlock: Callable[[Lock], None]
    #: raise the stored epoch by one and write this holder's text beside it, in one transaction: the new epoch
    fence: Callable[[], int]
    #: write this holder's text where the stored epoch is still the one given (and into the lock, if it
    #: holds text): None when it was, else the stored ``LeaseRow`` that moved on
    claim: Callable[[Lock, int], LeaseRow]


def take_lease(pipeline: str, store: str, steps: LeaseSteps[Lock], take_over: TakeOver | None,
               wait_s: float) -> tuple[Lock, int]:
    """The lock and the epoch of a new acquisition, the epoch raised once whichever way it went.

    A free lock is taken, then fenced at the next epoch. A held one is refused with ``LeaseHeld``
    unless ``take_over`` says yes for its holder: then the holder is fenced first and its lock
    awaited for up to ``wait_s`` seconds, since only its own end (a refused commit stops it) frees it.
    """
    lock, other = steps.try_lock()
    epoch: int | None = None
    if lock is None:
        if take_over is None or not take_over(other):
            raise lease_held(pipeline, store, other)
        epoch = steps.fence()
        log.warning("pipeline %r: taking the lease in %s over from %s: fenced at epoch %d, waiting up to %g s "
                    "for it to let go", pipeline, store, other, epoch, wait_s)
        lock = _await_lock(steps, wait_s)
        if lock is None:
            raise _not_let_go(pipeline, store, other, epoch, wait_s)
    try:
        if epoch is None:
            epoch = steps.fence()
        later = steps.claim(lock, epoch)
        if later is not None:  # a second take-over fenced this one while it waited
            raise lease_held(pipeline, store, later[1])
    except BaseException:
        steps.unlock(lock)
        raise
    return lock, epoch


def renew_lease(pipeline: str, store: str, steps: LeaseSteps[Lock], lock: Lock, held: int) -> None:
    """A holder's acquisition again: its text renewed at the epoch it holds, ``LeaseLost`` once that moved on."""
    check_fence(pipeline, store, held, steps.claim(lock, held), "the lease was not renewed")


def _await_lock(steps: LeaseSteps[Lock], wait_s: float) -> Lock | None:
    deadline = time.monotonic() + wait_s
    while True:
        lock = steps.try_lock()[0]
        left = deadline - time.monotonic()
        if lock is not None or left <= 0:
            return lock
        time.sleep(min(_POLL_S, left))


def _not_let_go(pipeline: str, store: str, holder: str | None, epoch: int, wait_s: float) -> LeaseHeld:
    text = holder or "another process (holder text not written yet)"
    err = LeaseHeld(
        f"pipeline {pipeline!r}: its lease in {store} is held by {text}, which this run fenced at epoch {epoch} "
        f"but which did not let go within {wait_s:g} s; that run commits nothing more and frees the lease when it "
        "stops: retry then, or stop its process")
    err.pipeline, err.holder = pipeline, text
    return err


def check_fence(pipeline: str, store: str, held: int | None, stored: LeaseRow, undone: str,
                batch: int | None = None) -> None:
    """Inside a write's transaction: ``LeaseLost`` when the stored epoch moved on from ``held``.

    ``held`` None (the writer holds no lease, it writes under the lock alone) and ``stored`` None
    (no pipeline row yet: nobody fenced anything) pass. ``undone`` says what the refusal leaves
    undone ("batch 7 was not committed"), ``batch`` is the refused batch's id.
    """
    if held is None or stored is None or stored[0] == held:
        return
    taker = stored[1] or "another run"
    err = LeaseLost(f"pipeline {pipeline!r}: the lease in {store} was taken over by {taker} (epoch {stored[0]}, "
                    f"this run held epoch {held}); {undone}: this run stops")
    err.pipeline, err.holder, err.epoch, err.held_epoch, err.batch = pipeline, taker, stored[0], held, batch
    raise err


def not_committed(batch: BatchCommit) -> str:
    batch_id = batch.record.last_batch_id
    return f"batch {batch_id} was not committed" if batch_id is not None else "the batch was not committed"


_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


def file_safe(pipeline: str) -> str:
    """The pipeline name as a file-name part (names outside [A-Za-z0-9_-] get a hash suffix)."""
    if _SAFE.match(pipeline):
        return pipeline
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", pipeline)[:60]
    return f"{clean}-{hashlib.blake2b(pipeline.encode(), digest_size=6).hexdigest()}"
