"""The dead-letter writer of a batch that left unreadable files out (``spark.input.input_files``).

A postgres dead-letter write replaces the batch's rows, so a batch writes its dead letters once:
the files' rows ride along with the batch's own write.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from ematix_dagster.columns import FILE_ERROR, FILE_PATH, FILE_ROWS
from ematix_dagster.errors import PipelineConfigError


class DeadLetters(Protocol):
    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None: ...

    def write_in_transaction(self, conn: object, batch_id: int, rows: pa.Table) -> None: ...


class WithFileRows:
    """The batch's dead-letter writer, adding the unreadable files' rows to what the batch writes."""

    def __init__(self, inner: DeadLetters, rows: pa.Table, key: str) -> None:
        self.inner, self.rows, self.key = inner, rows, key

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _with(self, rows: pa.Table) -> pa.Table:
        mine = self.rows
        for name in mine.column_names:
            if name in rows.column_names:
                want = rows.schema.field(name).type
                if not mine.schema.field(name).type.equals(want):
                    if name in (FILE_PATH, FILE_ERROR, FILE_ROWS):
                        raise PipelineConfigError(
                            self.key, f"the batch's dead-letter rows have a column {name} of type {want}, the "
                            "column unreadable files' dead-letter rows use",
                            f"rename {name} in the data or in [transform] sql")
                    mine = mine.set_column(mine.column_names.index(name), name, mine.column(name).cast(want))
        return pa.concat_tables([rows, mine], promote_options="permissive")

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        self.inner.write(batch_id, self._with(rows), part)

    def write_in_transaction(self, conn: object, batch_id: int, rows: pa.Table) -> None:
        self.inner.write_in_transaction(conn, batch_id, self._with(rows))
