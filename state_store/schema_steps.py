"""The store's schema steps, and the layout decision each one made (``state_store.migrations``
applies them; steps are append-only: a released step is never edited, a change is a new step).

Step 3 (``window_end``): a stored window is named by its bounds, ``(pipeline, window_start,
window_end, group_key)`` in meaning, so window kinds whose end is not ``start + duration``
(session windows, docs/contract/windows.md) fit. Layout decision:

* ``window_end`` is a plain, nullable column; the PRIMARY KEY stays ``(pipeline_name,
  window_start, group_key)``. Uniqueness on start and key holds for every planned kind: tumbling,
  hopping and KIP-450 sliding windows have one fixed size, so the start fixes the end; a key's
  session windows never overlap, so no two share a start. A session that grows at its end (or
  absorbs a later one) rewrites its row's end in place with an upsert; one whose start moves
  earlier, or that is merged away, is a delete by (start, key) plus an upsert, as today.
  Keeping the key also avoids rebuilding the table (SQLite cannot alter a WITHOUT ROWID table's
  key or add a NOT NULL column without a default; PostgreSQL would rewrite the table and its
  index under an exclusive lock) on stores that hold millions of rows.
* Nullable because the column is added to existing rows. The step fills it in the same
  transaction from the pipeline row's stored spec: ``window_end = window_start +
  fingerprint_doc["window.duration_ms"] * 1000`` (µs; hopping windows have the duration as their
  size, not the hop). A row whose pipeline has no recorded duration keeps NULL and is filled when
  loaded (``state_store._common.fill_window_ends``), or by the engine from its window kind.
  Stores always write the end from this step on, so new rows are never NULL.

Step 4 drops the pipelines row's ``emitted`` list (window starts already emitted). It was rewritten
whole on every commit, which a kind with 100,000 open windows (sessions) cannot afford; a fixed
window's emission follows from its bounds and the committed watermark (see
``ematix_dagster.streaming.kinds.fixed.fixed_state``), and a kind whose windows can be emitted and still
change keeps that flag on its own rows.

Step 5 (``emitted``): that flag, a nullable boolean on every state row (SQLite: INTEGER 0/1).
Session windows under ``late_data = "reopen"`` (docs/contract/windows.md) need it: a late row can bridge an
emitted session with one still open, and the merged session counts as emitted although its end
is after the watermark, so a restart cannot derive the flag. Layout decision:

* Every upsert wrote the column (by (window_start, key); from step 8 segments carry it): true or
  false for a session, NULL for a fixed window, whose emission follows from its bounds and the
  committed watermark (step 4) and for which a stored flag could only drift from that rule. NULL therefore
  means "the window kind decides", never "unknown": a load returns the non-NULL flags only
  (``RecoveredState.emitted``).
* Nullable and without a default, so the step is a catalog change on both databases (no table
  rewrite, no lock held for longer than the ALTER). Session rows written before the step keep
  NULL: they were written under ``drop`` / ``dlq`` (reopen was refused for sessions then), where a
  session is emitted exactly when its end is before the committed watermark, and the engine
  derives the flag that way for a NULL (``Engine.restore``).
* Not in the key and not indexed: it is read with the row and written with the row.

Step 6 (``written_row``, ``trigger_fired_at``): what emission triggers and retractions need across
a restart (docs/contract/when-results-leave.md: the engine keeps "each key's last
written row with the state, committed with the batch"; the interval trigger has "one timer per
pipeline, stored with the state"). Layout decision:

* ``written_row`` (bytea; SQLite: BLOB) on every state row: the last row written to the target for
  that (window_start, key), its window end and values, an opaque blob the engine encodes (a
  ``retract`` row repeats it exactly). It is kept only where the engine needs it (retractions,
  session windows); NULL means nothing kept. Like ``emitted`` it travels beside the groups, keyed
  by (window_start, key): every upsert wrote the column (NULL without an entry; segments carry it
  from step 8) and a load returns the non-NULL blobs (``RecoveredState.written``), in the same snapshot.
  Whole-window rows never carry one: the engine writes groups one by one when it keeps written
  rows. A delete removes it with its row; ``migrate_state`` (which rewrites older state blobs)
  leaves it as it is.
* ``trigger_fired_at`` (bigint; SQLite: INTEGER) on the pipelines row: the batch time (µs) of the
  interval emit trigger's last firing, NULL before any (only that trigger sets it). One value per
  pipeline, so it lives beside the watermark (``PipelineRecord.trigger_fired_at``) and is written
  with the record on every commit; a load refuses anything but an integer or NULL (CorruptState).
* Both nullable and without a default: catalog-only changes on both databases (no table rewrite,
  no lock held for longer than the ALTER). Rows and pipelines written before the step read as
  "nothing kept" and "never fired": no code kept either before it.

Step 7 (``ematix_streaming_pending``): rows delayed by ``WATERMARK_TS()`` (docs/contract/row-pipelines.md:
pending rows live in the state store, one stored row each, indexed by release time, committed with
the batch).
Layout decision:

* A table of its own, one row per pending output row: ``release_us``, ``arrival_batch``, ``seq``
  (the row's position in its arrival batch), ``event_ts`` (its ``_event_ts``, µs, NULL allowed) and
  ``payload`` (the row's values, an opaque engine blob). A pending row is no window group.
* PRIMARY KEY ``(pipeline_name, release_us, arrival_batch, seq)``, the release order's prefix
  ((release time, arrival batch, ``_event_ts``, values): within an arrival batch ``seq`` follows
  ``_event_ts`` and the values), so the rows due at W are one range scan read in order, and a
  release deletes by key. SQLite: WITHOUT ROWID and STRICT, like the state table.
* A partial index on ``(pipeline_name, event_ts) WHERE event_ts IS NOT NULL``: the output watermark
  needs the smallest pending ``_event_ts`` after every batch, a scan of every pending row without
  the index, one probe with it (SQLite, 50,000 rows: 6.7 ms -> 0.01 ms; inserting them cost the
  same, releasing half 50 ms instead of 28). Rows without an event time never lower the minimum,
  so they are left out. A new table: the step rewrites and locks nothing.

Step 8 (``ematix_streaming_segments``): session and sliding window state as column segments
(``state_store.segments`` is the blob format). Layout decision:

* A table of its own, one row per segment: ``(pipeline_name, seq, blob)``, PRIMARY KEY
  ``(pipeline_name, seq)`` (SQLite: WITHOUT ROWID and STRICT, like the state table). A segment is
  an opaque blob holding many groups as columns (upserts and deletes by ``(window_start, key)``);
  a load reads them in ``seq`` order, in the snapshot of the record, and a reader replays them over
  the pipeline's state rows. A commit appends (``BatchCommit.segments``), so a batch writes one row
  however many sessions or partials it changed, instead of one per group (per-row upserts would
  be most of a large session pipeline's driver commit).
* ``BatchCommit.rebase`` deletes the pipeline's segments and state rows first: the engine's
  compaction writes the whole state as one base segment when the stored segments would hold more
  than twice the state's rows, which bounds the stored bytes and a restore's reading to about
  twice the state; the first commit after loading state rows does the same, which is the
  migration away from rows (in the commit's transaction: a crash leaves the rows or the segment,
  never neither). ``BatchCommit.dropped_segments`` deletes only the oldest segments, those later
  range deletes emptied (no step of its own: ``seq`` need not start at 0).
* Not in the state table: its key is ``(window_start, group_key)``, which a segment has none of,
  and keeping the rows' table as it is leaves fixed windows (rows and whole-window rows) and
  every older store readable as they were. A new table: the step rewrites and locks nothing.
  Every window kind has committed segments since, so commits write no state row: the state table
  is read on load, rewritten by ``migrate_state`` and emptied by a rebase or ``reset``.

Step 10 (``lease_epoch``): a fence for the lease. A lock alone cannot stop a holder that lives on
after its run was given up (a SIGKILLed Dagster run worker leaves its step process running, lock
and all), so a replacement run may *take the lease over*: it raises the epoch, and every write of
the holder checks, in its own transaction, that the stored epoch is still the one it acquired.
Layout decision:

* A column of the pipelines row, ``bigint NOT NULL DEFAULT 0`` (SQLite: INTEGER): the epoch is per
  pipeline and is read in the transaction that writes that row anyway (PostgreSQL locks the row
  with ``SELECT ... FOR UPDATE`` first, so a take-over's UPDATE and a commit serialize; SQLite's
  write lock serializes them). Every acquisition raises it by one in a transaction; existing rows
  start at 0, "never acquired under a fence". Not part of ``PIPELINE_COLUMNS``: a commit's upsert
  never writes it, and a ``reset`` keeps it, so an epoch never goes back.
* A constant default: a catalog-only change on both databases (PostgreSQL 11+ rewrites no table
  for a non-volatile default), whatever the number of pipelines.

Step 11 (``output_watermark``): how far the target is complete, stored with each commit, so a
reader without Spark (the Airflow sensor's trigger) reads one column of one row instead of
deriving it from the record and the pending table in two reads. Layout decision:

* A nullable column of the pipelines row, ``bigint`` (SQLite: INTEGER), in ``PIPELINE_COLUMNS``:
  written by every commit's upsert, in the commit's transaction, after the batch's pending rows
  (``output_watermark(releasing watermark, oldest pending event time)``, ``state_store.contract``):
  the store computes it, so every commit path (driver, executor mode, a row pipeline, ``[emit]``)
  stores the value its pending table gives. The oldest event time is one probe of step 7's index.
* The step fills existing rows from the same inputs in the same transaction (NULL stays NULL while
  the watermark is), so a store migrated between two commits reads as the next commit would write
  it. Nullable and without a default: the ALTER is catalog-only; the UPDATE touches one row per
  pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchemaStep:
    version: int
    description: str
    #: psycopg.sql templates: {state} {offsets} {pipelines} {pending} {segments} are qualified, {pending_event_ts} is not
    postgres: tuple[str, ...]
    sqlite: tuple[str, ...]


STEPS: tuple[SchemaStep, ...] = (
    SchemaStep(
        1, "state, offsets and pipelines tables",
        postgres=(
            """CREATE TABLE {state} (
                pipeline_name text NOT NULL,
                window_start bigint NOT NULL,
                group_key bytea NOT NULL,
                state_blob bytea NOT NULL,
                state_version integer NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (pipeline_name, window_start, group_key))""",
            """CREATE TABLE {offsets} (
                pipeline_name text NOT NULL,
                source_id text NOT NULL,
                batch_id bigint NOT NULL,
                offset_json text NOT NULL,
                state_version integer NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (pipeline_name, source_id))""",
            """CREATE TABLE {pipelines} (
                pipeline_name text PRIMARY KEY,
                state_version integer,
                query_id text,
                last_batch_id bigint,
                fingerprint text,
                fingerprint_doc jsonb,
                watermark bigint,
                sources jsonb,
                counters jsonb,
                emitted jsonb,
                lease_holder text,
                pending_migration boolean NOT NULL DEFAULT false,
                updated_at timestamptz NOT NULL DEFAULT now())""",
        ),
        sqlite=(
            """CREATE TABLE {state} (
                pipeline_name TEXT NOT NULL,
                window_start INTEGER NOT NULL,
                group_key BLOB NOT NULL,
                state_blob BLOB NOT NULL,
                state_version INTEGER NOT NULL,
                updated_at TEXT NOT NULL,
                PRIMARY KEY (pipeline_name, window_start, group_key)) WITHOUT ROWID, STRICT""",
            """CREATE TABLE {offsets} (
                pipeline_name TEXT NOT NULL,
                source_id TEXT NOT NULL,
                batch_id INTEGER NOT NULL,
                offset_json TEXT NOT NULL,
                state_version INTEGER NOT NULL,
                updated_at TEXT NOT NULL,
                PRIMARY KEY (pipeline_name, source_id)) STRICT""",
            """CREATE TABLE {pipelines} (
                pipeline_name TEXT PRIMARY KEY,
                state_version INTEGER,
                query_id TEXT,
                last_batch_id INTEGER,
                fingerprint TEXT,
                fingerprint_doc TEXT,
                watermark INTEGER,
                sources TEXT,
                counters TEXT,
                emitted TEXT,
                lease_holder TEXT,
                pending_migration INTEGER NOT NULL DEFAULT 0,
                updated_at TEXT NOT NULL) STRICT""",
        ),
    ),
    SchemaStep(
        2, "state pages half empty (fillfactor 50): a rewritten group stays an in-page (HOT) update",
        postgres=("ALTER TABLE {state} SET (fillfactor = 50)",),
        sqlite=(),  # nothing to tune: SQLite rewrites the b-tree cell in place
    ),
    SchemaStep(
        3, "window_end on every state row (nullable, not in the key), filled from the stored window duration",
        postgres=(
            "ALTER TABLE {state} ADD COLUMN window_end bigint",
            """UPDATE {state} AS s
                SET window_end = s.window_start + 1000 * (p.fingerprint_doc ->> 'window.duration_ms')::bigint
                FROM {pipelines} AS p
                WHERE p.pipeline_name = s.pipeline_name AND s.window_end IS NULL
                  AND jsonb_typeof(p.fingerprint_doc -> 'window.duration_ms') = 'number'""",
        ),
        sqlite=(
            "ALTER TABLE {state} ADD COLUMN window_end INTEGER",
            """UPDATE {state} SET window_end = window_start + 1000 * (
                SELECT json_extract(p.fingerprint_doc, '$."window.duration_ms"') FROM {pipelines} AS p
                WHERE p.pipeline_name = {state}.pipeline_name
                  AND CASE WHEN json_valid(p.fingerprint_doc)
                      THEN json_type(p.fingerprint_doc, '$."window.duration_ms"') END = 'integer')
                WHERE window_end IS NULL""",
        ),
    ),
    SchemaStep(
        4, "no emitted list on the pipelines row: emission follows from each window's bounds and the watermark",
        postgres=("ALTER TABLE {pipelines} DROP COLUMN emitted",),
        sqlite=("ALTER TABLE {pipelines} DROP COLUMN emitted",),
    ),
    SchemaStep(
        5, "emitted flag on every state row (nullable): whether a session was written to the target",
        postgres=("ALTER TABLE {state} ADD COLUMN emitted boolean",),
        sqlite=("ALTER TABLE {state} ADD COLUMN emitted INTEGER",),
    ),
    SchemaStep(
        6, "written rows and the interval trigger's timer: last row written per state row, last firing per pipeline",
        postgres=("ALTER TABLE {state} ADD COLUMN written_row bytea",
                  "ALTER TABLE {pipelines} ADD COLUMN trigger_fired_at bigint"),
        sqlite=("ALTER TABLE {state} ADD COLUMN written_row BLOB",
                "ALTER TABLE {pipelines} ADD COLUMN trigger_fired_at INTEGER"),
    ),
    SchemaStep(
        7, "pending rows (WATERMARK_TS()): one row each, keyed in release order, indexed by event time",
        postgres=(
            """CREATE TABLE {pending} (
                pipeline_name text NOT NULL,
                release_us bigint NOT NULL,
                arrival_batch bigint NOT NULL,
                seq integer NOT NULL,
                event_ts bigint,
                payload bytea NOT NULL,
                PRIMARY KEY (pipeline_name, release_us, arrival_batch, seq))""",
            "CREATE INDEX {pending_event_ts} ON {pending} (pipeline_name, event_ts) WHERE event_ts IS NOT NULL",
        ),
        sqlite=(
            """CREATE TABLE {pending} (
                pipeline_name TEXT NOT NULL,
                release_us INTEGER NOT NULL,
                arrival_batch INTEGER NOT NULL,
                seq INTEGER NOT NULL,
                event_ts INTEGER,
                payload BLOB NOT NULL,
                PRIMARY KEY (pipeline_name, release_us, arrival_batch, seq)) WITHOUT ROWID, STRICT""",
            "CREATE INDEX {pending_event_ts} ON {pending} (pipeline_name, event_ts) WHERE event_ts IS NOT NULL",
        ),
    ),
    SchemaStep(
        8, "state segments: a pipeline's session and sliding state as ordered column blobs",
        postgres=(
            """CREATE TABLE {segments} (
                pipeline_name text NOT NULL,
                seq bigint NOT NULL,
                blob bytea NOT NULL,
                PRIMARY KEY (pipeline_name, seq))""",
        ),
        sqlite=(
            """CREATE TABLE {segments} (
                pipeline_name TEXT NOT NULL,
                seq INTEGER NOT NULL,
                blob BLOB NOT NULL,
                PRIMARY KEY (pipeline_name, seq)) WITHOUT ROWID, STRICT""",
        ),
    ),
    SchemaStep(
        9, "the release watermark and the last batch's row count as columns of the pipelines row, out of its counters",
        postgres=(
            "ALTER TABLE {pipelines} ADD COLUMN release_watermark bigint",
            "ALTER TABLE {pipelines} ADD COLUMN last_batch_rows bigint",
            """UPDATE {pipelines}
                SET release_watermark = (counters ->> 'emit_release_watermark')::bigint,
                    last_batch_rows = (counters ->> 'last_batch_rows_written')::bigint,
                    counters = counters - 'emit_release_watermark' - 'last_batch_rows_written'
                WHERE jsonb_typeof(counters) = 'object'
                  AND counters ?| array['emit_release_watermark', 'last_batch_rows_written']""",
        ),
        sqlite=(
            "ALTER TABLE {pipelines} ADD COLUMN release_watermark INTEGER",
            "ALTER TABLE {pipelines} ADD COLUMN last_batch_rows INTEGER",
            """UPDATE {pipelines}
                SET release_watermark = json_extract(counters, '$.emit_release_watermark'),
                    last_batch_rows = json_extract(counters, '$.last_batch_rows_written'),
                    counters = json_remove(counters, '$.emit_release_watermark', '$.last_batch_rows_written')
                WHERE json_valid(counters) AND json_type(counters) = 'object'""",
        ),
    ),
    SchemaStep(
        10, "the lease epoch on the pipelines row: raised by every acquisition, checked by every commit of the holder",
        postgres=("ALTER TABLE {pipelines} ADD COLUMN lease_epoch bigint NOT NULL DEFAULT 0",),
        sqlite=("ALTER TABLE {pipelines} ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0",),
    ),
    SchemaStep(
        11, "the output watermark on the pipelines row: the releasing watermark kept back by the oldest pending row",
        postgres=(
            "ALTER TABLE {pipelines} ADD COLUMN output_watermark bigint",
            """UPDATE {pipelines} AS p
                SET output_watermark = LEAST(coalesce(p.release_watermark, p.watermark), (
                    SELECT q.event_ts FROM {pending} AS q
                    WHERE q.pipeline_name = p.pipeline_name AND q.event_ts IS NOT NULL
                    ORDER BY q.event_ts LIMIT 1))
                WHERE coalesce(p.release_watermark, p.watermark) IS NOT NULL""",
        ),
        sqlite=(
            "ALTER TABLE {pipelines} ADD COLUMN output_watermark INTEGER",
            """UPDATE {pipelines}
                SET output_watermark = coalesce(min(coalesce(release_watermark, watermark), (
                    SELECT q.event_ts FROM {pending} AS q
                    WHERE q.pipeline_name = {pipelines}.pipeline_name AND q.event_ts IS NOT NULL
                    ORDER BY q.event_ts LIMIT 1)), coalesce(release_watermark, watermark))
                WHERE coalesce(release_watermark, watermark) IS NOT NULL""",
        ),
    ),
)

SCHEMA_VERSION = STEPS[-1].version
