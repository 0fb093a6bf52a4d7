"""One backfill per pipeline at a time: a PostgreSQL advisory lock in the target's database.

The lock is a session-level advisory lock held by a connection of its own for the whole backfill,
so it is gone the moment that process is (a ``SIGKILL`` included) and never needs cleaning up.
The streaming run does not take it: the ranges a backfill accepts are ones the streaming state no
longer holds (``BackfillRange.refuse_unless_closed``), which keeps the two apart.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import psycopg

from ematix_dagster.errors import BackfillBusy
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.targets.pg_table import PostgresTable

_LOCK = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))"


def lock_name(pipeline: str) -> str:
    """The text whose hash names the lock (a test holds it to see a second backfill refused)."""
    return f"ematix-backfill:{pipeline}"


@contextmanager
def backfill_lock(spec: PipelineSpec) -> Iterator[None]:
    """Hold the pipeline's backfill lock (``spec`` resolved) or raise :class:`BackfillBusy`."""
    table = PostgresTable(spec.target.url, spec.target.table, spec.pipeline_name, "target")
    conn = table.connect()
    try:
        conn.autocommit = True
        try:
            row = conn.execute(_LOCK, (lock_name(spec.pipeline_name),)).fetchone()
        except psycopg.Error as exc:
            raise table.error("taking the backfill lock on the database of", exc) from None
        if not (row and row[0]):
            raise BackfillBusy(f"pipeline {spec.pipeline_name}: another backfill of it is running (it holds the "
                               f"backfill lock on {table.where})", way_out="wait until it has ended, then run again")
        yield
    finally:
        table.close()  # ends the session, which releases the lock


__all__ = ["backfill_lock", "lock_name"]
