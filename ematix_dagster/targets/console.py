"""The console target: at-least-once, for trying a pipeline out."""

from __future__ import annotations

import sys

import pyarrow as pa


class ConsoleWriter:
    """Prints each batch's rows (windows or a row pipeline's rows) to stdout; replays print again
    (at-least-once). ``noun`` names what a row is in the batch header (``window``, ``row``)."""

    idempotent = False

    def __init__(self, pipeline_name: str, noun: str) -> None:
        self.pipeline_name = pipeline_name
        self.noun = noun
        self.description = "console (stdout)"

    def open(self) -> None:
        pass

    def write(self, batch_id: int, rows: pa.Table, part: str = "part-0") -> None:
        if rows.num_rows == 0:
            return
        n = rows.num_rows
        text = rows.to_pandas().to_string(index=False)
        out = sys.stdout
        out.write(f"-- batch {batch_id}: {n} {self.noun}{'' if n == 1 else 's'} --\n{text}\n")
        out.flush()

    def close(self) -> None:
        pass
