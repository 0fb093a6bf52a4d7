"""A windowed pipeline's part of a batch when Spark keeps the window state (``[run] window_state =
"executors"``, docs/contract/window-state.md).

The query Spark runs is its own stateful aggregation (``spark.plans.executor_plan``): each batch's
``foreachBatch`` receives only the windows that batch closes, ``final``. Everything else the batch
commits is rebuilt from its input read again (``spark.batch.executor_input``): dead letters, the
counters by the driver's names, the per-source newest event times. The window state itself never
reaches the driver or the [state_store]: the store keeps the offsets, the watermark, the counters and
the open state's size as Spark's progress reported it (``executor_state_rows`` and
``executor_state_bytes``, from the batch before: a batch's own progress is made after its sink).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from ematix_dagster.fingerprint import refused_change as refusal
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.batch.batch_report import BatchReport, WindowCounts
from ematix_dagster.spark.batch.batch_step import DeadLetterSink, InTransaction
from ematix_dagster.spark.batch.convert import output_schema
from ematix_dagster.spark.batch.executor_input import ExecutorInput
from ematix_dagster.spark.input import checkpoint
from ematix_dagster.spark.plans.executor_plan import executor_aggregation
from ematix_dagster.spark.plans.executor_rows import aggregation_rows
from ematix_dagster.spark.plans.window_plan import BatchPlan, analyse
from ematix_dagster.spark.sources.readers import read_source
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.streaming.durable import Provenance, pipeline_record, restore_progress
from ematix_dagster.streaming.kinds import MICROS_PER_MS, window_kind
from ematix_dagster.streaming.micro_batch import BatchInput, input_counters
from ematix_dagster.streaming.watermark import Watermarks
from ematix_dagster.targets import WindowWriter, make_window_writer
from state_store.codec import encode_keys
from state_store.contract import BatchCommit, RecoveredState, StateStore

#: the counters that hold the open state's size as Spark's last progress reported it (set, not added)
STATE_ROWS, STATE_BYTES = "executor_state_rows", "executor_state_bytes"


@dataclass
class ExecutorProgress:
    """Where the pipeline stands: what the store keeps of a run whose window state Spark holds."""

    watermarks: Watermarks
    counters: Counter[str] = field(default_factory=Counter)
    last_batch_id: int | None = None

    def advance(self, batch: BatchInput) -> None:
        """The batch's counters, and Spark's watermark after it (its ``min`` policy): per source, the
        newest event time in ms less the lateness; the least of the sources that have delivered a
        row; never back. Spark's ``batchWatermarkMs`` of the next batch is this value."""
        marks = self.watermarks
        for name, stats in batch.sources.items():
            marks.observe(name, stats.rows, stats.max_event_ts, batch.batch_time)
        per_source = [(c.max_event_ts // MICROS_PER_MS) * MICROS_PER_MS - marks.lateness
                      for c in marks.clocks.values() if c.max_event_ts is not None]
        if per_source:
            marks.global_wm = max(min(per_source), marks.global_wm if marks.global_wm is not None else min(per_source))
        self.counters.update(input_counters(batch))
        self.last_batch_id = batch.batch_id


@dataclass
class ExecutorRead:
    """Batch N as its commit needs it: the input's counters and the windows Spark closed."""

    input: BatchInput
    windows: pa.Table  # the plan's columns (``executor_aggregation``)

    @property
    def dead_letters(self) -> dict[str, int]:
        return self.input.dead_letters


@dataclass
class ExecutorOutcome:
    rows: pa.Table  # the target's table
    state_rows: int  # Spark's open state after the batch before (its progress)
    state_bytes: int


@dataclass
class ExecutorCall:
    """Spark's stateful aggregation's call, opened once per run."""

    #: a replayed batch writes nothing twice: the target records (query, batch) with its rows
    writes_once: ClassVar[bool] = True
    engine_reads: ClassVar[bool] = False  # Spark's stream reads every source

    spec: PipelineSpec
    plan: BatchPlan
    engine: ExecutorProgress
    schema: pa.Schema  # the target's
    metrics: StreamingMetrics
    spark: SparkSession  # the session the query runs on (its manager knows the query)
    reader: ExecutorInput

    @classmethod
    def open(cls, spark: SparkSession, spec: PipelineSpec, stream: DataFrame, recovered: RecoveredState,
             store: StateStore | None, metrics: StreamingMetrics) -> ExecutorCall:
        """The run's plan analysed over the sources' stream, the progress continued from ``recovered``."""
        plan = analyse(spark, spec, stream)
        progress = ExecutorProgress(Watermarks.of(spec.window, spec.source_names))
        if recovered.record is not None:
            restore_progress(progress, recovered.record)
        return cls(spec, plan, progress, output_schema(plan), metrics, spark, ExecutorInput(plan))

    def streamed(self, stream: DataFrame) -> DataFrame:
        """The frame the query writes: the windows of Spark's aggregation over each source's rows
        (Spark's own stream of every source: the engine reads files again only for the dead letters)."""
        spark, spec = self.spark, self.spec
        sources = {s.name: aggregation_rows(spark, self.plan, read_source(spark, spec, i, self.engine_reads))
                   for i, s in enumerate(spec.sources)}
        return executor_aggregation(spec, sources)

    @staticmethod
    def start_warnings(spec: PipelineSpec) -> list[str]:
        return []

    @staticmethod
    def refused_change(spec: PipelineSpec, store: StateStore, changes: list[str]) -> str:
        """Why state written by another spec is refused: with ``window_state`` changed, the windows are
        in the other mode's place (the checkpoint, or the store) and this one cannot read them."""
        return refusal(spec.pipeline_name, f"the state in {store.description} and the checkpoint were written "
                              "for another window shape or mode", changes, "it deletes the state and the checkpoint, "
                              "never the target; the input is then read again from the start")

    def open_target(self) -> WindowWriter:
        spec = self.spec
        key = [spec.window.window_start_column, *spec.window.group_by]
        return make_window_writer(spec.target, spec.pipeline_name, self.schema, key, store_emit_kind=False)

    def idle(self, batch_id: int, batch_time: int) -> None:
        """Every batch runs Spark's aggregation: its state store keeps a version per batch."""
        return None

    def replayed(self, df: DataFrame) -> None:
        """A batch the store already holds: Spark still runs it, so that its state store writes the
        batch's version (the next batch loads it); what it writes goes nowhere."""
        df.write.format("noop").mode("overwrite").save()

    def read(self, df: DataFrame, batch_id: int, batch_time: int, letters: DeadLetterSink) -> ExecutorRead:
        """The windows Spark closes in the batch (collected once: the stateful plan runs once), then the
        batch's input read again for its counters and dead letters."""
        windows = df.toArrow()
        batch = self.reader.read(df.sparkSession, batch_id)
        if batch.dead_letters is not None:
            letters.write(batch.dead_letters)
        return ExecutorRead(batch.input, windows)

    def process(self, batch: ExecutorRead) -> ExecutorOutcome:
        engine = self.engine
        engine.advance(batch.input)
        engine.counters["windows_emitted"] += batch.windows.num_rows
        rows, state_bytes = self._spark_state()
        engine.counters[STATE_ROWS], engine.counters[STATE_BYTES] = rows, state_bytes
        return ExecutorOutcome(self._table(batch.windows), rows, state_bytes)

    def _spark_state(self) -> tuple[int, int]:
        """(rows, bytes) of Spark's state after the last batch whose progress exists (None: 0, 0)."""
        query_id = checkpoint.query_id(self.spec.run.checkpoint_location)
        query = self.spark.streams.get(query_id) if query_id else None
        progress: Any = query.lastProgress if query is not None else None
        operators = progress["stateOperators"] if progress else []
        return (sum(int(op["numRowsTotal"]) for op in operators), sum(int(op["memoryUsedBytes"]) for op in operators))

    def _table(self, windows: pa.Table) -> pa.Table:
        """Spark's windows as the target's table: ordered by window and group, a session's id, and
        ``_emit_seq`` numbering the batch's rows."""
        window = self.spec.window
        start = window.window_start_column
        if windows.num_rows:
            windows = windows.sort_by([(start, "ascending"), *((g, "ascending") for g in window.group_by)])
        columns: dict[str, Any] = {name: windows.column(name) for name in windows.column_names}
        kind = window_kind(window)
        if kind.id_column is not None:
            groups = [windows.column(g).to_pylist() for g in window.group_by]
            keys = list(zip(*groups)) if groups else [()] * windows.num_rows
            starts = windows.column(start).cast(pa.int64()).to_pylist()
            columns[kind.id_column] = kind.row_ids(self.spec.pipeline_name, encode_keys(keys), starts)
        columns["_emit_seq"] = np.arange(windows.num_rows, dtype=np.int64)
        return pa.table([pa.array(columns[f.name], type=f.type) if not isinstance(columns[f.name], pa.ChunkedArray)
                         else columns[f.name].cast(f.type) for f in self.schema], schema=self.schema)

    def flush(self, batch_id: int, batch_time: int) -> None:
        """Nothing: ``end_of_input = "flush"`` is refused in this mode (Spark writes a window only once
        the watermark passes it)."""
        return None

    def rows(self, outcome: ExecutorOutcome) -> pa.Table:
        return outcome.rows

    def commit(self, outcome: ExecutorOutcome, offsets: dict[str, str], provenance: Provenance,
               in_transaction: InTransaction) -> BatchCommit:
        """The record only: offsets, watermarks, counters (no window state: Spark checkpoints it)."""
        return BatchCommit(record=pipeline_record(self.engine, self.spec.pipeline_name, provenance, offsets),
                           in_transaction=list(in_transaction))

    def forget(self) -> None:
        """Nothing is held for a commit."""

    def report(self, batch: ExecutorRead, outcome: ExecutorOutcome, seconds: float | None) -> BatchReport:
        spec, metrics, marks = self.spec, self.metrics, self.engine.watermarks
        windows = outcome.rows.num_rows
        sources = {name: (None if c.max_event_ts is None else c.max_event_ts - marks.lateness)
                   for name, c in marks.clocks.items()}
        metrics.record_input(spec.pipeline_name, spec.window.late_data, batch.input, seconds or 0.0)
        metrics.record_final_windows(spec.pipeline_name, spec.window.kind, windows)
        metrics.record_position(spec.pipeline_name, outcome.state_rows, outcome.state_rows, marks.global_wm, sources)
        inp = batch.input
        counts = WindowCounts(windows_emitted=windows, corrections=0, early_rows=0, retractions=0,
                              late_rows=inp.late_rows, state_groups=outcome.state_rows, windows_open=outcome.state_rows)
        return BatchReport(
            batch_id=inp.batch_id, batch_time=inp.batch_time, rows_in=sum(s.rows for s in inp.sources.values()),
            rows_by_source={k: s.rows for k, s in inp.sources.items()},
            dead_letter_rows=sum(inp.dead_letters.values()), watermark=marks.global_wm, source_watermarks=sources,
            idle_sources=[], seconds=seconds or 0.0, counts=counts, filtered_rows=inp.filtered,
            totals=dict(self.engine.counters))

    def left_open(self) -> int:
        """Spark's state rows (a window's group each; a key's sessions) after the last batch reported."""
        return self.engine.counters[STATE_ROWS]

    def left_open_line(self, left: int, store: StateStore | None) -> str:
        return (f"[{self.spec.pipeline_name}] input exhausted: Spark's state ({left} rows, as of the batch before "
                f"the last) is kept in the checkpoint {self.spec.run.checkpoint_location} for the next run; a window "
                "is written once newer rows move the watermark past its end")
