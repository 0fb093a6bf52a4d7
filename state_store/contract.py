"""The StateStore contract: load a pipeline's state, commit one micro-batch atomically.

A commit carries everything a restart needs (the window state as segments, the batch's source
offsets, the Spark query id and batch id, watermarks, per-source progress, counters, pending rows),
so that after a crash the store is either at batch N or at N-1, never in between. A Postgres store
also runs ``in_transaction`` callbacks inside the same transaction, which is how a Postgres target
and Postgres dead letters become exactly-once (``[target] same_transaction = true``).

Keys and blobs are opaque bytes here; ``state_store.codec`` makes them. Window state is committed
as *segments* (schema step 8): an ordered list of opaque blobs per pipeline (``state_store.segments``
makes and reads them), so a batch that changed 100,000 groups writes one row, not 100,000. A commit
appends ``BatchCommit.segments`` in order, in its transaction; ``BatchCommit.rebase`` first deletes
every stored segment and every state row of the pipeline (the engine's compaction, and its
migration away from rows), and ``BatchCommit.dropped_segments`` the oldest N segments only (the
engine's drop of a prefix that later range deletes made dead). A load returns them in order
(``RecoveredState.segments``), in the snapshot of the record; ``load(groups=False)`` skips them and
``reset`` deletes them.

State rows are what stores of schema 7 and older hold, and what a load still reads: commits never
write one, stores only read them, rewrite their older-version blobs (``migrate_state``) and delete
them (``reset``, a rebase). A row is ``(window_start, window_end, key, blob)``: the window is named
by its bounds (µs, end exclusive as the window kind defines it), so kinds whose end is not ``start +
duration`` (sessions) fit; rows are unique on ``(window_start, key)`` per pipeline (see
``state_store.migrations``, step 3). A load returns them one tuple per group in
``RecoveredState.groups``, before the segments that replay over them:

* A row may carry an ``emitted`` flag (schema step 5): whether a session window was written to the
  target; fixed windows stored NULL, their emission following from their bounds and the watermark.
  ``RecoveredState.emitted`` holds the non-NULL flags by ``(window_start, key)``.
* A row may carry its ``written`` row (schema step 6): the last row written to the target for that
  (window_start, key), an opaque engine blob; ``RecoveredState.written`` holds the non-NULL ones.
* A window may be stored whole, as one row (key ``whole_window.WINDOW_KEY``, its blob holding every
  group, ``state_store.whole_window``); a group's own row overlays its entry. Stores expand such
  rows on ``load``, and they never carry a written row.

The record carries ``trigger_fired_at`` (schema step 6), the batch time (µs) of the interval emit
trigger's last firing (None before any), committed with the batch like the watermark, and
``output_watermark`` (schema step 11), how far the target is complete, which the store computes in
the commit's transaction from the record's watermarks and the pending rows left after the batch.

Schema step 7 adds pending rows (``WATERMARK_TS()``, docs/contract/row-pipelines.md): output rows held back until the
watermark reaches their release time, one :class:`PendingRow` each, keyed by ``(release_us,
arrival_batch, seq)``, the release order. A commit inserts the batch's new ones
(``BatchCommit.pending_inserts``) and deletes the ones it released (``BatchCommit.pending_released``
by key, ``pending_released_up_to`` by release time) in its transaction; the engine reads only the
rows due (``StateStore.load_pending``) and a :class:`PendingSummary` (count, bytes, next release,
smallest event time), never the whole set. Payloads are not public yet: nothing here logs or
prints them.
"""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, NamedTuple

#: ``acquire_lease``'s question before it fences another holder: given that holder's text (None when
#: it wrote none yet), take the lease over?
TakeOver = Callable[[str | None], bool]


@dataclass
class SourceProgress:
    """Per-source watermark inputs, in microseconds."""

    max_event_ts: int | None = None
    last_arrival: int | None = None


