"""Operator actions on a pipeline's state: check, state summary, migrate, reset (docs/contract/operations.md).

The CLI and the Dagster ops call these. Each opens the configured store, respects the pipeline's
lease (a running pipeline is never reset or migrated under its feet) and closes the store again.
They take the spec as loaded: stores and checkpoints are opened from its resolved copy, while the
fingerprint, which the state records, is computed from the placeholders (never from a value).
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from ematix_dagster.errors import CorruptCheckpoint, CorruptState, StateVersionError
from ematix_dagster.fingerprint import describe_changes, fingerprint, fingerprint_doc
from ematix_dagster.spark.input import checkpoint
from ematix_dagster.spark.recovery import Problem, validate_checkpoint
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.stores import make_store
from ematix_dagster.streaming.kinds import window_kind
from ematix_dagster.streaming.kinds.time_units import format_us
from state_store.codec import STATE_VERSION
from state_store.contract import PendingSummary, PipelineRecord, StateStore, make_holder
from state_store.segment_replay import replayed


@contextmanager
def opened(spec: PipelineSpec) -> Iterator[StateStore]:
    """The store of ``spec`` (as loaded, with its placeholders), open for the block."""
    store = make_store(spec.resolved().state_store)
    store.open()
    try:
        yield store
    finally:
        store.close()


@contextmanager
def leased(store: StateStore, spec: PipelineSpec, action: str) -> Iterator[None]:
    """Hold the pipeline's lease for an operator action; refuse while a run holds it."""
    store.acquire_lease(spec.pipeline_name, make_holder(action))
    try:
        yield
    finally:
        store.release_lease(spec.pipeline_name)


@dataclass
class CheckReport:
    pipeline: str
    store: str
    record: PipelineRecord | None
    lease_holder: str | None
    problems: list[Problem] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def position(self) -> str:
        """Where the stored state stands, for ``check``'s first line: state that is there but cannot be
        read is never "no state yet"."""
        if self.record is not None:
            return f"batch {self.record.last_batch_id}"
        if any(p.code in _UNREADABLE for p in self.problems):
            return "stored state unreadable"
        return "no state yet"


#: problems found while loading, before the stored record could be read
_UNREADABLE = ("state_too_new", "corrupt_state")


def check(spec: PipelineSpec) -> CheckReport:
    """Checkpoint against store, spec fingerprint, state version, every state blob; never changes anything.

    Every stored group is decoded and checked against the spec's aggregations (as a restore
    would, and closer: every HLL sketch is opened), so corrupt state is reported here
    (``corrupt_state``) rather than found by the next run.
    """
    from ematix_dagster.spark.recovery import RESET
    from ematix_dagster.streaming.durable import check_window_ends, decoded_groups
    from ematix_dagster.streaming.micro_batch import check_groups

    def corrupt_state(exc: CorruptState) -> Problem:
        return Problem("corrupt_state", f"the stored state cannot be used: {exc.cause.rstrip('.')}.",
                       f"restore the state store from its backup, {RESET}")

    with opened(spec) as store:
        holder = store.lease_holder(spec.pipeline_name)
        try:
            # the segments replayed over the rows (schema step 8): a segment that does not decode is reported
            # like a row's blob
            recovered, _ = replayed(store.load(spec.pipeline_name), f"pipeline {spec.pipeline_name!r} in "
                                    f"{store.description}")
        except (StateVersionError, CorruptState) as exc:  # a pipelines row, a blob's version byte, the database
            problem = (Problem("state_too_new", f"{exc}.", "run the newer ematix-dagster that wrote it")
                       if isinstance(exc, StateVersionError) else corrupt_state(exc))
            return CheckReport(spec.pipeline_name, store.description, _record(store, spec.pipeline_name), holder,
                               [problem])
        record = recovered.record
        report = CheckReport(spec.pipeline_name, store.description, record, holder)
    try:
        report.problems = validate_checkpoint(spec.resolved(), record)
    except CorruptCheckpoint as exc:
        report.problems = [Problem("corrupt_checkpoint", f"{exc.cause.rstrip('.')}.",
                                   f"restore the checkpoint directory from its backup, {RESET}")]
    changed = bool(record is not None and record.fingerprint
                   and record.fingerprint != fingerprint(fingerprint_doc(spec)))
    if changed and record is not None:
        changes = "; ".join(describe_changes(record.fingerprint_doc, fingerprint_doc(spec)))
        report.problems.append(Problem("fingerprint_changed", "the spec's window shape or emission changed since the "
                                       f"state was written: {changes}.", "revert the change, or reset the pipeline"))
    if record is not None and not (spec.window_spec is not None and spec.run.window_state == "executors"):
        try:  # (Spark keeps an executors-mode window state in the checkpoint: the store holds none)
            groups = decoded_groups(spec.pipeline_name, recovered, report.store)
            # state of another window shape is reported as fingerprint_changed, not corrupt; a row
            # pipeline holds no windows
            if not changed and spec.window_spec is not None:
                check_window_ends(spec.pipeline_name, window_kind(spec.window_spec), recovered.groups, report.store)
                check_groups(spec.pipeline_name, spec.window_spec, groups, report.store, thorough=True)
        except CorruptState as exc:
            report.problems.append(corrupt_state(exc))
    return report


