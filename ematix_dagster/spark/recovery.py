"""Is it safe to continue? Checks of Spark's checkpoint against the state store (docs/contract/operations.md).

Healthy means (docs/contract/targets-and-guarantees.md): ``last Spark commit <= store batch <= last Spark commit + 1``, the
store's batch has the same offsets in the checkpoint, both belong to the same query, and the
stored state is not newer than this code. Each problem says what is wrong in plain words and the
way out. File-source offsets are indexes into the checkpoint's own log, so a lost checkpoint
cannot be rebuilt from the store's offsets; sources with real offsets (Redis streams, Kafka) resume
from them (:mod:`.resume`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ematix_dagster.columns import HEARTBEAT
from ematix_dagster.spark.input import checkpoint
from ematix_dagster.spark.sources.readers import has_heartbeat
from ematix_dagster.spec import PipelineSpec
from state_store.codec import STATE_VERSION
from state_store.contract import PipelineRecord

RESET = "or start over with `ematix-dagster reset PIPELINE.toml --yes` (deletes the state and the checkpoint, " \
        "never the target; the input is then processed again from the start)"


@dataclass(frozen=True)
class Problem:
    code: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message} Way out: {self.fix}"


def offset_names(spec: PipelineSpec) -> list[str]:
    """Source names in checkpoint order (the heartbeat, where the stream has one, is the last source)."""
    names = list(spec.source_names)
    if has_heartbeat(spec):
        names.append(HEARTBEAT)
    return names


def named_offsets(spec: PipelineSpec, lines: tuple[str, ...]) -> dict[str, str]:
    """A batch's offset lines from ``offsets/N`` keyed by source name."""
    return dict(zip(offset_names(spec), lines))


def checkpoint_offsets(spec: PipelineSpec, batch_id: int) -> dict[str, str]:
    return named_offsets(spec, checkpoint.read_offsets(spec.run.checkpoint_location, batch_id).offsets)


def validate_checkpoint(spec: PipelineSpec, record: PipelineRecord | None) -> list[Problem]:
    cp = spec.run.checkpoint_location
    commits = checkpoint.committed_batches(cp)
    last_commit = commits[-1] if commits else -1
    has_progress = checkpoint.has_progress(cp)
    problems: list[Problem] = []
    if record is None or record.last_batch_id is None:
        # Planned but uncommitted batch 0 (a crash or an outage inside it) is healthy: Spark replays it.
        if last_commit >= 0:
            problems.append(Problem(
                "store_missing",
                f"the checkpoint {cp} has progress up to batch {last_commit}, but the state store has no state for "
                f"pipeline {spec.pipeline_name} (a new, emptied or rolled-back store). Continuing would lose the "
                "window state of every batch already processed.",
                f"restore the state store from its backup, {RESET}"))
        return problems
    if record.state_version > STATE_VERSION:
        problems.append(Problem(
            "state_too_new",
            f"the stored state has version {record.state_version}, newer than this code ({STATE_VERSION}).",
            "run the newer ematix-dagster that wrote it"))
    store_batch = record.last_batch_id
    if not has_progress:
        problems.append(_checkpoint_missing(spec, store_batch))
        return problems
    cp_query = checkpoint.query_id(cp)
    if record.query_id and cp_query and record.query_id != cp_query:
        problems.append(Problem(
            "query_mismatch",
            f"the state store was written by streaming query {record.query_id} but the checkpoint {cp} belongs to "
            f"query {cp_query}: they are not the same pipeline run history.",
            f"point run.checkpoint_location at the checkpoint of query {record.query_id}, {RESET}"))
    if store_batch < last_commit:
        problems.append(Problem(
            "store_behind",
            f"the checkpoint has committed batch {last_commit} but the state store is only at batch {store_batch} "
            "(the store was rolled back or restored from an older backup): the state of the batches in between "
            "is missing.",
            f"restore a store backup taken at batch {last_commit} or later, {RESET}"))
    elif store_batch > last_commit + 1:
        problems.append(Problem(
            "checkpoint_behind",
            f"the state store is at batch {store_batch} but the checkpoint has only committed batch {last_commit} "
            "(the checkpoint was rolled back): Spark would feed batches the store has already counted.",
            f"restore the checkpoint taken at batch {store_batch}, {RESET}"))
    elif checkpoint.offsets_exist(cp, store_batch):
        expected = checkpoint_offsets(spec, store_batch)
        if record.offsets and _input_offsets(record.offsets) != _input_offsets(expected):
            problems.append(Problem(
                "offsets_differ",
                f"for batch {store_batch} the state store recorded offsets {record.offsets} but the checkpoint has "
                f"{expected}: they describe different input.",
                f"restore the matching checkpoint, {RESET}"))
    return problems


def _input_offsets(offsets: dict[str, str]) -> dict[str, str]:
    """The offsets that say what was read: the heartbeat's do not (a resumed checkpoint restarts it)."""
    return {name: line for name, line in offsets.items() if name != HEARTBEAT}


#: source kinds whose stored offset names a position in the source (what seek_to needs)
SEEKABLE = ("redis_stream", "kafka")


def unseekable(spec: PipelineSpec) -> list[str]:
    """The sources a resume from the store (:mod:`.resume`) cannot seek, described for a message."""
    return [f"{s.name!r} ({s.kind})" for s in spec.sources if s.kind not in SEEKABLE]


def _checkpoint_missing(spec: PipelineSpec, store_batch: int) -> Problem:
    cp = spec.run.checkpoint_location
    cannot = unseekable(spec)
    if not cannot:
        return Problem(
            "checkpoint_missing",
            f"the state store is at batch {store_batch} but the checkpoint {cp} is missing or empty. The store "
            "holds the offsets of that batch and every source can seek to them.",
            "`ematix-dagster run --resume-from-store PIPELINE.toml` starts a new checkpoint after the stored "
            f"offsets, with the state intact and batch ids from {store_batch + 1} (or restore the checkpoint "
            f"directory {cp} from its backup)")
    return Problem(
        "checkpoint_missing",
        f"the state store is at batch {store_batch} but the checkpoint {cp} is missing or empty. The sources "
        f"{', '.join(cannot)} cannot seek to the store's offsets (a files source's offsets are positions in the "
        "checkpoint's own file log), so the store cannot rebuild it.",
        f"restore the checkpoint directory {cp} from its backup, {RESET}")
