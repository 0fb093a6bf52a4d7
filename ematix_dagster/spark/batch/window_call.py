"""A windowed pipeline's part of a batch: partials from Spark, the window engine on the driver.

One Spark job classifies the batch's rows and pre-aggregates them into partials
(``spark.batch.batch_job``); the driver's :class:`~ematix_dagster.streaming.micro_batch.Engine` merges
them, advances the watermarks and decides what to emit; ``[emit] sql`` then says which emitted rows
leave now (``spark.batch.emit_stage``). Everything else a batch does is ``spark.batch.batch_step.BatchStep``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from ematix_dagster.columns import CLASS
from ematix_dagster.fingerprint import refused_change as refusal
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.batch.batch_counts import batch_counts, filtered_rows, may_hold_future_rows, sources_of
from ematix_dagster.spark.batch.batch_job import BatchFrames, build_batch
from ematix_dagster.spark.batch.batch_report import BatchReport, WindowCounts
from ematix_dagster.spark.batch.batch_shuffle import BatchShuffle
from ematix_dagster.spark.batch.batch_step import DeadLetterSink, InTransaction
from ematix_dagster.spark.batch.convert import output_schema, partial_lists, rows_to_arrow
from ematix_dagster.spark.batch.emit_stage import EmitStage
from ematix_dagster.spark.plans.window_plan import BatchPlan, analyse
from ematix_dagster.spark.plans.windows.driver_late import late_windows
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.durable import Provenance, batch_commit, restore_engine
from ematix_dagster.streaming.emitted import Emitted
from ematix_dagster.streaming.micro_batch import BatchInput, BatchResult, Engine, SourceStats
from ematix_dagster.streaming.state_size import GIB, estimate_state
from ematix_dagster.targets import WindowWriter, make_window_writer
from state_store.codec import encode_keys
from state_store.contract import BatchCommit, RecoveredState, StateStore


@dataclass
class WindowCall:
    """The window engine's call, opened once per run."""

    writes_once: ClassVar[bool] = False  # its writes are idempotent by key or batch (targets)
    engine_reads: ClassVar[bool] = True  # the sources it reads itself: InputFiles

    spec: PipelineSpec
    plan: BatchPlan
    engine: Engine
    schema: pa.Schema  # the target's
    metrics: StreamingMetrics
    #: ``[emit] sql``: which emitted rows leave now (the rest wait in the store, loaded from it here)
    emit: EmitStage | None
    shuffle: BatchShuffle
    #: rows the last batch wrote, committed with it (``PipelineRecord.last_batch_rows``): the
    #: end-of-input flush numbers its rows after them, in this run or a later one with no batch
    last_batch_rows: int = 0

    @classmethod
    def open(cls, spark: SparkSession, spec: PipelineSpec, stream: DataFrame, recovered: RecoveredState,
             store: StateStore | None, metrics: StreamingMetrics) -> WindowCall:
        """The run's plan analysed over the stream, and the engine continued from ``recovered``."""
        plan = analyse(spark, spec, stream)
        engine = Engine.for_window(spec.pipeline_name, spec.window, spec.source_names, plan.integral,
                                   retractions=spec.target.retractions)
        record = restore_engine(engine, recovered, store.description if store else None)
        schema = output_schema(plan)
        emit = EmitStage.open(spec, store, schema, record.release_watermark if record else None)
        return cls(spec, plan, engine, schema, metrics, emit, BatchShuffle(),
                   record.last_batch_rows or 0 if record else 0)

    @staticmethod
    def start_warnings(spec: PipelineSpec) -> list[str]:
        """What a start warns of before it opens anything: window state larger than a machine."""
        expected = estimate_state(spec.window)
        if expected.total_bytes <= GIB:
            return []
        return [f"window state may take {expected.describe()}; lower max_groups_per_window or "
                "hll_precision if that is more than this machine has"]

    @staticmethod
    def refused_change(spec: PipelineSpec, store: StateStore, changes: list[str]) -> str:
        """Why the state written by another spec is refused."""
        return refusal(spec.pipeline_name, f"the state in {store.description} was written for another window "
                              "shape or emission", changes, "lateness, caps and idleness may change freely")

    def open_target(self) -> WindowWriter:
        spec = self.spec
        key = [spec.window.window_start_column, *spec.window.group_by]
        return make_window_writer(spec.target, spec.pipeline_name, self.schema, key,
                                  store_emit_kind=spec.window.emit_trigger.fires_early)

    def streamed(self, stream: DataFrame) -> DataFrame:
        """The query writes the sources' rows: the batch's Spark work is this call's."""
        return stream

    def replayed(self, df: DataFrame) -> None:
        """A batch the store holds needs nothing from Spark."""

    def idle(self, batch_id: int, batch_time: int) -> BatchInput:
        return BatchInput(batch_id, batch_time, {s.name: SourceStats() for s in self.spec.sources})

    def read(self, df: DataFrame, batch_id: int, batch_time: int, letters: DeadLetterSink) -> BatchInput:
        """The batch's Spark work: one job computes the partials and every counter."""
        engine, spec = self.engine, self.spec
        self.shuffle.plan(df.sparkSession)
        bounds = (engine.closed_before(), engine.emitted_before())
        late_on_driver = self.plan.late_on_driver is not None
        frames = build_batch(df.sparkSession, self.plan, df, batch_id, batch_time, *bounds, late_on_driver)
        table = frames.partials.toArrow()
        self.shuffle.ran(table)
        if late_on_driver:
            if may_hold_future_rows(spec, table, batch_time):  # this batch the exact way
                frames = build_batch(df.sparkSession, self.plan, df, batch_id, batch_time, *bounds)
                table = frames.partials.toArrow()
            else:
                table = late_windows(spec.window, table, *bounds)
        src, late = batch_counts(spec, table, frames.source_stats)
        stats = sources_of(spec, src)
        dead = self._dead_letters(letters, frames, stats, late["late_rows"], late["rejected"])
        classes = table.column(CLASS)
        windowed = table if classes.null_count == len(classes) else table.filter(pc.is_null(classes))
        kind_plan = self.plan.late_on_driver or self.plan.columns.windows  # the exact plan is built only if a batch needs it
        if kind_plan.sort_by_start:
            windowed = windowed.sort_by(kind_plan.start_column)
        starts, keys, values = partial_lists(self.plan, windowed, kind_plan.start_column, engine.state.typed_partials)
        lasts = windowed.column(kind_plan.last_column).to_pylist() if kind_plan.last_column else []
        return BatchInput(batch_id=batch_id, batch_time=batch_time, sources=stats, starts=starts, keys=keys,
                          partials=values, lasts=lasts, late_rows=late["late_rows"],
                          late_assignments=late["late_assignments"], reopened_rows=late["reopened_rows"],
                          rejected=late["rejected"], dead_letters=dead,
                          filtered=filtered_rows(stats, late["rows"]) if spec.transform_sql else 0)

    def _dead_letters(self, letters: DeadLetterSink, frames: BatchFrames, stats: dict[str, SourceStats],
                      late_rows: int, rejected: dict[str, int]) -> dict[str, int]:
        if letters.writer is None:
            return {}
        table = frames.dead_letter_table(stats, late_rows, rejected, self.spec.window.late_data == "dlq")
        return {} if table is None else letters.write(table)

    def process(self, batch: BatchInput) -> BatchResult:
        engine = self.engine
        result = engine.process(batch)
        self.last_batch_rows = len(result.emitted)
        if self.emit is not None:
            result = self.emit.release(engine, result, batch.batch_time, self._table)
        return result

    def flush(self, batch_id: int, batch_time: int) -> tuple[BatchInput, BatchResult]:
        """Every open window, emitted and closed for good.

        Its rows are numbered after the last batch's (:attr:`last_batch_rows`): a reader orders the
        two files' rows of one key by ``_emit_seq``. The flush leaves that count as it is, so a
        flush replayed after a crash numbers its rows as the first try did. Under ``[emit]`` its
        rows all wait for a later batch (docs/contract/delayed-windows.md).
        """
        engine = self.engine
        result = engine.flush(batch_id, batch_time)
        first_seq = self.last_batch_rows
        if self.emit is not None:
            result = self.emit.release(engine, result, batch_time, self._table, first_seq, flush=True)
        return BatchInput(batch_id, batch_time, {}), replace(result, first_seq=first_seq)

    def rows(self, outcome: BatchResult) -> pa.Table:
        return self._table(outcome.emitted, outcome.first_seq)

    def _table(self, emitted: Emitted, first_seq: int = 0) -> pa.Table:
        """``emitted`` as the target's table, ``_emit_seq`` from ``first_seq``."""
        ids = None
        kind = self.engine.state.kind
        if kind.id_column is not None:
            ids = kind.row_ids(self.spec.pipeline_name, encode_keys(emitted.keys), emitted.starts)
        return rows_to_arrow(self.schema, emitted, len(self.spec.window.group_by), ids, first_seq)

    def commit(self, outcome: BatchResult, offsets: dict[str, str], provenance: Provenance,
               in_transaction: InTransaction) -> BatchCommit:
        """Changed groups, evicted windows, the pending rows of ``[emit]``, offsets, watermarks, counters."""
        commit = batch_commit(self.engine, self.spec.pipeline_name, provenance, offsets, in_transaction)
        commit.record.last_batch_rows = self.last_batch_rows
        if self.emit is not None:
            self.emit.add_to(commit)
        return commit

    def forget(self) -> None:
        self.engine.state.take_column_changes()

    def report(self, batch: BatchInput, outcome: BatchResult, seconds: float | None) -> BatchReport:
        spec, metrics = self.spec, self.metrics
        if seconds is None:
            metrics.record_emit(spec.pipeline_name, spec.window.kind, outcome)
        else:
            metrics.record(spec.pipeline_name, spec.window.kind, spec.window.late_data, batch, outcome, seconds)
        if self.emit is not None:
            self.emit.record(metrics)
        counts = WindowCounts(windows_emitted=outcome.finals, corrections=outcome.corrections,
                              early_rows=outcome.early, retractions=outcome.retractions, late_rows=batch.late_rows,
                              state_groups=outcome.groups, windows_open=outcome.windows_open)
        return BatchReport(
            batch_id=batch.batch_id, batch_time=batch.batch_time, rows_in=sum(s.rows for s in batch.sources.values()),
            rows_by_source={k: s.rows for k, s in batch.sources.items()},
            dead_letter_rows=sum(batch.dead_letters.values()), watermark=outcome.watermark,
            source_watermarks=outcome.source_watermarks, idle_sources=outcome.idle_sources,
            seconds=seconds or 0.0, counts=counts, filtered_rows=batch.filtered, totals=dict(self.engine.counters))

    def left_open(self) -> int:
        """Windows (sessions) not emitted yet."""
        return self.engine.open_windows()

    def left_open_line(self, left: int, store: StateStore | None) -> str:
        """What an ``available_now`` run that did not flush leaves for the next one."""
        name = self.spec.pipeline_name
        if store is not None and store.durable:
            return f"[{name}] input exhausted: {left} open windows are kept in {store.description} for the next run"
        return (f"[{name}] warning: input exhausted with {left} open windows ({self.engine.state.group_count} "
                'groups) not emitted; with in-memory state they are lost when this process ends (use end_of_input '
                '= "flush" to emit them)')

