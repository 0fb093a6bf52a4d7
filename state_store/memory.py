"""A state store in this process's memory: nothing survives a restart.

Data lives in a process-global dict keyed by the store's ``name``, so two store objects with the
same name see the same data (that is how tests simulate a restart within one process) and the
lease works between them, its epoch included (a take-over waits, outside the store's lock, for
the fenced object to be released by another thread). ``durable`` is False: the engine must refuse to resume a checkpoint
with it (docs/contract/targets-and-guarantees.md). Its window state is the committed segments
only: state rows exist only in stores written at schema 7 or older, which this one never is.
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
from dataclasses import dataclass, field

from state_store import pending
from state_store._common import (
    LeaseRow,
    LeaseSteps,
    check_batch,
    check_fence,
    check_record_version,
    lease_held,
    not_committed,
    renew_lease,
    take_lease,
)
from state_store.contract import (
    BatchCommit,
    PendingRow,
    PendingSummary,
    PipelineRecord,
    RecoveredState,
    StateStore,
    TakeOver,
    output_watermark,
)

log = logging.getLogger(__name__)


@dataclass
class _Pipeline:
    record: PipelineRecord | None = None
    #: pending rows (schema step 7): (release_us, arrival_batch, seq) -> (event_ts, payload)
    pending: dict[tuple[int, int, int], tuple[int | None, bytes]] = field(default_factory=dict)
    #: state segments (schema step 8), in append order
    segments: list[bytes] = field(default_factory=list)


@dataclass
class _Space:
    pipelines: dict[str, _Pipeline] = field(default_factory=dict)
    leases: dict[str, tuple[int, str]] = field(default_factory=dict)  # pipeline -> (owner id, holder)
    #: pipeline -> (lease epoch, the text of the holder that raised it), as a database's pipeline row keeps them
    epochs: dict[str, tuple[int, str]] = field(default_factory=dict)


_SPACES: dict[str, _Space] = {}
_LOCK = threading.RLock()  # one lock for all in-memory stores: commits are tiny critical sections
_OWNERS = itertools.count(1)


class InMemoryStateStore(StateStore):
    kind = "in_memory"
    durable = False

    def __init__(self, name: str = "default") -> None:
        self.name = name
        self._open = False
        self._owner = next(_OWNERS)  # identifies this object as a lease owner
        self._epochs: dict[str, int] = {}  # pipeline -> the lease epoch this object holds it at

    @property
    def description(self) -> str:
        return f"in-memory state store {self.name!r} (not durable)"

    @classmethod
    def forget(cls, name: str | None = None) -> None:
        """Drop the data of one named store (or of all): a test helper, the "machine restart"."""
        with _LOCK:
            if name is None:
                _SPACES.clear()
            else:
                _SPACES.pop(name, None)

    def _space(self) -> _Space:
        if not self._open:
            self.open()
        return _SPACES.setdefault(self.name, _Space())

    def open(self) -> None:
        if self._open:
            return
        with _LOCK:
            _SPACES.setdefault(self.name, _Space())
            self._open = True
        log.warning(
            "state store %r is IN MEMORY: window state, offsets and watermarks live only in this process "
            "and NOTHING survives a restart; configure [state_store] kind = \"sqlite\" or \"postgres\" for "
            "durable state", self.name)

    # ---- lease ---------------------------------------------------------------------------------

    def acquire_lease(self, pipeline: str, holder: str, take_over: TakeOver | None = None, *,
                      take_over_wait_s: float = 60.0) -> None:
        """Outside ``_LOCK`` but for each step: a take-over waits for another thread to release."""
        steps = self._lease_steps(pipeline, holder)
        if pipeline in self._epochs:
            renew_lease(pipeline, self.description, steps, self._owner, self._epochs[pipeline])
        else:
            _, self._epochs[pipeline] = take_lease(pipeline, self.description, steps, take_over, take_over_wait_s)
        with _LOCK:
            self._space().leases[pipeline] = (self._owner, holder)

    def _lease_steps(self, pipeline: str, holder: str) -> LeaseSteps[int]:
        return LeaseSteps(try_lock=lambda: self._try_lock(pipeline, holder),
                          unlock=lambda _owner: self.release_lease(pipeline),
                          fence=lambda: self._fence(pipeline, holder),
                          claim=lambda _owner, epoch: self._claim(pipeline, epoch))

    def _try_lock(self, pipeline: str, holder: str) -> tuple[int | None, str | None]:
        with _LOCK:
            leases = self._space().leases
            current = leases.get(pipeline)
            if current is not None and current[0] != self._owner:
                return None, current[1]
            leases[pipeline] = (self._owner, holder)
            return self._owner, None

    def _fence(self, pipeline: str, holder: str) -> int:
        with _LOCK:
            epochs = self._space().epochs
            epoch = epochs.get(pipeline, (0, holder))[0] + 1
            epochs[pipeline] = (epoch, holder)
            return epoch

    def _claim(self, pipeline: str, epoch: int) -> LeaseRow:
        with _LOCK:
            stored = self._space().epochs.get(pipeline)
            return None if stored is None or stored[0] == epoch else stored

    def release_lease(self, pipeline: str) -> None:
        with _LOCK:
            self._epochs.pop(pipeline, None)
            leases = self._space().leases
            if pipeline in leases and leases[pipeline][0] == self._owner:
                del leases[pipeline]

    def lease_holder(self, pipeline: str) -> str | None:
        with _LOCK:
            current = self._space().leases.get(pipeline)
            return current[1] if current else None

    def lease_epoch(self, pipeline: str) -> int | None:
        return self._epochs.get(pipeline)

    def _check_writer(self, pipeline: str, undone: str, batch: int | None = None) -> None:
        space = self._space()
        current = space.leases.get(pipeline)
        if current is not None and current[0] != self._owner:
            raise lease_held(pipeline, self.description, current[1])
        check_fence(pipeline, self.description, self._epochs.get(pipeline), space.epochs.get(pipeline), undone, batch)

    # ---- data ----------------------------------------------------------------------------------

    def load(self, pipeline: str, groups: bool = True) -> RecoveredState:
        with _LOCK:
            data = self._space().pipelines.get(pipeline)
            if data is None or data.record is None:
                return RecoveredState(record=None)
            record = copy.deepcopy(data.record)
            segments = list(data.segments) if groups else []
        check_record_version(record, self.description)
        return RecoveredState(record=record, segments=segments)

    def commit(self, batch: BatchCommit) -> None:
        check_batch(batch)
        pipeline = batch.record.pipeline
        record = copy.deepcopy(batch.record)
        with _LOCK:
            space = self._space()
            self._check_writer(pipeline, not_committed(batch), batch.record.last_batch_id)
            # Everything that can fail happens before the first change: the types were checked
            # above, re-inserted pending rows are compared, and the callbacks (there is no
            # connection to give them) run first.
            stored = space.pipelines[pipeline].pending if pipeline in space.pipelines else {}
            for row in batch.pending_inserts:
                if stored.get(row.key, (row.event_ts, row.payload)) != (row.event_ts, row.payload):
                    raise pending.conflict(pipeline, self.description, row.key)
            for callback in batch.in_transaction:
                callback(None)
            data = space.pipelines.setdefault(pipeline, _Pipeline())
            if batch.rebase:
                data.segments = []
            del data.segments[:batch.dropped_segments]
            data.segments += batch.segments
            for row in batch.pending_inserts:
                data.pending[row.key] = (row.event_ts, row.payload)
            for released in batch.pending_released:
                data.pending.pop(released, None)
            if batch.pending_released_up_to is not None:
                for due in [k for k in data.pending if k[0] <= batch.pending_released_up_to]:
                    del data.pending[due]
            held = [ts for ts, _ in data.pending.values() if ts is not None]
            record.output_watermark = batch.record.output_watermark = output_watermark(
                record.releasing_watermark, min(held) if held else None)
            data.record = record

    def load_pending(self, pipeline: str, up_to_release_us: int, limit: int | None = None) -> list[PendingRow]:
        pending.check_load(up_to_release_us, limit)
        with _LOCK:
            data = self._space().pipelines.get(pipeline)
            due = sorted(key for key in data.pending if key[0] <= up_to_release_us) if data else []
            return [PendingRow(*key, *data.pending[key]) for key in due[:limit]] if data else []

    def pending_summary(self, pipeline: str) -> PendingSummary:
        with _LOCK:
            data = self._space().pipelines.get(pipeline)
            rows = data.pending if data else {}
            return PendingSummary(
                rows=len(rows), payload_bytes=sum(len(payload) for _, payload in rows.values()),
                next_release_us=min(rows)[0] if rows else None,
                min_event_ts=min((ts for ts, _ in rows.values() if ts is not None), default=None))

    def reset(self, pipeline: str) -> int:
        with _LOCK:
            space = self._space()
            self._check_writer(pipeline, "the reset was not done")
            data = space.pipelines.pop(pipeline, None)
            return len(data.pending) if data else 0

    def migrate_state(self, pipeline: str) -> int:
        """Nothing to rewrite: only state rows are migrated in place, and this store never holds any."""
        with _LOCK:
            self._check_writer(pipeline, "the migration was not done")
            return 0

    def close(self) -> None:
        with _LOCK:
            space = _SPACES.get(self.name)
            if space is not None:
                for pipeline in [p for p, (owner, _) in space.leases.items() if owner == self._owner]:
                    del space.leases[pipeline]
        self._epochs.clear()
        self._open = False


__all__ = ["InMemoryStateStore"]
