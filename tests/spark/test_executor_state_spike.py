"""What ``[run] window_state = "executors"`` builds on, pinned down: Spark's own stateful windowed aggregation
on the RocksDB state store provider, written in append mode, on PySpark 4.3.0 (local[2], 2 shuffle
partitions, parquet file sources read with ``maxFilesPerTrigger = 1``, so file i of a source is
micro-batch i). Each test is one finding, asserted against a ground truth computed in plain
Python/pandas over the same events.

What works:

* **Query shape.** Two file sources, each ``withWatermark(ts, "10 seconds")``, unioned, with
  ``spark.sql.streaming.multipleWatermarkPolicy = min``; ``groupBy(window(ts, "1 minute"), user_id)``
  with ``count``, ``sum`` and ``hll_sketch_agg(item, 12)``; ``hll_sketch_estimate`` applies in the same
  query (a projection after the aggregate), no foreachBatch step needed. Output mode append, sink
  foreachBatch. Hopping windows (``window(ts, "2 minutes", "1 minute")``) and ``session_window(ts,
  "30 seconds")`` work the same way, ``hll_sketch_agg`` included, two sources with the min policy too.
* **Watermark.** The watermark in effect during batch N (progress ``eventTime.watermark`` of batch N,
  the offset log's ``batchWatermarkMs``) is min over the sources *that have had rows* of
  (max event time seen - lateness), from batches 0..N-1; a source that had rows and gets none newer
  holds it (source b at 65 in batch 3 of the first test). That a source without any row yet does not
  hold it back is Spark's code (only watermark operators with rows count), not checked here.
* **Emission.** A window is written once, final, in the batch whose watermark W satisfies
  ``window.end <= W`` (not strict: a window whose end equals the watermark is written); session
  windows likewise on ``session.end = last event + gap``. A window with ``end > W_final`` stays in state
  (``end > max event time - lateness``, with the min over sources).
* **Late rows.** A row arriving in batch N is dropped iff its *window's end* <= the watermark of batch
  **N-1** (the late-event watermark lags the eviction watermark by one batch, as Spark 4's
  ``PropagateWatermarkSimulator`` does it). A row older than the current watermark whose window is still open
  is aggregated, and so is a row of a window evicted in this very batch, before the eviction: nothing
  is written twice. ``stateOperators[0].numRowsDroppedByWatermark`` counts rows after partial
  aggregation (per input partition and key): 8 late rows of 2 keys in one file count 2.
  No SQL function reads the watermark (``SHOW FUNCTIONS LIKE '*watermark*'`` is empty), so an
  ``observe`` on the input cannot count late input rows; the exact count is the reconciliation
  ``numInputRows - (count(*) written in the batch + count(*) in state after it - in state before)``,
  the state sums read with the ``statestore`` source at ``batchId`` N and N-1 (asserted exact).
* **Triggers.** ``availableNow`` ends with a no-data batch (``numInputRows`` 0) that advances the
  watermark and writes the windows it closes, in the same run; with
  ``spark.sql.streaming.noDataMicroBatches.enabled = false`` they are written only by the next run's
  first batch. A second ``availableNow`` run on the same checkpoint picks up only the new files and
  the state: windows spanning the two runs are whole. ``processingTime`` works alike (start, add a
  file, the window is written within seconds, stop).
* **Restart.** A batch whose commit log entry was lost (a crash after the sink, before the commit) is
  run again on restart with the same batch id and the same rows, so a sink idempotent by batch id
  writes it once; the RocksDB state (changelog checkpointing) is restored from the checkpoint.
* **Configuration.** The state store confs are SQL confs: session level, no per-query option. A query
  clones its session inside ``start()`` (StreamExecution's ``sparkSessionForStream`` is set in its
  constructor), so a conf changed after ``start()`` returns does not reach it; a query still should
  get them from ``spark.newSession()`` (its own SQL conf, the same SparkContext), leaving the shared
  session untouched, as the tests do. The provider class, the watermark policy and the shuffle
  partitions are written in the offset log: a checkpoint keeps the provider it was created with (a HDFS-backed checkpoint
  restarted under a RocksDB session conf stays HDFS-backed). Changelog checkpointing is not in the
  offset log; ``state/0/<partition>/<version>.changelog`` files show it on.
* **Numbers.** Progress ``stateOperators[0]``: ``numRowsTotal`` (keys in state after the batch),
  ``numRowsUpdated``, ``numRowsRemoved`` (summed over batches = rows written, in append mode),
  ``memoryUsedBytes``, ``numShufflePartitions``, ``numStateStoreInstances``, RocksDB ``customMetrics`` (``rocksdbPutCount``,
  ``rocksdbGetCount``, ``rocksdbTotalBytesWritten``, ``rocksdbSstFileSize``, ``rocksdbCommit*``,
  ``rocksdbPinnedBlocksMemoryUsage``, ``SnapshotLastUploaded.partition_<i>_default``, ...).
  ``spark.read.format("statestore").load(checkpoint)`` works with RocksDB + changelog: columns
  ``key`` (struct: window{start, end}, user_id), ``value`` (struct of the aggregate buffers: count,
  sum, ``buf``: the HLL sketch as binary), ``partition_id``; option ``batchId`` reads the state after
  that batch. ``format("state-metadata")`` lists the operator (``stateStoreSave``) and its batch range.

What does not: nothing asked failed on 4.3. The limits are semantic: late input rows cannot be counted
in the query itself (only reconciled as above), ``numRowsDroppedByWatermark`` is not a row count, a
source that stops getting rows holds the min watermark (its windows and everyone's stay open), and
a checkpoint cannot change provider (nor, from its offset log, watermark policy or shuffle partitions).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from tests.conftest import BatchFiles

pytestmark = pytest.mark.slow  # a spike's findings: ~50 s of Spark, kept out of the fast set

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)  # event times below are seconds after it
T0_S = int(T0.timestamp())
LATENESS_S = 10
MINUTE = 60
GAP_S = 30
DDL = "user_id STRING, ts TIMESTAMP, item STRING, v BIGINT"
ARROW_SCHEMA = pa.schema([("user_id", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                          ("item", pa.string()), ("v", pa.int64())])


@dataclass(frozen=True)
class Event:
    user: str
    t: float  # seconds after T0_S
    item: str = "i1"
    v: int = 1


Batch = dict[str, list[Event]]  # source name -> the rows of its one file in this micro-batch
Row = tuple  # (start, end, user_id, n, s, est), window bounds in seconds after T0_S


# -- Spark side ---------------------------------------------------------------------------------------



def write_batches(root: Path, batches: list[Batch], first: int = 0) -> None:
    """One parquet file per source and batch, in batch order (file i is micro-batch i); ``first``: the
    index of the first batch, for files added to a directory that already has ``first`` files."""
    sources: dict[str, BatchFiles] = {}
    for batch in batches:
        for name, events in batch.items():
            if name not in sources:
                sources[name] = BatchFiles(root / name)
                sources[name].count = first
            sources[name].write([{"user_id": e.user, "ts": T0 + dt.timedelta(seconds=e.t),
                                  "item": e.item, "v": e.v} for e in events], ARROW_SCHEMA)


def read_sources(session: SparkSession, root: Path, names: list[str]) -> DataFrame:
    frames = [session.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(str(root / name))
              .withWatermark("ts", f"{LATENESS_S} seconds") for name in names]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def aggregate(events: DataFrame, window: Column) -> DataFrame:
    """count, sum and a distinct-item estimate per (window, user), window bounds as seconds after T0_S."""
    grouped = events.groupBy(window.alias("w"), "user_id").agg(
        F.count("*").alias("n"), F.sum("v").alias("s"), F.hll_sketch_agg("item", 12).alias("sketch"))
    return grouped.select((F.unix_seconds(F.col("w.start")) - T0_S).alias("start"),
                          (F.unix_seconds(F.col("w.end")) - T0_S).alias("end"), "user_id", "n", "s",
                          F.hll_sketch_estimate("sketch").alias("est"))


class BatchSink:
    """foreachBatch sink idempotent by batch id: a batch run again replaces its rows; ``calls`` has every call."""

    def __init__(self) -> None:
        self.batches: dict[int, list[Row]] = {}
        self.calls: list[int] = []

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        self.calls.append(batch_id)
        self.batches[batch_id] = sorted(tuple(row) for row in frame.collect())

    def rows(self) -> list[Row]:
        return sorted(row for rows in self.batches.values() for row in rows)


def start(frame: DataFrame, checkpoint: Path, sink: BatchSink, **trigger: object) -> StreamingQuery:
    return (frame.writeStream.outputMode("append").foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())  # type: ignore[arg-type]


def run_available_now(frame: DataFrame, checkpoint: Path, sink: BatchSink) -> StreamingQuery:
    query = start(frame, checkpoint, sink, availableNow=True)
    query.awaitTermination()
    return query


def progress_watermarks(query: StreamingQuery) -> list[float]:
    """Each batch's ``eventTime.watermark``, in seconds after T0_S."""
    return [pd.Timestamp(p["eventTime"]["watermark"]).timestamp() - T0_S for p in query.recentProgress]


