"""Stores written at an older schema version, as that version's code left them: what a migration
test opens with today's code."""

from __future__ import annotations

from typing import Any, Sequence

import psycopg
from psycopg import sql

from state_store import codec, migrations
from tests.state_store.legacy_rows import insert_rows

#: a state row's columns every schema version has had (``window_end`` since step 3)
STATE_COLUMNS = ("window_start", "window_end", "group_key", "state_blob", "state_version")


def store_at_schema(kind: str, conn: Any, version: int, pipeline: str, rows: Sequence[tuple],
                    extra: tuple[str, ...] = ()) -> None:
    """Bring the empty store behind ``conn`` (``kind``: sqlite or postgres) to schema ``version`` and
    write ``pipeline``'s record (batch 3, watermark 77) and its state rows, each
    ``(*STATE_COLUMNS, *extra)``."""
    columns = (*STATE_COLUMNS, *extra)
    if kind == "sqlite":
        conn.isolation_level = None
        migrations.apply_sqlite(conn, pipeline, migrations.STEPS[:version])
        conn.execute("INSERT INTO ematix_streaming_pipelines (pipeline_name, state_version, last_batch_id, watermark, "
                     "updated_at) VALUES (?, ?, 3, 77, 'now')", (pipeline, codec.STATE_VERSION))
        insert_rows(kind, conn, migrations.sqlite_names(), pipeline, columns, rows)
        return
    schema = conn.execute("SELECT current_schema()").fetchone()[0]
    with psycopg.connect(conn.info.dsn) as tx:
        migrations.apply_postgres(tx, schema, pipeline, migrations.STEPS[:version])
    names = migrations.postgres_names(schema)
    conn.execute(sql.SQL("INSERT INTO {pipelines} (pipeline_name, state_version, last_batch_id, watermark) "
                         "VALUES (%s, %s, 3, 77)").format(**names), (pipeline, codec.STATE_VERSION))
    insert_rows(kind, conn, names, pipeline, columns, rows)