@dataclass
class PipelineRecord:
    """The per-pipeline row: where the pipeline is and what produced its state."""

    pipeline: str
    state_version: int
    query_id: str | None = None
    last_batch_id: int | None = None
    fingerprint: str | None = None
    fingerprint_doc: dict[str, Any] = field(default_factory=dict)  # to name what changed
    watermark: int | None = None
    sources: dict[str, SourceProgress] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    offsets: dict[str, str] = field(default_factory=dict)  # source name -> offset JSON of last_batch_id
    pending_migration: bool = False
    trigger_fired_at: int | None = None  # batch time (µs) of the interval emit trigger's last firing
    #: WATERMARK_TS() of the last batch under ``[emit] sql`` (µs): a later batch's never goes below it,
    #: and the end-of-input flush releases nothing by a watermark it raised itself (schema step 9)
    release_watermark: int | None = None
    #: rows the last batch of a windowed pipeline wrote: the end-of-input flush numbers its rows
    #: after them (``_emit_seq``), in this run or a later one (schema step 9)
    last_batch_rows: int | None = None
    #: how far the target is complete (µs; :func:`output_watermark` of :attr:`releasing_watermark` and the
    #: oldest pending row's event time). The store sets it in each commit's transaction, after the batch's
    #: pending rows, so it is the one the committed pending table gives, whatever value the caller passed
    #: (schema step 11)
    output_watermark: int | None = None

    @property
    def releasing_watermark(self) -> int | None:
        """The watermark held rows leave by: ``WATERMARK_TS()`` under ``[emit] sql``, else the pipeline's."""
        return self.release_watermark if self.release_watermark is not None else self.watermark


def output_watermark(watermark: int | None, oldest_held: int | None) -> int | None:
    """How far the output is complete: W, or the oldest held row's event time when earlier (an
    ``[emit]`` row's: its window end); None while W is."""
    if watermark is None or oldest_held is None:
        return watermark
    return min(watermark, oldest_held)


@dataclass
class RecoveredState:
    record: PipelineRecord | None  # None: the pipeline never committed
    #: the stored state rows (schema 7 and older): (window_start, window_end, key, blob); window_end is None only
    #: for a row stored before schema step 3 whose pipeline record names no window duration
    groups: list[tuple[int, int | None, bytes, bytes]] = field(default_factory=list)
    migrated: int = 0  # blobs of an older state version brought forward by this load (not written back)
    #: (window_start, key) -> the stored emitted flag, for the loaded rows whose flag is not NULL (sessions)
    emitted: dict[tuple[int, bytes], bool] = field(default_factory=dict)
    #: (window_start, key) -> the stored last written row (an engine blob), for the loaded rows that keep one
    written: dict[tuple[int, bytes], bytes] = field(default_factory=dict)
    #: the stored segments (schema step 8), in the order they were appended; replayed over ``groups``
    segments: list[bytes] = field(default_factory=list)


class PendingRow(NamedTuple):
    """One row held back by ``WATERMARK_TS()`` until the watermark reaches ``release_us`` (µs).

    Keyed by ``(release_us, arrival_batch, seq)``: ``arrival_batch`` is the batch it arrived in,
    ``seq`` its position in that batch's output (0, 1, ...). ``event_ts`` is its ``_event_ts`` (µs,
    None when it has none), ``payload`` its values, an opaque engine blob. A named tuple, not a
    frozen dataclass: a delayed batch makes one per held and per released row, and a frozen
    dataclass costs several times as much to build.
    """

    release_us: int
    arrival_batch: int
    seq: int
    event_ts: int | None
    payload: bytes

    @property
    def key(self) -> tuple[int, int, int]:
        return self.release_us, self.arrival_batch, self.seq


@dataclass
class PendingSummary:
    """A pipeline's pending rows, without their values (the ``state`` command, the output watermark)."""

    rows: int = 0
    payload_bytes: int = 0
    next_release_us: int | None = None  # the smallest release time, None when nothing is pending
    min_event_ts: int | None = None  # the smallest non-NULL event time, None when there is none


