"""How far a pipeline's target is complete, read from the state store alone (no Spark, no Airflow).

The store keeps the pipeline's watermark with every committed batch (``PipelineRecord.watermark``):
every window that ends at or before it has been emitted (the final rows; a ``late_data = "reopen"``
correction may still follow). A pipeline with ``[emit] sql``, or a row pipeline using
``WATERMARK_TS()``, holds rows back in the store past that point: those rows are not in the target
yet. Their oldest event time (an ``[emit]`` row's: its window end) is read with the record; the
store keeps no separate output watermark per commit, so it is computed here from the two reads.

:func:`output_position` reads both and retries while a commit lands between them (the record's
batch id changed), so the answer is the state after one commit. :meth:`OutputPosition.complete_until`
is the rule the Airflow sensor waits on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.kinds.time_units import format_us


@dataclass(frozen=True)
class OutputPosition:
    """A pipeline's committed position: watermark and oldest held-back row (µs, None when none)."""

    pipeline: str
    last_batch_id: int | None
    watermark: int | None
    #: the smallest event time among rows held back in the store ([emit] windows: their end), None when none
    oldest_held: int | None
    held_rows: int = 0

    def complete_until(self, until_us: int) -> bool:
        """Whether the target holds every row of event time before ``until_us``: every window ending at
        or before it has been emitted (the watermark is at ``until_us`` or past it) and no row held back
        in the store has an event time (an [emit] window: its end) at or before it."""
        if self.watermark is None or self.watermark < until_us:
            return False
        return self.oldest_held is None or self.oldest_held > until_us

    @property
    def output_watermark(self) -> int | None:
        """The watermark, kept back to the oldest held row's event time when rows are held."""
        if self.watermark is None or self.oldest_held is None:
            return self.watermark
        return min(self.watermark, self.oldest_held)

    def describe(self) -> str:
        held = (f", {self.held_rows} rows held back from {format_us(self.oldest_held)}"
                if self.oldest_held is not None else "")
        return (f"pipeline {self.pipeline}: batch {self.last_batch_id}, watermark {format_us(self.watermark)}"
                f"{held}")

    def as_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "last_batch_id": self.last_batch_id,
                "watermark": _iso(self.watermark), "oldest_held": _iso(self.oldest_held),
                "held_rows": self.held_rows, "output_watermark": _iso(self.output_watermark)}


def _iso(us: int | None) -> str | None:
    return None if us is None else format_us(us)


def output_position(spec: PipelineSpec, attempts: int = 5) -> OutputPosition:
    """The committed position of ``spec``'s pipeline (the spec's store settings resolved from the
    environment, or already expanded: :func:`~ematix_dagster.airflow.connection.with_values`)."""
    from ematix_dagster.operations import opened

    name = spec.pipeline_name
    holds_rows = spec.is_row_pipeline or spec.emit is not None
    with opened(spec) as store:
        for _ in range(attempts):
            before = store.load(name, groups=False).record
            held = store.pending_summary(name) if holds_rows else None
            after = store.load(name, groups=False).record if held is not None else before
            same = (before is None and after is None) or (
                before is not None and after is not None and before.last_batch_id == after.last_batch_id)
            if same:
                break
        return OutputPosition(
            name, after.last_batch_id if after else None, after.watermark if after else None,
            held.min_event_ts if held is not None and held.rows else None, held.rows if held is not None else 0)


__all__ = ["OutputPosition", "output_position"]
