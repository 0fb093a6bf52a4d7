"""What the engine asks of a writer, and the columns every writer knows by name."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import pyarrow as pa


@runtime_checkable
class WindowWriter(Protocol):
    """Writes the closed windows of one micro-batch."""

    idempotent: bool

    @property
    def description(self) -> str: ...

    def open(self) -> None: ...

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class RowWriter(Protocol):
    """Writes the rows a row pipeline (no window) releases in one micro-batch, all in one call."""

    idempotent: bool

    @property
    def description(self) -> str: ...

    def open(self) -> None: ...

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class DeadLetterWriter(Protocol):
    """Writes the dead-letter rows of one micro-batch (rows of any schema)."""

    idempotent: bool

    @property
    def description(self) -> str: ...

    def open(self) -> None: ...

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None: ...

    def close(self) -> None: ...


class WritesInTransaction(Protocol):
    """A writer that also writes inside another connection's transaction (the PostgreSQL writers)."""

    def write_in_transaction(self, conn: Any, batch_id: int, rows: pa.Table) -> None: ...


@runtime_checkable
class WritesBatchOnce(Protocol):
    """A writer that records (query, batch) with the batch's rows and writes a recorded batch no
    more (the PostgreSQL window writer, :mod:`~ematix_dagster.targets.pg_fence`)."""

    def write_batch_once(self, query_id: str, batch_id: int, rows: pa.Table) -> bool: ...

    def write_batch_once_in_transaction(self, conn: Any, query_id: str, batch_id: int, rows: pa.Table) -> bool: ...


@runtime_checkable
class CountsRows(Protocol):
    """A writer that knows its target's size from a count it keeps with each commit (the PostgreSQL
    writers, :mod:`~ematix_dagster.targets.pg_count`). Parquet and console writers have none: a
    parquet target is a log of every batch's rows (corrections and retractions included), whose
    row total is not a table's size and would take reading every file's footer; the console keeps
    nothing."""

    def row_count(self) -> int | None: ...
