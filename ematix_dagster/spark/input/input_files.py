"""Files the engine reads itself: the batches of the *managed* files sources.

Spark's file stream reads every file of a batch in one scan, and inside ``foreachBatch`` that scan
is opaque: a file cannot be left out of it, nor read with another schema. So for managed files
sources (``Source.read_by_engine``: ``on_unreadable_file = "skip"``, and every parquet source on a
local path) the stream only lists the files (Spark's ``binaryFile`` format, its ``content`` never
selected) and logs each batch's list in the checkpoint (``sources/<i>/``,
:func:`.checkpoint.batch_files`), and :class:`InputFiles` reads that list in the batch, file group
by file group:

* a parquet footer is checked first with pyarrow (cheap: the footer only). A file whose footer
  does not read (truncated, not parquet) or whose column has a type Spark cannot read as the
  declared one (a STRING where BIGINT is declared) is *unreadable*; a file Spark still fails on
  (a corrupt page) is found from Spark's ``FAILED_READ_FILE`` error (:mod:`.read_errors`) and the
  batch step plans the batch again without it (:meth:`InputFiles.leave_out`), so no row of an
  unreadable file ever reaches the batch.
* ``on_unreadable_file = "fail"`` (the default) stops the run with :class:`UnreadableInputFile`
  (or :class:`InputSchemaMismatch` for a column type) naming the file and the way out; ``"skip"``
  leaves the file out, counts it (``unreadable_files:<source>`` in the stored counters,
  ``ematix_streaming_unreadable_files_total{pipeline,source}``) and writes one dead-letter row
  per file (``_reason = "unreadable_file"``, ``_file_path``, ``_file_error``, ``_file_rows``).
  A file removed after its batch listed it is left out in both modes and recorded the same way
  (moving a bad file away is a way out of "fail").
* parquet TIMESTAMP(NANOS) columns (pandas' default) that the schema declares TIMESTAMP or
  TIMESTAMP_NTZ are read as BIGINT nanoseconds and truncated to microseconds (floor, so
  ``...00.123456789`` becomes ``...00.123456``), the precision of Spark's timestamps.

What a batch reads is a function of the checkpoint's file list and the files' bytes, so a
replayed batch skips the same files as the original did.

This module reads, records and retries (:meth:`InputFiles.attempt`); what a batch does with the
rows is the batch step's (windowed or row pipeline), handed in as a function.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import reduce
from typing import Callable, TypeVar, cast
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client import Counter
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ematix_dagster.columns import BATCH_ID, EVENT_TS, FILE_ERROR, FILE_PATH, FILE_ROWS, REASON, SOURCE
from ematix_dagster.errors import first_line
from ematix_dagster.spark.batch.batch_shuffle import one_task_bytes
from ematix_dagster.spark.failures.read_errors import REPLACE_FILE, ReadFailure, read_failure, type_mismatch, url_path
from ematix_dagster.spark.input.checkpoint import batch_files
from ematix_dagster.spark.input.file_dead_letters import DeadLetters, WithFileRows
from ematix_dagster.spark.sources.readers import (
    format_options,
    parse_schema,
    read_schema,
    with_engine_columns,
)
from ematix_dagster.spec import PipelineSpec

UNREADABLE_FILE = "unreadable_file"
_MISSING = "the file no longer exists (it was removed after its batch listed it)"
_INTEGRAL_OR_TIME = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DateType,
                     T.TimestampType, T.TimestampNTZType)
_NOT_BYTES = ("BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE")


@dataclass(frozen=True)
class InputFile:
    """One file of a managed source's batch, as far as its footer tells (parquet, local path)."""

    url: str  # as the source's log names it
    nanos: frozenset[str] = frozenset()  # TIMESTAMP(_NTZ) columns the file holds as TIMESTAMP(NANOS)
    rows: int | None = None  # rows its footer declares
    size: int | None = None  # its bytes, where it is a local file
    failure: ReadFailure | None = None  # why it cannot be read; None: nothing known against it
    missing: bool = False  # removed after its batch listed it: left out under "fail" too

    @property
    def path(self) -> str:
        return url_path(self.url)


def _missing(url: str) -> InputFile:
    return InputFile(url, failure=ReadFailure(url, _MISSING, f"input file {url_path(url)}: {_MISSING}", "", False),
                     missing=True)


def _local(url: str) -> InputFile:  # not parquet: Spark checks it; its size, or that it is gone
    try:
        return InputFile(url, size=os.stat(url_path(url)).st_size)
    except FileNotFoundError:
        return _missing(url)
    except OSError:
        return InputFile(url)  # not about the bytes: Spark reads it, or says what is wrong