def _record(store: StateStore, pipeline: str) -> PipelineRecord | None:
    """The pipeline's record alone, when its groups would not load (a blob of another version, or garbage)."""
    try:
        return store.load(pipeline, groups=False).record
    except (StateVersionError, CorruptState):
        return None


def summary(spec: PipelineSpec, windows: bool = True, detail: bool = False) -> dict[str, Any]:
    """Watermarks and counters as stored, and (``windows``) open windows, groups and bytes; for a row pipeline
    or one with ``[emit]`` its pending rows (count, bytes, next release time, never values).

    With ``[run] window_state = "executors"`` the store holds no window: groups and bytes are Spark's
    state as its progress reported it, and ``detail`` reads the state itself from the checkpoint
    (``spark_state``: starts Spark) for the open windows.
    """
    if spec.window_spec is not None and spec.run.window_state == "executors":
        return _executor_summary(spec, detail)
    with opened(spec) as store:
        recovered = store.load(spec.pipeline_name, groups=windows)
        holder = store.lease_holder(spec.pipeline_name)
        held = store.pending_summary(spec.pipeline_name) if spec.is_row_pipeline or spec.emit else None
    recovered, _ = replayed(recovered, f"pipeline {spec.pipeline_name!r} in {store.description}")
    record = recovered.record
    per_window: dict[int, int] = {}
    size = 0
    for start, _end, key, blob in recovered.groups:
        per_window[start] = per_window.get(start, 0) + 1
        size += len(key) + len(blob)
    return {
        "pipeline": spec.pipeline_name,
        "store": store.description,
        "lease_holder": holder,
        "last_batch_id": record.last_batch_id if record else None,
        "query_id": record.query_id if record else None,
        "state_version": record.state_version if record else None,
        "open_windows": len(per_window),
        "groups": sum(per_window.values()),
        "bytes": size,
        "watermark": record.watermark if record else None,
        "sources": {n: {"max_event_ts": p.max_event_ts, "last_arrival": p.last_arrival}
                    for n, p in (record.sources.items() if record else [])},
        "positions": positions(spec, record),
        "counters": dict(record.counters) if record else {},
        "last_batch_rows": record.last_batch_rows if record else None,
        "release_watermark": record.release_watermark if record else None,
        "output_watermark": record.output_watermark if record else None,
        "trimmed_entries_skipped": _skipped(spec, record),
        "windows": per_window,
        **({noun: _held_per_key(recovered.groups, noun)} if (noun := _rows_per_key(spec)) else {}),
        **({"pending": _pending(held)} if held is not None else {}),
    }


def _executor_summary(spec: PipelineSpec, detail: bool) -> dict[str, Any]:
    """:func:`summary` of a pipeline whose window state Spark keeps in its checkpoint."""
    from ematix_dagster.spark.batch.executor_call import STATE_BYTES, STATE_ROWS

    with opened(spec) as store:
        record = store.load(spec.pipeline_name, groups=False).record
        holder = store.lease_holder(spec.pipeline_name)
    counters = dict(record.counters) if record else {}
    found: dict[str, Any] = {
        "pipeline": spec.pipeline_name,
        "store": store.description,
        "window_state": "executors",
        "checkpoint": spec.run.checkpoint_location,
        "lease_holder": holder,
        "last_batch_id": record.last_batch_id if record else None,
        "query_id": record.query_id if record else None,
        "state_version": record.state_version if record else None,
        # Spark's progress of the batch before the last committed one
        "groups": counters.get(STATE_ROWS, 0),
        "bytes": counters.get(STATE_BYTES, 0),
        "watermark": record.watermark if record else None,
        "output_watermark": record.output_watermark if record else None,
        "sources": {n: {"max_event_ts": p.max_event_ts, "last_arrival": p.last_arrival}
                    for n, p in (record.sources.items() if record else [])},
        "positions": positions(spec, record),
        "counters": counters,
    }
    if detail:
        from ematix_dagster.spark.input.spark_state import spark_state
        from ematix_dagster.spark.plans.executor_plan import executor_session
        from ematix_dagster.spark.spark_session import get_spark

        found["spark_state"] = spark_state(executor_session(get_spark(f"ematix-state-{spec.pipeline_name}")),
                                           spec.resolved())
    return found


def positions(spec: PipelineSpec, record: PipelineRecord | None) -> dict[str, Any]:
    """Each source's committed position, from the offsets of the last committed batch: a Redis
    stream's last entry id read (entries up to it may be trimmed), Kafka's offsets per topic and
    partition (the next one to read), the files a files source has read (how many, the last one),
    the rate source's offset. None for a source that has committed nothing."""
    import json

    from ematix_dagster.spark.recovery import offset_names

    offsets = record.offsets if record else {}
    order = offset_names(spec)
    found: dict[str, Any] = {}
    for source in spec.sources:
        line = offsets.get(source.name)
        if line is None or line.strip() in ("", "-"):
            found[source.name] = None
            continue
        offset = json.loads(line)
        if source.kind == "redis_stream":
            found[source.name] = {"kind": source.kind, "last_entry_ids": {s: o["id"] for s, o in offset.items()}}
        elif source.kind == "files":
            up_to = int(offset["logOffset"] if isinstance(offset, dict) else offset)
            read = checkpoint.files_logged(spec.resolved().run.checkpoint_location, order.index(source.name), up_to)
            found[source.name] = {"kind": source.kind, "files_read": len(read), "last_file": read[-1] if read else None,
                                  "log_offset": up_to}
        else:  # kafka: {topic: {partition: next offset}}; rate: its offset as Spark writes it
            found[source.name] = {"kind": source.kind, "offsets": offset}
    return found


