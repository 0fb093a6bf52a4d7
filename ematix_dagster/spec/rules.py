"""What every part of the spec shares: the accepted values, the bounds, and how a rule fails.

A failure names the TOML key (not the Python field), so :data:`_TOML_KEYS` lives here for the
value rules, the type checks and the ``${NAME}`` resolution alike.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn, Protocol

from ematix_dagster.columns import EVENT_TS, RESERVED_COLUMNS
from ematix_dagster.errors import PipelineConfigError

# Window kinds and aggregators are listed in ``spec.window`` (``ALL_WINDOW_KINDS``, ``AGGREGATIONS``).
LATE_POLICIES = ("drop", "reopen", "dlq")
TIME_MODES = ("event", "processing")
TIME_UNITS = ("ms", "us", "s")
SOURCE_KINDS = ("files", "rate", "kafka", "redis_stream")
FILE_FORMATS = ("parquet", "json", "csv")
ON_UNREADABLE_FILE = ("fail", "skip")
TARGET_KINDS = ("postgres", "parquet", "console")
DEAD_LETTER_KINDS = ("parquet", "postgres")
#: which dead letters carry ``_source_row`` (the row before the SQL): it may hold columns the SQL drops
SOURCE_ROW_CHOICES = ("sql_error", "all", "none")
STATE_STORE_KINDS = ("in_memory", "sqlite", "postgres")
TRIGGERS = ("available_now", "processing_time")
END_OF_INPUT = ("keep", "flush")
#: where a windowed pipeline's window state lives (docs/contract/window-state.md)
WINDOW_STATES = ("driver", "executors")

#: Largest ``*_ms`` duration: 1000 years (of 365 days). Times are 64-bit microseconds; a duration in
#: microseconds (x 1000) added to an event time as late as year 9999 (about 2.5e17 us) stays far
#: below 2**63.
MAX_DURATION_MS = 1000 * 365 * 86_400 * 1000
JAVA_INT_MAX = 2**31 - 1
JAVA_LONG_MAX = 2**63 - 1

_NAME_RE = re.compile(r"^[a-z0-9_-]+$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_TOML_KEYS = {"transform_sql": "transform.sql", "as_": "as"}


def _child(key: str, field_name: str, value: Any = None) -> str:
    """The TOML key of ``field_name`` under ``key``; a value that names its own table (a spec's
    ``shape``: ``[transform.window]`` or ``[transform]``) is named by it."""
    name = getattr(value, "TOML_TABLE", None) or _TOML_KEYS.get(field_name, field_name)
    return f"{key}.{name}" if key else name


def _fail(key: str, message: str, fix: str | None = None) -> NoReturn:
    raise PipelineConfigError(key, message, fix)


def _is_ident(value: Any) -> bool:
    return isinstance(value, str) and bool(_IDENT_RE.match(value))


def _is_reserved(name: str) -> bool:
    # Spark resolves column names case-insensitively, so "_EVENT_TS" clashes with "_event_ts".
    return name.lower() in RESERVED_COLUMNS


def _positive(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        _fail(key, f"{value!r} must be a positive integer", "use a value > 0")


def _non_negative(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        _fail(key, f"{value!r} must be an integer >= 0", "use a value >= 0")


def _listed_as_tuple(obj: Any, *names: str) -> None:
    # Lists (TOML arrays, Python callers) become tuples so specs stay hashable and comparable; any
    # other value is left for the type check to report instead of being split into characters.
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, list):
            object.__setattr__(obj, name, tuple(value))


class WatermarkKeys(Protocol):
    """The keys that set a pipeline's watermark (docs/contract/time-and-watermarks.md): a window's
    (``[transform.window]``) or a row pipeline's (``[transform]``)."""

    @property
    def event_time_column(self) -> str: ...

    @property
    def event_time_unit(self) -> str: ...

    @property
    def time_mode(self) -> str: ...

    @property
    def lateness_ms(self) -> int: ...

    @property
    def source_idleness_ms(self) -> int: ...


def _validate_watermark(keys: WatermarkKeys, key: str) -> None:
    """The watermark keys' value rules, one copy for windows and row pipelines (the table ``key``
    holds them), so the two kinds of pipeline read time the same way."""
    if keys.event_time_unit not in TIME_UNITS:
        _fail(f"{key}.event_time_unit", f"unknown unit {keys.event_time_unit!r}", 'use "ms", "us" or "s"')
    if keys.time_mode not in TIME_MODES:
        _fail(f"{key}.time_mode", f"unknown time mode {keys.time_mode!r}", 'use "event" or "processing"')
    _non_negative(f"{key}.lateness_ms", keys.lateness_ms)
    _positive(f"{key}.source_idleness_ms", keys.source_idleness_ms)
    if keys.event_time_column != EVENT_TS and not _is_ident(keys.event_time_column):
        _fail(f"{key}.event_time_column", f"{keys.event_time_column!r} is not a column name", "name a payload column")
