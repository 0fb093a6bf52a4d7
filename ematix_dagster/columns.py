"""The engine's own column names and the marker values it writes in them, in one place.

Every column name starts with ``_``. The spec rejects a user column that takes one of
:data:`RESERVED_COLUMNS` (``spec.rules._is_reserved``, case-insensitively); the others are a
batch plan's helpers, dead-letter payload columns or name prefixes. This module imports nothing of
the project, so every layer (``spec``, ``streaming``, ``spark``, ``targets``) may import it.

>>> DEAD_LETTER_COLUMNS
('_batch_id', '_source', '_event_ts', '_reason')
>>> RESERVED_COLUMNS  # doctest: +NORMALIZE_WHITESPACE
('_event_ts', '_source', '_batch_id', '_reason', '_emit_kind', '_emit_seq', '_corrupt_record', '_release_us',
 '_event_us')
"""

from __future__ import annotations

# --- what every source's rows carry (spark/sources/readers.py) -------------------------------------------

#: the row's event time (TIMESTAMP; NULL when missing or unparseable), added by every reader
EVENT_TS = "_event_ts"
#: the name of the source the row came from, added by every reader
SOURCE = "_source"
#: the view [transform] sql reads every source from (not a column)
SOURCE_VIEW = "source"
#: the raw line of a json/csv row that did not parse (NULL in one that did), Spark's reader adds it
CORRUPT = "_corrupt_record"
#: marker: the heartbeat source's ``_source`` value and its place in the checkpoint's offsets
HEARTBEAT = "_heartbeat"

# --- dead letters (spark/plans/windows/kind_plan.py, spark/input/input_files.py, targets/) -------------------------

#: the micro-batch a dead-letter row was written by, added to every dead-letter row
BATCH_ID = "_batch_id"
#: why a row updates no window (NULL when it does): set by spark/batch/batch_columns.py, rejects, window plans
REASON = "_reason"
#: envelope columns of dead-letter rows, in the order of the Postgres dead-letter table
DEAD_LETTER_COLUMNS = (BATCH_ID, SOURCE, EVENT_TS, REASON)
#: an unreadable file's path, in its dead-letter row (spark/input/input_files.py)
FILE_PATH = "_file_path"
#: why the file could not be read, in its dead-letter row (spark/input/input_files.py)
FILE_ERROR = "_file_error"
#: the rows the file's footer declares (NULL if unknown), in its dead-letter row (spark/input/input_files.py)
FILE_ROWS = "_file_rows"

# --- the transform's output (spark/plans/safe_sql.py, sql/release_plan.py) -----------------------------------

#: the first failing expression of a guarded SQL's row (NULL when none failed), added by guard_sql
SQL_ERROR = "_sql_error"
#: the row as read, before the SQL (JSON; NULL where ``[dead_letter] include_source_row`` leaves it
#: out), added by guard_sql: what a ``sql_error`` dead letter's failing value was
SOURCE_ROW = "_source_row"
#: a row's release time under ``WATERMARK_TS()`` (µs; NULL: never released), added by sql/release_plan.py
RELEASE_COLUMN = "_release_us"
#: a row pipeline's hidden column: the row's ``_event_ts`` in µs, appended beside
#: ``RELEASE_COLUMN`` (release order and the output watermark read it; the SELECT may drop ``_event_ts``)
EVENT_US = "_event_us"

# --- a batch's own values as columns (spark/batch/batch_values.py; µs, bounds NULL before a watermark) ---

#: the batch's processing time (µs), joined onto every row by with_batch_values
BATCH_TIME = "_batch_time_us"
#: ``Engine.closed_before()``: the end at or below which windows are closed (µs)
CLOSED_BEFORE = "_closed_before_us"
#: ``Engine.emitted_before()``: the end at or below which windows were emitted (µs)
EMITTED_BEFORE = "_emitted_before_us"
#: the batch-value columns, in the order with_batch_values adds them
BATCH_VALUES = (BATCH_TIME, CLOSED_BEFORE, EMITTED_BEFORE)

