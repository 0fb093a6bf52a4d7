"""The console target: at-least-once, for trying a pipeline out."""

from __future__ import annotations

import sys

import pyarrow as pa


class ConsoleWindowWriter:
    """Prints each batch's windows to stdout; replays print again (at-least-once)."""

    idempotent = False

    def __init__(self, pipeline_name: str) -> None:
        self.pipeline_name = pipeline_name
        self.description = "console (stdout)"

    def open(self) -> None:
        pass

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        if rows.num_rows == 0:
            return
        n = rows.num_rows
        text = rows.to_pandas().to_string(index=False)
        out = sys.stdout
        out.write(f"-- batch {batch_id}: {n} window{'' if n == 1 else 's'} --\n{text}\n")
        out.flush()

    def close(self) -> None:
        pass
