"""Resume from the state store when Spark's checkpoint is lost (``run --resume-from-store``: the
store owns the source offsets).

The store records, with every committed batch N, the offset line of each source as Spark wrote it
in ``offsets/N``. A new checkpoint made of that batch alone (``offsets/N`` with the stored lines,
``commits/N``, and ``metadata`` naming the stored query id) is what Spark would have left had it
kept nothing older: Spark starts at batch N + 1, reading after the stored offsets. Nothing is read
twice, no batch id is reused (the target's ``batch_id=N/`` directories stay as they are), and
:func:`~ematix_dagster.spark.recovery.validate_checkpoint` finds the pair healthy.

Only sources whose offset is a position in the source itself can be sought: a Redis stream's
entry ids, Kafka's partition offsets. A files source's offset numbers the checkpoint's own file
log and a rate source's counts seconds since its checkpoint was made: both are refused. The
heartbeat (``processing_time``) starts afresh (``-``): its offset says nothing about the input.
"""

from __future__ import annotations

import json
import time
import uuid

from ematix_dagster.columns import HEARTBEAT
from ematix_dagster.errors import CheckpointDiverged
from ematix_dagster.spark.input import checkpoint
from ematix_dagster.spark.recovery import offset_names, unseekable
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.stores import make_store
from state_store.contract import PipelineRecord, make_holder


def resume_from_store(spec: PipelineSpec) -> str:
    """Write a new checkpoint from the store's last batch (``spec`` as loaded); say what was done.

    Refused (:class:`CheckpointDiverged`, terminal, nothing written) when a source cannot seek,
    when the store holds no batch, or when the checkpoint still has progress.
    """
    resolved = spec.resolved()
    name, cp = spec.pipeline_name, resolved.run.checkpoint_location
    cannot = unseekable(spec)
    if cannot:
        raise CheckpointDiverged(
            f"pipeline {name}: --resume-from-store needs sources that can seek to a stored offset (redis_stream, "
            f"kafka); {', '.join(cannot)} cannot: a files source's offsets number the lost checkpoint's own file "
            "log and a rate source's count its seconds. Restore the checkpoint from a backup, or start over with "
            "`ematix-dagster reset PIPELINE.toml --yes`")
    if checkpoint.has_progress(cp):
        raise CheckpointDiverged(f"pipeline {name}: the checkpoint {cp} still holds progress, so there is nothing to "
                                 "resume from the store: run without --resume-from-store (`ematix-dagster check` "
                                 "says whether the two agree)")
    store = make_store(resolved.state_store)
    store.open()
    try:
        store.acquire_lease(name, make_holder("resume-from-store"))
        try:
            record = store.load(name, groups=False).record
            if record is None or record.last_batch_id is None:
                raise CheckpointDiverged(f"pipeline {name}: {store.description} holds no committed batch to resume "
                                         "from: run without --resume-from-store to start from the sources' start")
            write_checkpoint(resolved, record)
        finally:
            store.release_lease(name)
    finally:
        store.close()
    return (f"[{name}] new checkpoint {cp} at batch {record.last_batch_id} from {store.description}: the run "
            f"continues with batch {record.last_batch_id + 1}, after the stored offsets")


def write_checkpoint(resolved: PipelineSpec, record: PipelineRecord) -> None:
    """Spark's files for committed batch ``record.last_batch_id`` (and the offsets of the one before
it) at the stored offsets. ``resolved`` is the spec with ``${NAME}`` expanded, the one the store was
opened with, so the checkpoint and the store are read from the same environment at the same time."""
    assert record.last_batch_id is not None
    root = checkpoint.local_path(resolved.run.checkpoint_location)
    batch = str(record.last_batch_id)
    lines = []
    for source in offset_names(resolved):
        if source == HEARTBEAT:
            lines.append("-")
        elif source in record.offsets:
            lines.append(record.offsets[source])
        else:
            raise CheckpointDiverged(f"pipeline {resolved.pipeline_name}: the store's batch {batch} records no offset "
                                     f"for source {source!r} (it was added since): it cannot be resumed")
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": {}}
    for sub in ("offsets", "commits"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": record.query_id or str(uuid.uuid4())}) + "\n")
    # Spark also reads the batch before the last one at start (whether or not it needs it): the same
    # offsets stand in for it, as if that batch had read nothing.
    for number in {record.last_batch_id, max(record.last_batch_id - 1, 0)}:
        (root / "offsets" / str(number)).write_text("\n".join(["v1", json.dumps(meta), *lines]))
    (root / "commits" / batch).write_text("v1\n" + json.dumps({"nextBatchWatermarkMs": 0}))
