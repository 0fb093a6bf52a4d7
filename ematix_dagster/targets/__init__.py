"""Writers for a pipeline's output (``[target]``) and its dead-letter rows (``[dead_letter]``).

A windowed pipeline writes closed windows (:func:`make_window_writer`); a row pipeline (no
``[transform.window]``) writes the rows of its ``[transform] sql``, the SELECT's columns in its
order (:func:`make_row_writer`).

Everything here is pyarrow and psycopg: no Spark. The engine hands each writer one
:class:`pyarrow.Table` per micro-batch, together with the batch id from the streaming checkpoint.
Writers are built from the resolved spec (:meth:`~ematix_dagster.spec.PipelineSpec.resolved`), so
URLs and paths are used as they are.

Replays and the guarantee (docs/contract/targets-and-guarantees.md)
--------------------------------------
Spark re-runs the last micro-batch after a crash with the same batch id and the same input, and a
durable state store makes it emit the same rows again. Every durable writer is therefore written
so that *writing batch N twice leaves exactly what writing it once left*, which turns the
at-least-once delivery of Spark into effectively-once output:

* **postgres target**: an upsert on ``(window_start, group columns...)``. The rows are COPYed into a
  temporary table and merged with ``INSERT ... SELECT ... ON CONFLICT (key) DO UPDATE`` in one
  transaction, so a replay rewrites identical values (rows whose values did not change are not
  touched at all) and a later correction replaces the earlier row of the same key. Within one
  batch the last row of a key wins. The key constraint is ``UNIQUE NULLS NOT DISTINCT`` so that
  NULL group keys form one group (PostgreSQL >= 15). The table always holds the latest row per
  key, so ``_emit_seq`` is never stored; ``_emit_kind`` (a ``text`` column) is stored when the
  window's emit trigger is not ``"watermark"``, because a key's row may then be an ``early`` one
  (created by ``create_table``; an existing table without it is refused at start). Early rows are
  upserted like finals and corrections. A ``retract`` row (a key that disappeared: a session's
  start moved or sessions merged, docs/contract/emission.md) deletes its key's row instead, for
  every window kind; the batch's deletes run before its upserts, in the same transaction, so a
  replay deletes nothing more. :meth:`PostgresWindowWriter.write_in_transaction` does the
  same on a caller's connection without committing, so a Postgres state store in the same
  database can commit state and output together (exactly-once).
* **parquet target / parquet dead letters**: each batch goes to ``<path>/batch_id=<N>/part-0.parquet``
  (the end-of-input flush writes ``flush.parquet`` beside the last batch's file). Each file is
  written (and fsynced) under a hidden temporary name and renamed into place, so readers see the
  old or the new complete file, never a partial one, and a replay replaces it. Temporary files
  left by a crash are removed by ``open()``. The parquet target keeps ``_emit_kind``
  (``early`` | ``final`` | ``correction`` | ``retract``) and ``_emit_seq`` (the row's order within
  its batch) on every row of every window kind. A ``retract`` row repeats the row it withdraws and
  comes before the rows that replace it: readers keep the row with the largest
  ``(batch_id, _emit_seq)`` per key and drop keys whose latest row is a ``retract``
  (docs/contract/emission.md). The end-of-input flush file continues the ``_emit_seq`` of its
  batch's ``part-0`` (``PipelineRecord.last_batch_rows``), and it may write a key ``part-0`` wrote:
  with an early trigger, a window with an ``early`` row in the last batch gets its ``final`` (and,
  with ``[target] retractions``, a ``retract`` before it) in the flush, so readers order
  ``part-0`` and flush rows together by ``(batch_id, _emit_seq)``.
  Only local paths (or ``file://``) are supported.
* **postgres dead letters**: ``DELETE`` the rows of the batch id, then COPY the new ones, in one
  transaction (``write_in_transaction`` likewise commits nothing). A dead-letter table therefore
  belongs to one pipeline: a second pipeline writing the same table would delete the first one's
  rows of the same batch id.
* **postgres target of a row pipeline** (:class:`PostgresRowWriter`): without a key the table gets
  a ``_batch_id bigint NOT NULL`` column (the batch that released the row, indexed) and a batch
  deletes its ``_batch_id``'s rows, then COPYs its own, in one transaction, like the dead
  letters; so the table, too, belongs to one pipeline. With key columns it gets a
  ``UNIQUE NULLS NOT DISTINCT`` constraint on them and the window target's upsert (same staging,
  the last row of a key in the batch wins; the engine sorts each key's winner, the largest
  ``(_event_ts, values in SELECT order)``, last). Both commit nothing in ``write_in_transaction``.
* **parquet target of a row pipeline**: the batch directories above, the rows as they are.
* **console**: prints each batch as the parquet target writes it (windows with ``_emit_kind`` and
  ``_emit_seq``, a row pipeline's rows as they are); a replay prints it again, so the console
  target is at-least-once (``idempotent = False``; the engine warns at start).

Table size
----------
The PostgreSQL target writers (not the dead-letter writer) keep their table's size in
``<schema>.ematix_row_counts``, changed by every write in the transaction that changes the rows
(rows inserted minus rows deleted), whichever path commits it; ``row_count()`` reads it
(:class:`~.writer.CountsRows`, :mod:`.pg_count`). It is Dagster's ``dagster/row_count``. Parquet
and console writers keep no count.

Batches written once
--------------------
When Spark holds the window state, :meth:`PostgresWindowWriter.write_batch_once` writes a batch
only if its (query id, batch id) is not yet in ``<schema>.ematix_written_batches``, recording it in
the rows' transaction (:mod:`.pg_fence`): a replay writes nothing. The parquet target needs no
fence: a replay replaces ``batch_id=N/<part>.parquet`` with one rename.

Empty batches are a no-op for every writer (nothing is written, nothing is deleted): a replay
recomputes the same rows, so a batch that is empty on replay was empty the first time.

Errors
------
Connection and I/O failures raise :class:`TargetError` (``terminal = False``: a retry may help;
a refused login, a missing role or database is ``terminal = True``)
naming the pipeline, the table and ``host:port/dbname``, never the password: passwords are
stripped from every message and raw DSNs are never printed. Data errors raised by PostgreSQL
(a value that does not fit an existing column, ...) are also :class:`TargetError` but with
``terminal = True``. A table that does not fit is a :class:`PipelineConfigError`.

:mod:`.writer` holds the writer protocols, :mod:`.postgres_target` (windows, dead letters),
:mod:`.postgres_rows` (row pipelines), :mod:`.parquet` and :mod:`.console` the writers,
:mod:`.pg_table` the PostgreSQL connection, catalog and DDL they share with the Dagster checks,
:mod:`.pg_write` the statements every PostgreSQL writer runs in a batch's transaction (COPY,
staging, upsert, batch delete, commit), :mod:`.pg_count` the table size the target writers keep,
:mod:`.pg_fence` the batches the window target wrote, :mod:`.pg_bookkeeping` the table-by-OID
bookkeeping tables both keep beside the target, and :mod:`.pg_types` the Arrow -> PostgreSQL type mapping and value conversion.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from ematix_dagster.columns import EMIT_KIND
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import DeadLetter, Target
from ematix_dagster.targets.console import ConsoleWriter
from ematix_dagster.targets.parquet import ParquetWriter
from ematix_dagster.targets.pg_table import PostgresTable
from ematix_dagster.targets.pg_types import postgres_type
from ematix_dagster.targets.postgres_rows import PostgresRowWriter
from ematix_dagster.targets.postgres_target import PostgresDeadLetterWriter, PostgresWindowWriter
from ematix_dagster.targets.writer import CountsRows, DeadLetterWriter, RowWriter, WindowWriter
from state_store.pg_url import redact as redact_url

__all__ = [
    "WindowWriter",
    "RowWriter",
    "DeadLetterWriter",
    "CountsRows",
    "PostgresTable",
    "PostgresWindowWriter",
    "PostgresRowWriter",
    "ParquetWriter",
    "ConsoleWriter",
    "PostgresDeadLetterWriter",
    "make_window_writer",
    "make_row_writer",
    "make_dead_letter_writer",
    "postgres_type",
    "redact_url",
]


def make_window_writer(target: Target, pipeline_name: str, schema: pa.Schema,
                       key_columns: list[str], *, store_emit_kind: bool = False) -> WindowWriter:
    """The writer for ``[target]``.

    ``schema`` is the output schema including the ``_emit_kind`` and ``_emit_seq`` columns;
    ``key_columns`` is ``[window start column] + group columns`` (the upsert key).
    ``store_emit_kind``: the window's emit trigger fires early, so a postgres table keeps
    ``_emit_kind`` (parquet and console always write it).
    """
    names = list(schema.names)
    if EMIT_KIND not in names:
        raise ValueError(f"the output schema has no {EMIT_KIND} column: {names}")
    missing = [k for k in key_columns if k not in names]
    if not key_columns or missing:
        raise ValueError(f"key columns {missing or key_columns} are not output columns {names}")
    if target.kind == "postgres":
        return PostgresWindowWriter(target, pipeline_name, schema, key_columns, store_emit_kind)
    if target.kind == "parquet":
        return ParquetWriter(target.path, pipeline_name, "target")
    if target.kind == "console":
        return ConsoleWriter(pipeline_name, "window")
    raise _unknown_target(target)


def make_row_writer(target: Target, pipeline_name: str, schema: pa.Schema,
                    key_columns: Sequence[str]) -> RowWriter:
    """The writer for the ``[target]`` of a row pipeline (no ``[transform.window]``).

    ``schema`` is the ``[transform] sql`` SELECT's output schema, its columns in SELECT order;
    ``key_columns`` the target's key (empty: none). Only a postgres target upserts on a key;
    parquet and console append every row of a batch, so a key there is refused rather than ignored.
    """
    if target.kind == "postgres":
        return PostgresRowWriter(target, pipeline_name, schema, key_columns)
    if key_columns and target.kind in ("parquet", "console"):
        raise PipelineConfigError("target.key", f"a {target.kind} target appends every row, only a postgres "
                                  "target upserts on a key", "remove key, or use a postgres target")
    if target.kind == "parquet":
        return ParquetWriter(target.path, pipeline_name, "target")
    if target.kind == "console":
        return ConsoleWriter(pipeline_name, "row")
    raise _unknown_target(target)


def _unknown_target(target: Target) -> PipelineConfigError:
    return PipelineConfigError("target.kind", f"unknown target kind {target.kind!r}",
                               'use "postgres", "parquet" or "console"')


def make_dead_letter_writer(dead_letter: DeadLetter, pipeline_name: str) -> DeadLetterWriter:
    """The writer for ``[dead_letter]``."""
    if dead_letter.kind == "postgres":
        return PostgresDeadLetterWriter(dead_letter, pipeline_name)
    if dead_letter.kind == "parquet":
        return ParquetWriter(dead_letter.path, pipeline_name, "dead_letter")
    raise PipelineConfigError("dead_letter.kind", f"unknown dead-letter kind {dead_letter.kind!r}",
                              'use "parquet" or "postgres"')