def _skipped(spec: PipelineSpec, record: PipelineRecord | None) -> dict[str, int]:
    """Per redis_stream source, the trimmed entries ``on_trimmed = "skip"`` went past (its offsets count them)."""
    from ematix_dagster.spark.sources.redis_source import skipped_entries

    offsets = record.offsets if record else {}
    return {s.name: skipped_entries(offsets[s.name]) for s in spec.sources
            if s.kind == "redis_stream" and offsets.get(s.name) not in (None, "-")}


def _pending(held: PendingSummary) -> dict[str, Any]:
    """Rows held back by WATERMARK_TS(): how many, their bytes, when the next one and the oldest event time
    among them (an ``[emit]`` row's: its window end); never their values (they are not public yet)."""
    return {"rows": held.rows, "payload_bytes": held.payload_bytes,
            "next_release_us": held.next_release_us, "next_release": _iso(held.next_release_us),
            "oldest_event_ts_us": held.min_event_ts, "oldest_event_ts": _iso(held.min_event_ts)}


def _iso(us: int | None) -> str | None:
    return None if us is None else format_us(us)


def _rows_per_key(spec: PipelineSpec) -> str | None:
    """What a key of the window kind holds, for :func:`_held_per_key` (None: nothing to break down;
    a row pipeline has no windows)."""
    return None if spec.window_spec is None else window_kind(spec.window_spec).rows_per_key


def _held_per_key(groups: list[tuple[int, int | None, bytes, bytes]], noun: str, top: int = 10) -> dict[str, Any]:
    """What each key holds: open (and retained) sessions, or a sliding window's retained event
    times (``noun``: "sessions" or "events"). How many keys hold how many, the oldest start (for
    events: the oldest retained event time), the bytes; the ``top`` keys by rows held, to find the
    key a cap or a memory alarm is about."""
    from state_store.codec import decode_key

    per_key: dict[bytes, list[int]] = {}  # key bytes -> [rows, oldest start, bytes]
    for start, _end, key, blob in groups:
        held = per_key.get(key)
        if held is None:
            per_key[key] = [1, start, len(key) + len(blob)]
        else:
            held[0] += 1
            held[1] = min(held[1], start)
            held[2] += len(key) + len(blob)
    busiest = sorted(per_key.items(), key=lambda item: (-item[1][0], item[1][1]))[:top]
    return {
        "keys": len(per_key),
        noun: sum(v[0] for v in per_key.values()),
        "oldest_start": min((v[1] for v in per_key.values()), default=None),
        "most_per_key": busiest[0][1][0] if busiest else 0,
        "top_keys": [{"key": list(decode_key(k)), noun: n, "oldest_start": oldest, "bytes": size}
                     for k, (n, oldest, size) in busiest],
    }


def migrate(spec: PipelineSpec, dry_run: bool = False) -> list[str]:
    """Bring stored blobs to the current version; with ``dry_run`` only say what would change."""
    with opened(spec) as store:
        if dry_run:
            # older blobs come back migrated, and counted; segments (one format version) as the rows they stand for
            recovered, _ = replayed(store.load(spec.pipeline_name), f"pipeline {spec.pipeline_name!r} in "
                                    f"{store.description}")
            old, total = recovered.migrated, len(recovered.groups)
            return [f"{old} of {total} state blobs would be rewritten from an older version to version "
                    f"{STATE_VERSION}" if old else f"all {total} state blobs are at version {STATE_VERSION}"]
        with leased(store, spec, "migrate"):
            n = store.migrate_state(spec.pipeline_name)
    return [f"rewrote {n} state blobs to version {STATE_VERSION}"]


def reset(spec: PipelineSpec) -> list[str]:
    """Delete the pipeline's state rows and its checkpoint; never the target. Says how many pending
    rows (held back by WATERMARK_TS(), not written yet) it discarded."""
    done = []
    with opened(spec) as store:
        with leased(store, spec, "reset"):
            pending = store.reset(spec.pipeline_name)
            done.append(f"deleted the state of pipeline {spec.pipeline_name} in {store.description}")
            done.append(f"discarded {pending} pending row{'' if pending == 1 else 's'} (held back by "
                        "WATERMARK_TS(), never written to the target)")
            cp = checkpoint.local_path(spec.resolved().run.checkpoint_location)
            if cp.exists():
                shutil.rmtree(cp)
                done.append(f"deleted the checkpoint {cp}")
    return done


__all__ = ["CheckReport", "check", "migrate", "positions", "reset", "summary"]