def _declared_type_refused(dtype: T.DataType, physical: str, logical: str) -> bool:
    """A parquet column that Spark refuses to read as ``dtype`` whatever its values (checked against
    Spark 4.3: strings and booleans never become numbers, times or each other). Other pairs are left
    to Spark, whose error then names the file."""
    if isinstance(dtype, (T.StringType, T.BinaryType)):
        return physical in _NOT_BYTES
    if isinstance(dtype, T.BooleanType):
        return physical != "BOOLEAN"
    if isinstance(dtype, _INTEGRAL_OR_TIME):
        return physical in ("BYTE_ARRAY", "BOOLEAN")
    if isinstance(dtype, T.DecimalType):
        return physical == "BOOLEAN" or (physical == "BYTE_ARRAY" and logical != "DECIMAL")
    return False  # nested types: Spark decides


def inspect_parquet(url: str, schema: T.StructType) -> InputFile:
    """Read a local parquet file's footer: its row count, its TIMESTAMP(NANOS) columns and, when it
    cannot be read or a column cannot be read as declared, why."""
    path = url_path(url)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return _missing(url)
    except OSError:
        return InputFile(url)  # not about the bytes: Spark reads it, or says what is wrong
    if size == 0:
        return InputFile(url, rows=0, size=0)  # Spark reads an empty file as no rows
    try:
        meta = pq.read_metadata(path)
    except (PermissionError, FileNotFoundError):
        return InputFile(url, size=size)
    except (OSError, pa.ArrowException) as exc:  # bad magic bytes, a footer that does not deserialize
        problem = f"not a readable Parquet file: {first_line(exc)}"
        return InputFile(url, failure=ReadFailure(url, problem, f"input file {path} is {problem}", REPLACE_FILE, False))
    columns = {}
    for i in range(meta.num_columns):
        col = meta.schema.column(i)
        if col.max_repetition_level == 0 and "." not in col.path:
            columns[col.path.lower()] = col
    nanos: set[str] = set()
    for spark_field in schema.fields:
        col = columns.get(spark_field.name.lower())
        if col is None:
            continue  # Spark reads a missing column as NULL
        logical = col.logical_type.type
        if _declared_type_refused(spark_field.dataType, col.physical_type, logical):
            actual = "BINARY" if col.physical_type == "BYTE_ARRAY" else col.physical_type  # Spark's names
            failure = type_mismatch(url, f"[{spark_field.name}]", actual, spark_field.dataType.simpleString())
            return InputFile(url, rows=meta.num_rows, size=size, failure=failure)
        if isinstance(spark_field.dataType, (T.TimestampType, T.TimestampNTZType)) and logical == "TIMESTAMP" \
                and json.loads(col.logical_type.to_json()).get("timeUnit") == "nanoseconds":
            nanos.add(spark_field.name)
    return InputFile(url, nanos=frozenset(nanos), rows=meta.num_rows, size=size)


def _from_nanos(col: Column, dtype: T.DataType) -> Column:
    """Nanoseconds since the epoch (BIGINT) to a timestamp, truncated (floor) to microseconds."""
    micros = F.floor(col.cast(T.DecimalType(20, 0)) / F.lit(1000)).cast("bigint")  # exact, unlike a double
    return F.timestamp_micros(micros).cast(dtype)


def _escaped(url: str) -> str:
    """A file's URL from the source's log (percent-encoded) as DataFrameReader.load takes it: decoded,
    since Hadoop encodes it again, and with {}[]*?\\ escaped, since it would be a glob pattern."""
    parts = urlsplit(url)
    path = unquote(parts.path) if parts.scheme == "file" else \
        f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}" if parts.scheme else url
    return re.sub(r"([\\{}\[\]*?])", r"\\\1", path)