def state_count_sum(session: SparkSession, checkpoint: Path, batch_id: int) -> int:
    """Sum of the ``count(*)`` buffers in state after batch ``batch_id``."""
    state = session.read.format("statestore").option("batchId", batch_id).load(str(checkpoint))
    return int(state.agg(F.coalesce(F.sum("value.count"), F.lit(0))).first()[0])


# -- ground truth ------------------------------------------------------------------------------------


def watermarks(batches: list[Batch]) -> list[float]:
    """The watermark in effect during each batch and during one more (a trailing no-data batch): min
    over the sources that have had rows of (their max event time so far - lateness), -inf before any."""
    highest: dict[str, float] = {}
    marks = []
    for batch in [*batches, {}]:
        marks.append(min(highest.values()) - LATENESS_S if highest else -math.inf)
        for name, events in batch.items():
            if events:
                highest[name] = max([highest.get(name, -math.inf), *(e.t for e in events)])
    return marks


def tumbling_end(event: Event) -> float:
    return (event.t // MINUTE + 1) * MINUTE


def accepted(batches: list[Batch]) -> list[Event]:
    """Rows aggregated: those whose window ends after the watermark of the batch *before* theirs."""
    marks = watermarks(batches)
    return [e for n, batch in enumerate(batches) for events in batch.values() for e in events
            if n == 0 or tumbling_end(e) > marks[n - 1]]


def windows_of(events: list[Event], spans: Callable[[Event], list[tuple[float, float]]]) -> pd.DataFrame:
    frame = pd.DataFrame([{"start": start, "end": end, "user_id": e.user, "item": e.item, "v": e.v}
                          for e in events for start, end in spans(e)])
    return frame.groupby(["start", "end", "user_id"], as_index=False).agg(
        n=("v", "size"), s=("v", "sum"), est=("item", "nunique"))


def closed_rows(frame: pd.DataFrame, watermark: float) -> list[Row]:
    """The windows written once the watermark is ``watermark``: end <= watermark."""
    done = frame[frame["end"] <= watermark]
    return sorted((int(r.start), int(r.end), r.user_id, int(r.n), int(r.s), int(r.est))
                  for r in done.itertuples())


def tumbling(e: Event) -> list[tuple[float, float]]:
    return [(tumbling_end(e) - MINUTE, tumbling_end(e))]


def hopping(e: Event) -> list[tuple[float, float]]:
    """2-minute windows every minute: the two starting at the event's minute and the one before."""
    return [(start, start + 2 * MINUTE) for start in (tumbling_end(e) - 2 * MINUTE, tumbling_end(e) - MINUTE)]


def sessions(events: list[Event]) -> pd.DataFrame:
    """Per user, events less than GAP_S apart chain into one session [first, last + GAP_S)."""
    rows = []
    for user in sorted({e.user for e in events}):
        mine = sorted((e for e in events if e.user == user), key=lambda e: e.t)
        group: list[Event] = []
        for e in mine:
            if group and e.t >= group[-1].t + GAP_S:
                rows.append((group[0].t, group[-1].t + GAP_S, user, group))
                group = []
            group.append(e)
        rows.append((group[0].t, group[-1].t + GAP_S, user, group))
    return pd.DataFrame([{"start": s, "end": end, "user_id": u, "n": len(g), "s": sum(e.v for e in g),
                          "est": len({e.item for e in g})} for s, end, u, g in rows])


# -- 1. tumbling windows, two sources, min policy ------------------------------------------------------

TWO_SOURCES: list[Batch] = [
    {"a": [Event("u1", 5, "i1", 1), Event("u1", 10, "i2", 2), Event("u2", 30, "i1", 3)],
     "b": [Event("u1", 20, "i1", 4), Event("u2", 50, "i3", 5)]},            # -> W = min(20, 40) = 20
    {"a": [Event("u1", 70, "i1", 6), Event("u2", 80, "i2", 7)],
     "b": [Event("u1", 75, "i3", 8), Event("u1", 2, "i9", 9)]},             # ts 2 < W 20, window open: kept
    {"a": [Event("u1", 130, "i1", 10)],                                     # a -> 120, b still 65
     "b": [Event("u1", 40, "i4", 11)]},   # window [0, 60) ends <= W 65 of this batch, > W 20 before: kept
    {"a": [Event("u1", 59.999, "i5", 12), Event("u2", 61, "i5", 13)],       # [0, 60) closed (60 <= 65): dropped
     "b": [Event("u2", 131, "i1", 14)]},  # u2@61 kept: ts < 65 but [60, 120) open; b -> 121, W = 120
]


def test_tumbling_windows_of_two_sources_are_written_once_when_the_watermark_reaches_their_end(
        session: SparkSession, tmp_path: Path) -> None:
    write_batches(tmp_path, TWO_SOURCES)
    sink = BatchSink()
    query = run_available_now(aggregate(read_sources(session, tmp_path, ["a", "b"]), F.window("ts", "1 minute")),
                              tmp_path / "checkpoint", sink)

    marks = watermarks(TWO_SOURCES)
    assert marks[1:] == [20, 65, 65, 120]  # the min policy: source b holds the watermark at 65 in batch 3
    assert progress_watermarks(query)[1:] == marks[1:]
    # every window once, final; [60, 120) ends exactly at the final watermark 120 and is written,
    # [120, 180) (end > max event time - lateness = 120) is not
    truth = closed_rows(windows_of(accepted(TWO_SOURCES), tumbling), marks[-1])
    assert sink.rows() == truth
    assert {(row[0], row[1]) for row in truth} == {(0, 60), (60, 120)}
    assert len({row[:3] for row in sink.rows()}) == len(sink.rows())
    assert accepted(TWO_SOURCES) == [e for b in TWO_SOURCES for es in b.values() for e in es if e.t != 59.999]
    assert sum(p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in query.recentProgress) == 1
    assert [p["numInputRows"] for p in query.recentProgress] == [5, 4, 2, 3, 0]  # ends with a no-data batch


def test_a_row_of_a_closed_window_is_dropped_by_the_previous_batch_watermark(
        session: SparkSession, tmp_path: Path) -> None:
    """Batch 2 runs under W = 120 but drops only windows ending <= 20 (batch 1's): its rows of [0, 60) and
    [60, 120) are aggregated, then both windows are evicted and written in that same batch."""
    batches: list[Batch] = [{"a": [Event("u1", 30)]}, {"a": [Event("u1", 130)]},
                            {"a": [Event("u1", 65), Event("u3", 5), Event("u1", 125)]}]
    write_batches(tmp_path, batches)
    sink = BatchSink()
    query = run_available_now(aggregate(read_sources(session, tmp_path, ["a"]), F.window("ts", "1 minute")),
                              tmp_path / "checkpoint", sink)

    assert progress_watermarks(query)[1:3] == [20, 120]
    assert sink.batches[2] == [(0, 60, "u1", 1, 1, 1), (0, 60, "u3", 1, 1, 1), (60, 120, "u1", 1, 1, 1)]
    assert sink.rows() == closed_rows(windows_of(accepted(batches), tumbling), watermarks(batches)[-1])


# -- 2. hopping and session windows ----------------------------------------------------------------------

OTHER_WINDOWS: list[Batch] = [
    {"a": [Event("u1", 5, "i1", 1), Event("u1", 20, "i2", 2), Event("u2", 30, "i1", 3)],
     "b": [Event("u1", 40, "i3", 4), Event("u2", 100, "i1", 5)]},
    {"a": [Event("u1", 150, "i1", 6), Event("u2", 200, "i2", 7)],
     "b": [Event("u1", 160, "i2", 8), Event("u2", 300, "i1", 9)]},          # -> W = min(190, 290) = 190
]


@pytest.mark.parametrize("kind", ["hopping", "session"])
def test_hopping_and_session_windows_with_hll_sketches_in_append_mode(
        session: SparkSession, tmp_path: Path, kind: str) -> None:
    write_batches(tmp_path, OTHER_WINDOWS)
    window = F.window("ts", "2 minutes", "1 minute") if kind == "hopping" else F.session_window("ts", "30 seconds")
    sink = BatchSink()
    query = run_available_now(aggregate(read_sources(session, tmp_path, ["a", "b"]), window),
                              tmp_path / "checkpoint", sink)

    events = [e for batch in OTHER_WINDOWS for es in batch.values() for e in es]
    final = watermarks(OTHER_WINDOWS)[-1]
    assert final == 190 and progress_watermarks(query)[-1] == final
    truth = closed_rows(windows_of(events, hopping) if kind == "hopping" else sessions(events), final)
    assert sink.rows() == truth
    if kind == "session":  # u1's session [150, 190) ends exactly at the watermark: written
        assert (150, 190, "u1", 2, 14, 2) in truth
    assert query.lastProgress["stateOperators"][0]["operatorName"] == (
        "stateStoreSave" if kind == "hopping" else "sessionWindowStateStoreSaveExec")


# -- 3. triggers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("no_data_batches", [True, False])
def test_available_now_runs_on_one_checkpoint(session: SparkSession, tmp_path: Path, no_data_batches: bool) -> None:
    """Run 1 ends with W = 60 (closing [0, 60)); run 2 adds a file that closes [60, 120), which spans the runs."""
    session.conf.set(NO_DATA_BATCHES, str(no_data_batches).lower())
    first: list[Batch] = [{"a": [Event("u1", 5), Event("u1", 65, "i2")]}, {"a": [Event("u1", 70, "i3")]}]
    second: list[Batch] = [{"a": [Event("u1", 100, "i4"), Event("u1", 135)]}]
    write_batches(tmp_path / "run1", first)
    frame = aggregate(read_sources(session, tmp_path / "run1", ["a"]), F.window("ts", "1 minute"))
    sink = BatchSink()
    run_available_now(frame, tmp_path / "checkpoint", sink)
    window_0 = closed_rows(windows_of(accepted(first), tumbling), watermarks(first)[-1])
    assert window_0 == [(0, 60, "u1", 1, 1, 1)]
    assert sink.rows() == (window_0 if no_data_batches else [])

    write_batches(tmp_path / "run1", second, first=len(first))
    query = run_available_now(frame, tmp_path / "checkpoint", sink)
    everything = first + second
    marks = watermarks(everything)  # [-2]: after run 2's data batch, [-1]: after a no-data batch
    closed = closed_rows(windows_of(accepted(everything), tumbling), marks[-1 if no_data_batches else -2])
    assert sink.rows() == closed
    assert ((60, 120, "u1", 3, 3, 3) in closed) is no_data_batches  # state of run 1 restored into run 2
    assert query.recentProgress[0]["batchId"] == (3 if no_data_batches else 2)
    assert [p["numInputRows"] for p in query.recentProgress] == ([2, 0] if no_data_batches else [2])


def test_processing_time_trigger_writes_a_window_once_the_watermark_passes_it(
        session: SparkSession, tmp_path: Path) -> None:
    write_batches(tmp_path, [{"a": [Event("u1", 5)]}])
    sink = BatchSink()
    query = start(aggregate(read_sources(session, tmp_path, ["a"]), F.window("ts", "1 minute")),
                  tmp_path / "checkpoint", sink, processingTime="200 milliseconds")
    try:
        write_batches(tmp_path, [{"a": [Event("u1", 75)]}], first=1)
        deadline = time.monotonic() + 60
        while not sink.rows() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        query.stop()
    assert sink.rows() == [(0, 60, "u1", 1, 1, 1)]


# -- 4. restart -------------------------------------------------------------------------------------------------


def test_a_batch_whose_commit_was_lost_is_run_again_with_the_same_id_and_rows(
        session: SparkSession, tmp_path: Path) -> None:
    batches: list[Batch] = [{"a": [Event("u1", 5), Event("u2", 10)]}, {"a": [Event("u1", 50, "i2"), Event("u1", 80)]},
                            {"a": [Event("u2", 70), Event("u1", 200)]}]
    write_batches(tmp_path, batches)
    frame = aggregate(read_sources(session, tmp_path, ["a"]), F.window("ts", "1 minute"))
    checkpoint = tmp_path / "checkpoint"
    sink = BatchSink()
    run_available_now(frame, checkpoint, sink)
    last = max(sink.batches)
    written = dict(sink.batches)
    for lost in (f"{last}", f".{last}.crc"):  # as if the process died after the sink, before the commit
        (checkpoint / "commits" / lost).unlink()

    run_available_now(frame, checkpoint, sink)
    assert sink.calls.count(last) == 2 and sink.batches == written
    assert sink.rows() == closed_rows(windows_of(accepted(batches), tumbling), watermarks(batches)[-1])
    assert any(checkpoint.glob("state/0/0/*.changelog"))


# -- 5. late rows ---------------------------------------------------------------------------------------------------


def test_rows_dropped_by_watermark_count_partial_aggregates_and_the_exact_count_is_reconciled(
        session: SparkSession, tmp_path: Path) -> None:
    late = [Event("u1", 1 + i) for i in range(5)] + [Event("u2", 2 + i) for i in range(3)]
    batches: list[Batch] = [{"a": [Event("u1", 30)]}, {"a": [Event("u1", 130)]}, {"a": [Event("u1", 135)]},
                            {"a": [*late, Event("u1", 125)]}]  # W of batch 2 = 120: [0, 60) is closed
    write_batches(tmp_path, batches)
    observed = read_sources(session, tmp_path, ["a"]).observe("input", F.count(F.lit(1)).alias("rows"))
    sink = BatchSink()
    checkpoint = tmp_path / "checkpoint"
    query = run_available_now(aggregate(observed, F.window("ts", "1 minute")), checkpoint, sink)

    progress = query.recentProgress[3]
    assert [e for e in batches[3]["a"] if e not in accepted(batches)] == late
    assert progress["stateOperators"][0]["numRowsDroppedByWatermark"] == 2  # one per key, not 8
    assert progress["observedMetrics"]["input"]["rows"] == progress["numInputRows"] == 9
    assert session.sql("SHOW FUNCTIONS LIKE '*watermark*'").count() == 0  # no expression sees the watermark
    written = sum(row[3] for row in sink.batches[3])
    aggregated = written + state_count_sum(session, checkpoint, 3) - state_count_sum(session, checkpoint, 2)
    assert progress["numInputRows"] - aggregated == 8


# -- 6. numbers and the statestore source -----------------------------------------------------------------------------


def test_progress_metrics_and_the_statestore_source(session: SparkSession, tmp_path: Path) -> None:
    write_batches(tmp_path, TWO_SOURCES)
    checkpoint = tmp_path / "checkpoint"
    sink = BatchSink()
    query = run_available_now(aggregate(read_sources(session, tmp_path, ["a", "b"]), F.window("ts", "1 minute")),
                              checkpoint, sink)

    assert sum(p["stateOperators"][0]["numRowsRemoved"] for p in query.recentProgress) == len(sink.rows())
    open_windows = windows_of(accepted(TWO_SOURCES), tumbling).query(f"end > {watermarks(TWO_SOURCES)[-1]}")
    operator = query.lastProgress["stateOperators"][0]
    assert operator["numRowsTotal"] == len(open_windows) == 2
    assert operator["memoryUsedBytes"] > 0 and operator["numStateStoreInstances"] == 2
    assert {"rocksdbPutCount", "rocksdbGetCount", "rocksdbTotalBytesWritten", "rocksdbSstFileSize",
            "rocksdbCommitCheckpointLatency", "rocksdbPinnedBlocksMemoryUsage",
            "SnapshotLastUploaded.partition_0_default"} <= set(operator["customMetrics"])

    state = session.read.format("statestore").load(str(checkpoint))
    assert state.columns == ["key", "value", "partition_id"]
    assert state.schema["key"].dataType.simpleString() == "struct<window:struct<start:timestamp,end:timestamp>,user_id:string>"
    assert state.schema["value"].dataType.simpleString() == "struct<count:bigint,sum:bigint,buf:binary>"
    keys = sorted((int(r.start) - T0_S, r.user_id, r.n) for r in state.select(
        F.unix_seconds("key.window.start").alias("start"), "key.user_id", F.col("value.count").alias("n")).collect())
    assert keys == sorted((int(r.start), r.user_id, int(r.n)) for r in open_windows.itertuples())
    metadata = session.read.format("state-metadata").load(str(checkpoint)).first()
    assert (metadata.operatorName, metadata.minBatchId, metadata.maxBatchId) == ("stateStoreSave", 0, 4)


def test_a_query_keeps_the_conf_of_its_start_and_a_checkpoint_its_provider(
        session: SparkSession, tmp_path: Path) -> None:
    """The query clones its session in ``start()`` (StreamExecution's ``sparkSessionForStream``), so a conf
    set after ``start()`` returns does not reach it; a restart reads the provider from the offset log."""
    batches: list[Batch] = [{"a": [Event("u1", 5)]}, {"a": [Event("u1", 70)]}]
    write_batches(tmp_path, batches)
    frame = aggregate(read_sources(session, tmp_path, ["a"]), F.window("ts", "1 minute"))
    session.conf.set(PROVIDER, HDFS)
    query = start(frame, tmp_path / "checkpoint", BatchSink(), availableNow=True)
    session.conf.set(PROVIDER, ROCKSDB)
    query.awaitTermination()
    assert is_hdfs_backed(query)
    write_batches(tmp_path, [{"a": [Event("u1", 130)]}], first=len(batches))
    assert is_hdfs_backed(run_available_now(frame, tmp_path / "checkpoint", BatchSink()))
    offsets = (tmp_path / "checkpoint" / "offsets" / "2").read_text()
    assert f'"{PROVIDER}":"{HDFS}"' in offsets and '"spark.sql.streaming.multipleWatermarkPolicy":"min"' in offsets
    assert "changelogCheckpointing" not in offsets


def is_hdfs_backed(query: StreamingQuery) -> bool:
    metrics = set(query.lastProgress["stateOperators"][0]["customMetrics"])
    return "loadedMapCacheHitCount" in metrics and not any(m.startswith("rocksdb") for m in metrics)
