"""The Python facade: build a pipeline in code, get the same spec (and TOML) as a file would give.

>>> from ematix_dagster import Aggregation, Run, Source, Target, Window, streaming_pipeline
>>> @streaming_pipeline(
...     name="clicks-per-minute",
...     sources=[Source(name="clicks", kind="rate", rows_per_second=10)],
...     window=Window(kind="tumbling", duration_ms=60_000, group_by=(), max_groups_per_window=10,
...                   aggregations=[Aggregation(agg="count", as_="clicks")]),
...     target=Target(kind="console"),
...     run=Run(checkpoint_location=".ematix/checkpoints/clicks-per-minute"),
... )
... def clicks_per_minute():
...     "Clicks per minute."
>>> clicks_per_minute.spec.pipeline_name
'clicks-per-minute'
>>> "[transform.window]" in clicks_per_minute.to_toml()
True

``emit_trigger`` takes the TOML spellings (a string or a one-key dict) or an :class:`EmitTrigger`
(what the field holds, and what type-checked callers pass):

>>> from ematix_dagster import EmitTrigger
>>> def window(trigger):
...     return Window(kind="tumbling", duration_ms=60_000, max_groups_per_window=10,
...                   aggregations=[Aggregation(agg="count", as_="clicks")], emit_trigger=trigger)
>>> window({"count": 5}).emit_trigger == window(EmitTrigger(kind="count", count=5)).emit_trigger
True
>>> window("every_batch").emit_trigger
EmitTrigger(kind='every_batch', interval_ms=None, count=None)
>>> window({"every": 5})
Traceback (most recent call last):
...
ematix_dagster.errors.PipelineConfigError: transform.window.emit_trigger: unknown trigger {'every': 5}: ...
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import (
    Backfill,
    DeadLetter,
    EmitRelease,
    PipelineSpec,
    RowTransform,
    Run,
    Source,
    StateStoreConfig,
    Target,
    Window,
    dump_pipeline,
    load_pipeline,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ematix_dagster.spark.runner import RunSummary


@dataclass(frozen=True)
class StreamingPipeline:
    """A spec plus the description taken from the decorated function's docstring."""

    spec: PipelineSpec
    description: str = ""

    def to_toml(self) -> str:
        return dump_pipeline(self.spec)

    def run(self, spark: "SparkSession | None" = None) -> "RunSummary":
        return run_streaming_pipeline(self.spec, spark=spark)


def streaming_pipeline(*, name: str, sources: Iterable[Source], target: Target, run: Run,
                       window: Window | None = None, rows: RowTransform | None = None,
                       transform_sql: str | None = None, dead_letter: DeadLetter | None = None,
                       state_store: StateStoreConfig | None = None, metrics_port: int | None = None,
                       emit: EmitRelease | None = None,
                       backfill: Backfill | None = None) -> Callable[[Callable[[], None]], StreamingPipeline]:
    """Decorate a function to declare a pipeline; the spec is validated at decoration time.

    Give ``window`` for a windowed pipeline, or leave it out for a row pipeline (``transform_sql``
    required), whose watermark keys and ``max_buffered_rows`` are ``rows`` (default
    ``RowTransform()``); giving both is refused, as TOML refuses both tables' keys. ``emit`` (the
    ``[emit]`` table) publishes a windowed pipeline's rows late.
    """
    if window is not None and rows is not None:
        raise PipelineConfigError("transform", "has both a window and a row pipeline's keys (rows): a windowed "
                                  "pipeline takes its watermark keys in [transform.window], and max_buffered_rows "
                                  "applies to row pipelines only", "give window or rows, not both")
    shape = window if window is not None else rows or RowTransform()
    spec = PipelineSpec(pipeline_name=name, sources=tuple(sources), shape=shape, target=target,
                        run=run, transform_sql=transform_sql, dead_letter=dead_letter,
                        state_store=state_store or StateStoreConfig(), metrics_port=metrics_port,
                        emit=emit, backfill=backfill).validate()

    def wrap(fn: Callable[[], None]) -> StreamingPipeline:
        return StreamingPipeline(spec=spec, description=(fn.__doc__ or "").strip())

    return wrap


def run_streaming_pipeline(pipeline: PipelineSpec | StreamingPipeline | str | Path,
                           spark: "SparkSession | None" = None) -> "RunSummary":
    """Run a spec, a decorated pipeline or a TOML path to completion in this process."""
    from ematix_dagster.spark.runner import run_pipeline

    if isinstance(pipeline, StreamingPipeline):
        spec = pipeline.spec
    elif isinstance(pipeline, PipelineSpec):
        spec = pipeline
    else:
        spec = load_pipeline(pipeline)
    return run_pipeline(spec, spark=spark)