# --- the window plans' helper columns (spark/batch/batch_columns.py, spark/plans/windows/) -------------------

#: the event time in µs (BIGINT), added by the batch's classification and the window plans
TS = "_ts"
#: the row's class: NULL (it updates windows), "late", or the pre-SQL bad-row reason
CLASS = "_cls"
#: true on exactly one copy of each input row (a hopping row is copied once per window)
PRIMARY = "_primary"
#: a fixed or sliding window's start (µs), the partials' key column
WINDOW_START = "_ws"
#: a hopping row's copy number (posexplode's position; copy 0 is the primary), fixed plan
COPY_INDEX = "_pos"
#: fixed plan: the row's first (possibly closed) window start; session plan: a session's first event (µs)
FIRST = "_first"
#: fixed plan: the row's last window start; session plan: a session's last event (µs)
LAST = "_last"
#: the row's first window start not yet closed (µs), fixed plan
FIRST_OPEN = "_first_open"
#: the one grouping column of a row's window start or, for a row that updates no window, a code of
#: its class, fixed plan (spark/plans/windows/kind_plan.py: ``class_slot``)
SLOT = "_slot"
#: the event time's bucket (``t // cap``) a session is found in, session plan (and the executor plan's)
BUCKET = "_bucket"
#: Spark's window struct (``start``, ``end``) a row is grouped by, executor plan (spark/plans/executor_plan.py)
WINDOW = "_window"
#: 1 where a row starts a new session in its bucket (gap exceeded), session plan
NEW_SESSION = "_new"
#: a session's index in its bucket (meaningless outside the batch), session plan
SESSION_INDEX = "_sid"
#: per-source hidden result columns ``<prefix><source index>`` (several sources): its rows, spark/batch/batch_columns.py
SOURCE_ROWS_PREFIX = "_rows_"
#: per-source hidden result columns ``<prefix><source index>``: its newest valid event time (µs), spark/batch/batch_columns.py
SOURCE_MAX_PREFIX = "_max_"
#: an aggregation's partial columns ``<prefix><aggregation index>`` (and the aggregator's suffixes), spark/plans/window_plan.py
PARTIAL_PREFIX = "_p"
#: an aggregation's input projected before the groupBy, ``<prefix><n>``, spark/plans/window_plan.py
INPUT_PREFIX = "_in"
#: hidden result column every kind provides: the rows of the group
ROWS = "_n"
#: hidden result column: a hopping row's window assignments that were already closed
LATE_ASSIGNMENTS = "_late_assignments"
#: hidden result column (under ``reopen``): the rows that reopen windows emitted before the batch
REOPENED = "_reopened"

# --- window rows written to targets (spark/batch/convert.py, targets/) ----------------------------------

#: a window row's kind, one of FINAL, CORRECTION, RETRACT, added by spark/batch/convert.py
EMIT_KIND = "_emit_kind"
#: a row's order within its batch (session windows, whose batches may retract rows: docs/contract/emission.md)
EMIT_SEQ = "_emit_seq"
#: marker (``_emit_kind``): an open window's row written by an early trigger (docs/contract/emission.md)
EARLY = "early"
#: marker (``_emit_kind``): a closed window's row, the first written of it
FINAL = "final"
#: marker (``_emit_kind``): a row for a window emitted before (it changed, or was reopened)
CORRECTION = "correction"
#: marker (``_emit_kind``): a row that withdraws a key written earlier (it repeats that row exactly)
RETRACT = "retract"

#: columns the engine adds or reserves; user names may not take them (``spec.rules._is_reserved``)
RESERVED_COLUMNS = (EVENT_TS, SOURCE, BATCH_ID, REASON, EMIT_KIND, EMIT_SEQ, CORRUPT, RELEASE_COLUMN, EVENT_US)
