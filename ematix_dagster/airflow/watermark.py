"""How far a pipeline's target is complete, read from the state store alone (no Spark, no Airflow).

Each commit stores the pipeline's *output watermark* with its record (schema step 11,
``PipelineRecord.output_watermark``): the watermark rows are released by (``WATERMARK_TS()`` under
``[emit] sql``, else the pipeline's ``W``), kept back to the oldest event time still held in the store
(an ``[emit]`` row's: its window end; a ``WATERMARK_TS()`` row's: its ``_event_ts``). The store computes
it in the commit's transaction, so one read of the record is the state after one commit.
:meth:`OutputPosition.complete_until` is the rule the Airflow sensor waits on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.kinds.time_units import format_us


@dataclass(frozen=True)
class OutputPosition:
    """A pipeline's committed position (µs, None before its first watermark)."""

    pipeline: str
    last_batch_id: int | None
    watermark: int | None  # the pipeline's W
    #: the stored output watermark: the releasing watermark kept back by the oldest held row
    output_watermark: int | None
    #: the releasing watermark (``WATERMARK_TS()`` under ``[emit]``, else W): above the output watermark
    #: exactly when held rows keep the output back
    releasing_watermark: int | None = None
    #: each source's latest event time: the one furthest behind holds W back
    sources: dict[str, int | None] = field(default_factory=dict)

    def complete_until(self, until_us: int) -> bool:
        """Whether the target holds every row of event time before ``until_us``: the output watermark is
        past it. Strictly past: a held row or ``[emit]`` window ending exactly at ``until_us`` keeps the
        output watermark at that time, and it is not in the target yet."""
        return self.output_watermark is not None and self.output_watermark > until_us

    @property
    def held_back(self) -> bool:
        """Whether rows held in the store keep the output watermark below the releasing watermark."""
        return (self.output_watermark is not None and self.releasing_watermark is not None
                and self.output_watermark < self.releasing_watermark)

    def slowest_source(self) -> str | None:
        """The source whose latest event time is the smallest (one that never had a row first)."""
        if not self.sources:
            return None
        return min(self.sources, key=lambda name: (self.sources[name] is not None, self.sources[name] or 0))

    def describe(self, until_us: int | None = None) -> str:
        """The position, and with ``until_us`` how far the output is behind it and what holds it back."""
        text = (f"pipeline {self.pipeline}: batch {self.last_batch_id}, watermark {format_us(self.watermark)}, "
                f"output watermark {format_us(self.output_watermark)}")
        if until_us is None or self.complete_until(until_us):
            return text
        if self.output_watermark is None:
            return f"{text}; no watermark yet (source {self.slowest_source()} has no row)"
        behind = until_us - self.output_watermark
        why = ("rows held back in the state store ([emit] sql or WATERMARK_TS()) keep it there" if self.held_back
               else f"source {self.slowest_source()} holds the watermark back")
        return f"{text}; {behind / 1e6:.3f} s behind {format_us(until_us)}: {why}"

    def as_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "last_batch_id": self.last_batch_id, "watermark": _iso(self.watermark),
                "output_watermark": _iso(self.output_watermark), "held_back": self.held_back}


def _iso(us: int | None) -> str | None:
    return None if us is None else format_us(us)


def output_position(spec: PipelineSpec) -> OutputPosition:
    """The committed position of ``spec``'s pipeline (the spec's store settings resolved from the
    environment, or already expanded: :func:`~ematix_dagster.airflow.connection.load_with_values`)."""
    from ematix_dagster.operations import opened

    name = spec.pipeline_name
    with opened(spec) as store:
        record = store.load(name, groups=False).record
    if record is None:
        return OutputPosition(name, None, None, None)
    return OutputPosition(name, record.last_batch_id, record.watermark, record.output_watermark,
                          record.releasing_watermark,
                          {source: progress.max_event_ts for source, progress in record.sources.items()})


__all__ = ["OutputPosition", "output_position"]
