"""Row pipelines: sources -> ``[transform] sql`` -> target, without a window (docs/contract/row-pipelines.md).

A row pipeline writes the rows its SELECT returns, as they arrive or, with ``WATERMARK_TS()`` in
the SQL's WHERE, once the watermark reaches each row's release time
(docs/contract/row-pipelines.md#watermark_ts-holding-rows-back). Its watermark keys
are a window's (``lateness_ms``, ``source_idleness_ms``, ``time_mode``, ``event_time_column``,
``event_time_unit``), written in ``[transform]`` since there is no ``[transform.window]``, and
``max_buffered_rows`` bounds the rows held back.

>>> RowTransform(lateness_ms=5_000).time_mode
'event'
>>> RowTransform(max_buffered_rows=0).validate()
Traceback (most recent call last):
...
ematix_dagster.errors.PipelineConfigError: transform.max_buffered_rows: 0 must be a positive integer (fix: use a value > 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ematix_dagster.columns import BATCH_ID, EVENT_TS
from ematix_dagster.spec.rules import _fail, _is_ident, _positive, _validate_watermark
from ematix_dagster.spec.sinks import Target
from ematix_dagster.sql.release_plan import WATERMARK_TS, release_plan

_CALL = f"{WATERMARK_TS}()"


@dataclass(frozen=True)
class RowTransform:
    """A row pipeline's ``[transform]`` keys besides ``sql``: its watermark, and the pending-rows cap."""

    TOML_TABLE: ClassVar[str] = "transform"

    lateness_ms: int = 0
    source_idleness_ms: int = 60_000
    time_mode: str = "event"
    event_time_column: str = EVENT_TS
    event_time_unit: str = "ms"
    #: the most rows ``WATERMARK_TS()`` may hold back after a batch's releases (mandatory with it,
    #: refused without it: it bounds nothing then)
    max_buffered_rows: int | None = None

    def validate(self, key: str = "transform") -> None:
        """The watermark keys by the window's rules (one shared copy), and a positive cap if given."""
        _validate_watermark(self, key)
        if self.max_buffered_rows is not None:
            _positive(f"{key}.max_buffered_rows", self.max_buffered_rows)


def validate_row_pipeline(rows: RowTransform, sql: str | None, durable: bool, target: Target) -> None:
    """The rules between a row pipeline's ``[transform]`` (``rows``, its ``sql``) and its other
    tables (a ``durable`` state store, the ``target``).

    The SQL is read here, at load time, so that every misuse of ``WATERMARK_TS()`` (docs/contract/row-pipelines.md) is a
    configuration error before Spark starts: ``validate`` exits 2 and nothing runs.
    """
    rows.validate()
    if sql is None:
        _fail("transform.sql", "is required for a row pipeline (one without [transform.window]): its SELECT list "
              "is the output's columns, in its order",
              'write sql = "SELECT ... FROM source", or add [transform.window] to aggregate')
    plan = release_plan(sql)  # refuses WATERMARK_TS() anywhere but as an upper bound in the WHERE
    if plan is None:
        if rows.max_buffered_rows is not None:
            _fail("transform.max_buffered_rows", f"max_buffered_rows = {rows.max_buffered_rows} bounds the rows "
                  f"{_CALL} holds back, and the SQL does not call {_CALL}: every row leaves in the batch it "
                  "arrives in", f"remove it, or hold rows back with {_CALL} in the WHERE")
    else:
        if rows.max_buffered_rows is None:
            _fail("transform.max_buffered_rows", f"is mandatory with {_CALL}: the rows it holds back wait in the "
                  "state store, and this caps how many (the run fails loud past it)",
                  "set the most rows that may wait for the watermark, e.g. max_buffered_rows = 1_000_000")
        if not durable:
            _fail("state_store.kind", f'"in_memory" cannot hold the rows {_CALL} holds back: they are not written '
                  "yet, so a restart would lose them", 'use kind = "sqlite" or "postgres"')
    _validate_row_target(target)


def _validate_row_target(target: Target) -> None:
    """``[target]`` of a row pipeline: ``key`` (postgres upserts) and no window-only options."""
    if target.retractions:
        _fail("target.retractions", "a row pipeline writes each row once, so no row is ever superseded or retracted",
              "remove it: retractions apply to windowed pipelines")
    if not target.key:
        return
    if target.kind != "postgres":
        _fail("target.key", f"only a postgres target upserts on a key; a {target.kind} target appends every row",
              "remove it, or use a postgres target")
    seen: set[str] = set()
    for i, column in enumerate(target.key):
        if not _is_ident(column):
            _fail(f"target.key[{i}]", f"{column!r} is not a column name", "name a column of the SELECT list")
        if column.lower() == BATCH_ID:
            _fail(f"target.key[{i}]", f"{column!r} is reserved: it is the release batch of the rows of a target "
                  "without a key", "key the table by columns of the SELECT list")
        if column.lower() in seen:  # as Spark and unquoted SQL compare names
            _fail(f"target.key[{i}]", f"{column!r} appears twice", "list each key column once")
        seen.add(column.lower())
