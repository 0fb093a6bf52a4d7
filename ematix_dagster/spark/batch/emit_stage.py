"""``[emit] sql`` in a windowed pipeline's batch (docs/contract/delayed-windows.md).

Between the engine's emission and the target write, each emitted row gets its release time from the
``[emit]`` predicate, computed over the Arrow table the target is written from
(``streaming.release_times``: the predicate's grammar evaluated as Spark would; an expression that
fails on a row is a terminal ``BatchDataError`` naming the row, since a window's row is never
dead-lettered), and the buffer (``streaming.emit_buffer``) says which rows leave now. The batch then
writes those instead of what the engine emitted, and its store commit carries the pending-row changes.
Spark analyses the predicate once, when the stage opens (``validate`` too), over no rows: a predicate
it refuses (a type mismatch) is a configuration error before any batch.

WATERMARK_TS() is the watermark the batch's sources put W at, never below the last batch's
(:meth:`~ematix_dagster.streaming.watermark.Watermarks.candidate`): a flush raises the engine's W
to close every window, and that raise must not release anything. It is committed with the batch
(``PipelineRecord.release_watermark``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import pyarrow as pa
from pyspark.sql import SparkSession
from sqlglot import exp

from ematix_dagster.errors import BatchDataError, PipelineConfigError, first_line
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.plans.safe_sql import guard_sql
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.spec.emit import predicate_columns
from ematix_dagster.sql.emit_query import KEY, emit_plan
from ematix_dagster.sql.parsing import parse_statement, text
from ematix_dagster.streaming.emit_buffer import EmitBuffer, Released
from ematix_dagster.streaming.emitted import Emitted
from ematix_dagster.streaming.micro_batch import BatchResult, Engine
from ematix_dagster.streaming.release_times import ReleaseTimes, RowFailed
from state_store.contract import BatchCommit, StateStore

_LAST_US = 2**63 - 1


@dataclass
class EmitStage:
    """A windowed pipeline's ``[emit]``: its release times, its buffer, and the last batch's outcome."""

    pipeline: str
    view: str  # the view Spark analyses the release query over (``windows`` renamed)
    sql: str  # SELECT *, <release time> AS _release_us FROM <view>: what the release times compute
    columns: tuple[str, ...]  # the columns the predicate may name
    times: ReleaseTimes
    buffer: EmitBuffer
    last: Released | None = None
    #: WATERMARK_TS() of the last batch (µs), committed with it
    release_watermark: int | None = None

    @classmethod
    def open(cls, spec: PipelineSpec, store: StateStore | None, schema: pa.Schema,
             release_watermark: int | None) -> EmitStage | None:
        """The stage of ``spec`` (None without ``[emit]``), its query analysed over the output ``schema``,
        its pending rows loaded from ``store`` and the last committed WATERMARK_TS()."""
        if spec.emit is None:
            return None
        assert store is not None  # the spec requires a durable one
        stage = cls.analysed(spec, schema)
        stage.buffer.restore(store.load_pending(spec.pipeline_name, _LAST_US))
        stage.release_watermark = release_watermark
        return stage

    @classmethod
    def analysed(cls, spec: PipelineSpec, schema: pa.Schema) -> EmitStage:
        """The stage, its buffer empty, its query analysed by Spark over no rows of the output ``schema``
        (``validate`` calls it too): a predicate Spark refuses (a type mismatch, an unknown function) is a
        ``PipelineConfigError`` on ``emit.sql`` before any batch, not a failed batch."""
        assert spec.emit is not None and spec.emit.max_buffered_rows is not None  # the spec requires both
        columns = predicate_columns(spec.window)
        plan = emit_plan(spec.emit.sql, columns)
        tree = parse_statement(plan.sql, KEY)
        view = f"_emit_windows_{spec.pipeline_name.replace('-', '_')}"  # the pipeline's own, in a shared session
        for table in tree.find_all(exp.Table):
            table.set("this", exp.to_identifier(view))
        stage = cls(spec.pipeline_name, view, guard_sql(text(tree)).sql, columns, ReleaseTimes(plan.branches, columns),
                    EmitBuffer(spec.pipeline_name, spec.emit.max_buffered_rows))
        empty = schema.empty_table().select(list(columns))
        try:
            spark = SparkSession.active()
            spark.createDataFrame(empty).createOrReplaceTempView(view)
            spark.sql(stage.sql).schema  # noqa: B018 - analysing is the point
            stage.times.of(empty)
        except Exception as exc:  # noqa: BLE001 - Spark's analysis errors have no common public type
            raise PipelineConfigError(KEY, f"does not run over the emitted rows: {first_line(exc)}",
                                      f"compare window bounds ({', '.join(columns[:2])}: TIMESTAMP) or group "
                                      "columns with WATERMARK_TS(), e.g. window_end + INTERVAL 1 HOUR <= "
                                      "WATERMARK_TS()") from None
        return stage

    def release(self, engine: Engine, result: BatchResult, batch_time: int, table: Callable[[Emitted], pa.Table],
                first_seq: int = 0, flush: bool = False) -> BatchResult:
        """``result`` with the rows that leave now as its emitted rows; ``table`` makes the target's table."""
        counters, before = engine.counters, self.release_watermark
        watermark = before if flush else _at_least(engine.watermarks.candidate(batch_time), before)
        self.release_watermark = watermark
        emitted = result.emitted
        self.last = last = self.buffer.process(result.batch_id, emitted, self.release_times(table(emitted)),
                                               watermark, first_seq, flush)
        counters["released_rows"] += len(last.released)
        counters["filtered_rows:not_released"] += last.not_released
        return replace(result, emitted=last.released)

    def release_times(self, rows: pa.Table) -> pa.Array:
        """Each row's release time, in row order."""
        try:
            return self.times.of(rows)
        except RowFailed as failed:
            raise BatchDataError(
                f"pipeline {self.pipeline}: [emit] sql failed on an emitted row ({failed}), so its release time "
                f"is unknown: {rows.select(list(self.columns)).slice(failed.row, 1).to_pylist()[0]}",
                way_out="write the predicate so that it cannot fail on a window bound or group value (a window "
                        "row is never dead-lettered), then reset the pipeline or fix the predicate's input") from None

    def add_to(self, commit: BatchCommit) -> None:
        """The last batch's pending-row changes and WATERMARK_TS(), in its store transaction."""
        commit.record.release_watermark = self.release_watermark
        if self.last is not None:
            self.last.changes.add_to(commit)

    def record(self, metrics: StreamingMetrics) -> None:
        """Buffered, released and never-released rows, and the output watermark (as a row pipeline's)."""
        last = self.last
        if last is not None:
            metrics.record_release(self.pipeline, len(last.released), last.not_released, last.pending,
                                   last.output_watermark)


def _at_least(value: int | None, floor: int | None) -> int | None:
    if value is None or floor is None:
        return floor if value is None else value
    return max(value, floor)
