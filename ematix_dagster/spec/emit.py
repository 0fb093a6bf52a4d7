"""``[emit]``: a windowed pipeline's rows published later than they are known
(docs/contract/delayed-windows.md).

``sql`` is exactly ``SELECT * FROM windows WHERE <predicate>``, the predicate calling
``WATERMARK_TS()`` as an upper bound over window bounds, ``session_id`` and group columns
(``sql.emit_query``); ``max_buffered_rows`` bounds the rows waiting, as a row pipeline's does.

>>> EmitRelease("SELECT * FROM windows WHERE window_end <= WATERMARK_TS()").max_buffered_rows is None
True
"""

from __future__ import annotations

from dataclasses import dataclass

from ematix_dagster.spec.rules import _fail, _positive
from ematix_dagster.spec.window import WINDOW_KINDS, Window
from ematix_dagster.sql.emit_query import emit_plan
from ematix_dagster.sql.release_plan import WATERMARK_TS

_CALL = f"{WATERMARK_TS}()"


@dataclass(frozen=True)
class EmitRelease:
    """The ``[emit]`` table."""

    sql: str
    #: the most rows that may wait after a batch's releases (mandatory: the run fails loud past it)
    max_buffered_rows: int | None = None


def predicate_columns(window: Window) -> tuple[str, ...]:
    """The columns an ``[emit]`` predicate may name: the window bounds, ``session_id`` and the group columns."""
    id_column = WINDOW_KINDS[window.kind].id_column
    return (window.window_start_column, window.window_end_column, *((id_column,) if id_column else ()),
            *window.group_by)


def validate_emit(emit: EmitRelease, window: Window | None, durable: bool) -> None:
    """``[emit]`` against the rest of the spec (its ``window``, None in a row pipeline; a ``durable``
    state store); every misuse is a load-time error (``validate`` exits 2)."""
    if window is None:
        _fail("emit", "applies to windowed pipelines (with [transform.window]): it delays their emitted rows",
              f"a row pipeline holds its rows back with {_CALL} in the WHERE of [transform] sql")
    emit_plan(emit.sql, predicate_columns(window))
    if emit.max_buffered_rows is None:
        _fail("emit.max_buffered_rows", f"is mandatory with [emit]: the rows {_CALL} holds back wait in the state "
              "store, and this caps how many (the run fails loud past it)",
              "set the most rows that may wait for the watermark, e.g. max_buffered_rows = 1_000_000")
    _positive("emit.max_buffered_rows", emit.max_buffered_rows)
    if not durable:
        _fail("state_store.kind", '"in_memory" cannot hold the rows [emit] holds back: they are not written '
              "yet, so a restart would lose them", 'use kind = "sqlite" or "postgres"')