@dataclass
class BatchCommit:
    """One micro-batch's unit of work."""

    record: PipelineRecord  # the new per-pipeline row (last_batch_id = this batch)
    in_transaction: list[Callable[[Any], None]] = field(default_factory=list)  # called with the DB connection
    #: rows this batch holds back (schema step 7); a re-insert of an identical stored row is a no-op
    pending_inserts: list[PendingRow] = field(default_factory=list)
    #: keys (release_us, arrival_batch, seq) of stored pending rows this batch released, deleted with it
    pending_released: list[tuple[int, int, int]] = field(default_factory=list)
    #: every stored pending row with ``release_us <= pending_released_up_to`` is deleted with the batch (a
    #: row pipeline releases all rows due by W: one range delete instead of a key per row); None: none
    pending_released_up_to: int | None = None
    #: blobs appended to the pipeline's segments in this order (schema step 8)
    segments: list[bytes] = field(default_factory=list)
    #: delete every stored segment and state row of the pipeline before anything else of the commit
    rebase: bool = False
    #: delete the pipeline's oldest N stored segments (by seq; all of them if fewer are stored) before
    #: appending ``segments``, in the commit's transaction: the engine's drop of a prefix no replay
    #: needs any more. Refused with ``rebase``, which deletes every segment anyway
    dropped_segments: int = 0


class StateStore(ABC):
    """One store, possibly shared by several pipelines (rows are keyed by pipeline name)."""

    kind: str
    durable: bool = True

    @property
    @abstractmethod
    def description(self) -> str:
        """Human text naming the store, never containing a password."""

    @abstractmethod
    def open(self) -> None:
        """Connect, create tables and apply schema migrations."""

    @abstractmethod
    def acquire_lease(self, pipeline: str, holder: str, take_over: TakeOver | None = None, *,
                      take_over_wait_s: float = 60.0) -> None:
        """Become the pipeline's only writer until ``release_lease``; raise ``LeaseHeld`` naming the holder.

        The lock alone outlives a run that was given up (a SIGKILLed Dagster run worker leaves its
        step process running, lock and all), so each acquisition raises the pipeline's *lease
        epoch* and this object keeps the one it got (``lease_epoch``): every commit, reset and
        migration of the holder checks it in its own transaction and rolls back with ``LeaseLost``
        once it moved on. ``take_over`` decides, given the current holder's text, whether to fence
        that holder instead of refusing: the epoch is raised at once (its next commit is refused,
        so it stops, and its lock goes with its process), then the lock is awaited for up to
        ``take_over_wait_s`` seconds and taken at that epoch; ``LeaseHeld`` when it was not freed
        in time (the holder stays fenced). Acquiring a lease this object holds only renews its text.
        """

    @abstractmethod
    def release_lease(self, pipeline: str) -> None: ...

    @abstractmethod
    def lease_holder(self, pipeline: str) -> str | None:
        """Who holds the lease now (None when free)."""

    @abstractmethod
    def lease_epoch(self, pipeline: str) -> int | None:
        """The epoch this object holds the pipeline's lease at (None when it does not hold it)."""

    @abstractmethod
    def load(self, pipeline: str, groups: bool = True) -> RecoveredState:
        """The pipeline's record and (unless ``groups`` is False: checks, sensors) its window state."""

    @abstractmethod
    def commit(self, batch: BatchCommit) -> None:
        """Apply the whole unit of work in one transaction, or nothing (``LeaseLost``: the lease
        was taken over since this object acquired it)."""

    @abstractmethod
    def load_pending(self, pipeline: str, up_to_release_us: int, limit: int | None = None) -> list[PendingRow]:
        """The pipeline's pending rows with ``release_us <= up_to_release_us``, in key (release) order;
        at most ``limit`` of them (the first ones) unless it is None."""

    @abstractmethod
    def pending_summary(self, pipeline: str) -> PendingSummary:
        """Count, payload bytes, next release time and smallest event time of the pipeline's pending rows."""

    @abstractmethod
    def reset(self, pipeline: str) -> int:
        """Delete the pipeline's state rows (never a target); returns how many pending rows it discarded."""

    @abstractmethod
    def migrate_state(self, pipeline: str) -> int:
        """Rewrite the pipeline's older-version blobs in the current version (the migration job).

        Respects the lease like ``reset``; returns how many blobs were rewritten.
        """

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> "StateStore":
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description}>"


def make_holder(run_label: str | None = None) -> str:
    """Lease holder text: ``host=<hostname> pid=<pid> run=<label> since=<UTC time>``.

    It is what a second acquirer sees in ``LeaseHeld`` and what ``lease_holder`` returns.
    """
    since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    label = " ".join((run_label or "-").split()) or "-"
    return f"host={socket.gethostname()} pid={os.getpid()} run={label} since={since}"