def read_files(session: SparkSession, spec: PipelineSpec, index: int, urls: list[str],
               nanos: frozenset[str] = frozenset()) -> DataFrame:
    """Some files of a managed source, read in the batch with the stream's options, as
    :func:`read_source` would give their rows; ``nanos`` columns are read as BIGINT nanoseconds."""
    source = spec.sources[index]
    declared = read_schema(source, f"sources[{index}]")
    schema = declared
    if nanos:
        session.conf.set("spark.sql.legacy.parquet.nanosAsLong", "true")  # else Spark refuses the column
        schema = T.StructType([T.StructField(f.name, T.LongType()) if f.name in nanos else f for f in schema.fields])
    assert source.format is not None  # validated: a files source names its format
    reader = format_options(session.read.format(source.format), source).schema(schema)
    df = reader.option("basePath", source.path).load([_escaped(u) for u in urls])  # basePath: as the stream's
    for f in declared.fields:
        if f.name in nanos:
            df = df.withColumn(f.name, _from_nanos(F.col(_quoted(f.name)), f.dataType))
    return with_engine_columns(df, spec, index)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _alignment(df: DataFrame, schema: T.StructType) -> list[Column] | None:
    """The projection giving ``df`` exactly the columns of ``schema`` (the union of every source), in
    its order; None when it has them already."""
    if df.schema == schema:
        return None
    have = set(df.columns)
    return [(F.col(_quoted(f.name)) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in schema.fields]


#: what a batch step's attempt returns (``InputFiles.attempt``)
B = TypeVar("B")


@dataclass
class BatchFiles:
    """One batch's files of the managed sources: as its checkpoint lists them, and those left out so far."""

    batch_id: int
    listed: dict[int, list[InputFile]]  # per source index
    skipped: dict[str, tuple[int, InputFile]] = field(default_factory=dict)  # by path: (source index, file)

    @property
    def key(self) -> str:
        """The spec key of the first source a file was left out of (for an error about their dead letters)."""
        return f"sources[{min(i for i, _ in self.skipped.values())}].on_unreadable_file"


class InputFiles:
    """Reads the batches of the managed files sources (``Source.read_by_engine``) and leaves out
    unreadable files.

    Made once per run. Per batch, the batch step calls :meth:`open_batch`, then per attempt
    :meth:`frame` (and :meth:`dead_letter_rows`), :meth:`leave_out` when an attempt fails, and
    :meth:`record` once the batch is aggregated.
    """

    def __init__(self, spec: PipelineSpec, counter: Counter, progress: Callable[[str], None]) -> None:
        self.spec = spec
        self.indexes = [i for i, s in enumerate(spec.sources) if s.read_by_engine]
        self.counter = counter  # unreadable_files_total{pipeline,source}
        self.progress = progress
        # per (source index, TIMESTAMP(NANOS) columns): the projection that aligns its read rows with
        # the stream's schema, None where they already are (the same every batch: built once)
        self._alignments: dict[tuple[int, frozenset[str]], list[Column] | None] = {}
        self._one_task_bytes: int | None = None  # the run's session's (spark.batch.batch_shuffle), read once

    @property
    def managed(self) -> bool:
        return bool(self.indexes)

    def open_batch(self, batch_id: int) -> BatchFiles:
        """Batch ``batch_id``'s files of the managed sources, those known unreadable from their footer
        (or gone) already left out; raises the run-stopping error for such a file of a source that
        does not skip unreadable files (``fail``)."""
        files = BatchFiles(batch_id, {i: self._listed(i, batch_id) for i in self.indexes})
        for i, listed in files.listed.items():
            for f in listed:
                if f.failure is not None:
                    self._refuse(i, f, batch_id)
                    files.skipped[f.path] = (i, f)
        return files

    def attempt(self, df: DataFrame, batch_id: int, own: DeadLetters | None, in_transaction: list,
                run: Callable[[DataFrame, DeadLetters | None], B]) -> tuple[B, pa.Table | None, dict[str, int]]:
        """Run a batch step's ``run(frame, dead letter writer)`` over this batch's files until no file
        fails it: each unreadable file is left out (or stops the run under ``fail``) and the batch
        planned again, dropping what the failed attempt queued in ``in_transaction``.

        Returns ``run``'s result, the left-out files' dead-letter rows (None without a dead-letter
        target; the writer handed to ``run`` adds them to the batch's own dead letters, and a batch
        that writes none must write them itself) and the files left out per source.
        """
        queued = len(in_transaction)
        files = self.open_batch(batch_id)  # raises for a file known unreadable under "fail"
        while True:
            del in_transaction[queued:]  # what a failed attempt queued
            frame = self.frame(df, files)
            rows = self.dead_letter_rows(files) if own is not None else None
            writer = own if rows is None or own is None else WithFileRows(own, rows, files.key)
            try:
                result = run(frame, writer)
                break
            except Exception as exc:
                if not self.leave_out(exc, files):  # raises for the file under "fail"
                    raise
        return result, rows, self.record(files, dead_lettered=rows is not None)

    def leave_out(self, exc: BaseException, files: BatchFiles) -> bool:
        """After an attempt at the batch failed with ``exc``: leave out the managed file Spark's error
        says it cannot read (True: plan the batch again without it), or raise the run-stopping error
        for it (``fail``); False when ``exc`` names no such file (the batch's own failure)."""
        found = self._failed(exc, files.listed, files.skipped)
        if found is None:
            return False
        self._refuse(*found, files.batch_id, cause=exc)
        files.skipped[found[1].path] = found
        return True

    def _listed(self, index: int, batch_id: int) -> list[InputFile]:
        source = self.spec.sources[index]
        urls = batch_files(self.spec.run.checkpoint_location, index, batch_id)
        if not source.is_local:
            return [InputFile(u) for u in urls]
        if source.format != "parquet":
            return [_local(u) for u in urls]
        schema = parse_schema(source, f"sources[{index}]")
        if len(urls) < 8:
            return [inspect_parquet(u, schema) for u in urls]
        with ThreadPoolExecutor(max_workers=4) as pool:  # pyarrow reads footers without the GIL
            return list(pool.map(lambda u: inspect_parquet(u, schema), urls))

    def frame(self, df: DataFrame, files: BatchFiles) -> DataFrame:
        """The batch's rows: the other sources' from Spark's batch ``df``, the managed ones' read here
        (their files not left out); in one task where they are only those files and few bytes
        (``spark.batch.batch_shuffle``)."""
        session, spec, skipped = df.sparkSession, self.spec, files.skipped
        frames: list[DataFrame] = []
        streamed = len(self.indexes) < len(spec.sources)
        if streamed:  # rows of streamed sources (the heartbeat's are not needed)
            frames.append(df.filter(~F.col(SOURCE).isin([spec.sources[i].name for i in self.indexes])))
        sizes: list[int | None] = []
        for i, listed in files.listed.items():
            groups: dict[frozenset[str], list[str]] = {}
            for f in listed:
                if f.path not in skipped:
                    groups.setdefault(f.nanos, []).append(f.url)
                    sizes.append(f.size)
            for nanos in sorted(groups, key=sorted):
                rows = read_files(session, spec, i, groups[nanos], nanos)
                if (i, nanos) not in self._alignments:
                    self._alignments[(i, nanos)] = _alignment(rows, df.schema)
                projection = self._alignments[(i, nanos)]
                frames.append(rows if projection is None else rows.select(*projection))
        if not frames:
            return session.createDataFrame([], df.schema)
        union = reduce(DataFrame.union, frames)
        if not streamed and None not in sizes:
            self._one_task_bytes = self._one_task_bytes or one_task_bytes(session)
            return union.coalesce(1) if sum(cast(list[int], sizes)) <= self._one_task_bytes else union
        return union

    def dead_letter_rows(self, files: BatchFiles) -> pa.Table | None:
        """One dead-letter row per file left out of the batch; None when none was."""
        if not files.skipped:
            return None
        left_out = sorted(files.skipped.values(), key=lambda e: (e[0], e[1].path))
        n = len(left_out)
        return pa.table({
            BATCH_ID: pa.array([files.batch_id] * n, pa.int64()),
            SOURCE: pa.array([self.spec.sources[i].name for i, _ in left_out], pa.string()),
            EVENT_TS: pa.array([None] * n, pa.timestamp("us", tz="UTC")),
            REASON: pa.array([UNREADABLE_FILE] * n, pa.string()),
            FILE_PATH: pa.array([f.path for _, f in left_out], pa.string()),
            FILE_ERROR: pa.array([f.failure.problem if f.failure else None for _, f in left_out], pa.string()),
            FILE_ROWS: pa.array([f.rows for _, f in left_out], pa.int64()),
        })

    def _refuse(self, index: int, f: InputFile, batch_id: int, cause: BaseException | None = None) -> None:
        """Raise the run-stopping error for ``f`` unless its source skips unreadable files (or it is gone)."""
        source = self.spec.sources[index]
        if source.skips_unreadable_files or f.missing:
            return
        assert f.failure is not None
        error = f.failure.error(
            f"pipeline {self.spec.pipeline_name}, source {source.name}, batch {batch_id}: ",
            f"move it out of {url_path(source.path or '')} (the batch then records it as removed and goes on), or set "
            f'on_unreadable_file = "skip" on sources[{index}] ({source.name}) to leave unreadable files out, counted '
            "and dead-lettered")
        if cause is not None:
            raise error from cause
        raise error

    def _failed(self, exc: BaseException, listed: dict[int, list[InputFile]],
                skipped: dict[str, tuple[int, InputFile]]) -> tuple[int, InputFile] | None:
        """The managed file (not skipped yet) that Spark's error ``exc`` says it cannot read."""
        failure = read_failure(exc)
        if failure is None:
            return None
        path = url_path(failure.url)
        for i, files in listed.items():
            for f in files:
                if f.path == path and path not in skipped:
                    return i, InputFile(f.url, rows=f.rows, failure=failure)
        return None

    def record(self, files: BatchFiles, dead_lettered: bool) -> dict[str, int]:
        """Count and report the files left out of the batch; how many per source name (for the
        stored counters)."""
        batch_id, skipped = files.batch_id, files.skipped
        counts: dict[str, int] = {}
        name = self.spec.pipeline_name
        where = "recorded in the dead letters" if dead_lettered else "no [dead_letter]: counted only"
        for i, f in sorted(skipped.values(), key=lambda e: (e[0], e[1].path)):
            source = self.spec.sources[i].name
            counts[source] = counts.get(source, 0) + 1
            assert f.failure is not None
            self.counter.labels(name, source).inc()
            self.progress(f"[{name}] batch {batch_id}: left out input file {f.path} of source {source}: "
                          f"{f.failure.problem} ({where})")
        return counts
