"""The pipeline spec: typed dataclasses, TOML load/dump and every load-time rule.

The TOML file is the single description of a pipeline (SPEC.md §1). The dataclasses mirror it one
to one so that ``load_pipeline_str(dump_pipeline(spec)) == spec``. Strings keep their ``${NAME}``
placeholders, so secrets stay out of dumps, fingerprints and code versions; whatever does I/O works
on :meth:`PipelineSpec.resolved`, the copy with every placeholder expanded.

Every rule is checked when the spec is built, so a bad config fails before Spark starts, with a
:class:`PipelineConfigError` that names the key, the value and the fix. Types are checked on the
spec as written (from the dataclass annotations: TOML gives ``"false"`` where a boolean was meant),
values on the resolved copy (``table = "${SCHEMA}.clicks"`` is a valid table once SCHEMA is set).
"""

from __future__ import annotations

import datetime as _dt
import functools
import math
import os
import re
import tomllib
import types
from dataclasses import MISSING as _MISSING
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Mapping, TypeVar, Union, get_args, get_origin, get_type_hints

import tomli_w

from ematix_dagster.errors import PipelineConfigError

WINDOW_KINDS = ("tumbling", "hopping")
RESERVED_WINDOW_KINDS = ("session", "sliding")
AGG_KINDS = ("count", "count_col", "sum", "min", "max", "avg", "first", "last", "count_distinct")
AGGS_WITH_COLUMN = tuple(a for a in AGG_KINDS if a != "count")
LATE_POLICIES = ("drop", "reopen", "dlq")
TIME_MODES = ("event", "processing")
TIME_UNITS = ("ms", "us", "s")
SOURCE_KINDS = ("files", "rate", "kafka")
FILE_FORMATS = ("parquet", "json", "csv")
TARGET_KINDS = ("postgres", "parquet", "console")
DEAD_LETTER_KINDS = ("parquet", "postgres")
STATE_STORE_KINDS = ("in_memory", "sqlite", "postgres")
TRIGGERS = ("available_now", "processing_time")
END_OF_INPUT = ("keep", "flush")

#: Columns the engine adds or reserves; user names may not take them.
RESERVED_COLUMNS = ("_event_ts", "_source", "_batch_id", "_reason", "_emit_kind", "_corrupt_record")

#: Largest ``*_ms`` duration: 1000 years (of 365 days). Times are 64-bit microseconds; a duration in
#: microseconds (x 1000) added to an event time as late as year 9999 (about 2.5e17 us) stays far
#: below 2**63.
MAX_DURATION_MS = 1000 * 365 * 86_400 * 1000
JAVA_INT_MAX = 2**31 - 1
JAVA_LONG_MAX = 2**63 - 1

# Upper bounds of integer keys besides the *_ms durations, with the reason the message gives.
_INT_BOUNDS: dict[str, tuple[int, str]] = {
    "max_files_per_trigger": (JAVA_INT_MAX, "Spark reads maxFilesPerTrigger as a Java int"),
    "rows_per_second": (JAVA_INT_MAX, "the rate source multiplies it by elapsed seconds in 64 bits"),
    "max_offsets_per_trigger": (JAVA_LONG_MAX, "Spark reads maxOffsetsPerTrigger as a Java long"),
    "max_groups_per_window": (JAVA_INT_MAX, "a window's groups are held in the driver's memory"),
    "max_distinct_values_per_group": (JAVA_INT_MAX, "the distinct values are held in the driver's memory"),
}

_NAME_RE = re.compile(r"^[a-z0-9_-]+$")
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Seed 001 spellings: refused with the canonical key, so copied configs get a precise hint.
_SEED_001_SPELLINGS = {
    "kind": "agg",
    "input_column": "column",
    "output_name": "as",
    "width_ms": "duration_ms",
}


def _fail(key: str, message: str, fix: str | None = None) -> None:
    raise PipelineConfigError(key, message, fix)


def _is_ident(value: Any) -> bool:
    return isinstance(value, str) and bool(_IDENT_RE.match(value))


def _is_reserved(name: str) -> bool:
    # Spark resolves column names case-insensitively, so "_EVENT_TS" clashes with "_event_ts".
    return name.lower() in RESERVED_COLUMNS


@dataclass(frozen=True)
class Aggregation:
    """One output column of a window: ``agg`` over ``column``, named ``as_``.

    >>> Aggregation(agg="sum", column="amount", as_="amount_sum").as_
    'amount_sum'
    """

    agg: str
    as_: str
    column: str | None = None
    mode: str | None = None
    max_distinct_values_per_group: int | None = None

    def validate(self, key: str) -> None:
        if self.agg not in AGG_KINDS:
            _fail(f"{key}.agg", f"unknown aggregator {self.agg!r}", f"use one of {', '.join(AGG_KINDS)}")
        if not _is_ident(self.as_):
            _fail(f"{key}.as", f"{self.as_!r} is not a valid column name", "use letters, digits and _")
        if _is_reserved(self.as_):
            _fail(f"{key}.as", f"{self.as_!r} is reserved by the engine", "pick another alias")
        if self.agg == "count":
            if self.column is not None:
                _fail(f"{key}.column", f"count counts every row and takes no column (got {self.column!r})",
                      'use agg = "count_col" to count non-null values of a column')
        elif not self.column:
            _fail(f"{key}.column", f"{self.agg} needs a column", 'add column = "<input column>"')
        if self.agg == "count_distinct":
            mode = self.mode or "approximate"
            if mode not in ("approximate", "exact"):
                _fail(f"{key}.mode", f"unknown mode {mode!r}", 'use "approximate" or "exact"')
            if mode == "exact":
                if self.max_distinct_values_per_group is None:
                    _fail(f"{key}.max_distinct_values_per_group", "is required with mode = \"exact\"",
                          "set a cap on distinct values per (window, group), e.g. 100_000")
                _positive(f"{key}.max_distinct_values_per_group", self.max_distinct_values_per_group)
            elif self.max_distinct_values_per_group is not None:
                _fail(f"{key}.max_distinct_values_per_group", "only applies to mode = \"exact\"",
                      "remove it, or set mode = \"exact\"")
        else:
            if self.mode is not None:
                _fail(f"{key}.mode", f"mode = {self.mode!r} given, but only count_distinct has a mode, not {self.agg}",
                      "remove mode")
            if self.max_distinct_values_per_group is not None:
                _fail(f"{key}.max_distinct_values_per_group", "only applies to count_distinct",
                      "remove it")

    @property
    def distinct_mode(self) -> str:
        return self.mode or "approximate"


@dataclass(frozen=True)
class Window:
    """The window, its watermark rules and its aggregations (``[transform.window]``).

    >>> w = Window(kind="tumbling", duration_ms=60_000, group_by=("user_id",),
    ...            max_groups_per_window=1_000, aggregations=(Aggregation("count", "n"),))
    >>> w.kind, w.late_data
    ('tumbling', 'drop')
    """

    kind: str
    duration_ms: int
    max_groups_per_window: int
    aggregations: tuple[Aggregation, ...]
    group_by: tuple[str, ...] = ()
    hop_ms: int | None = None
    event_time_column: str = "_event_ts"
    event_time_unit: str = "ms"
    time_mode: str = "event"
    lateness_ms: int = 0
    source_idleness_ms: int = 60_000
    late_data: str = "drop"
    allowed_lateness_ms: int | None = None
    hll_precision: int = 14
    crash_recovery: str = "at_least_once"
    on_state_cap: str = "fail"
    window_start_column: str = "window_start"
    window_end_column: str = "window_end"

    def __post_init__(self) -> None:
        _listed_as_tuple(self, "group_by", "aggregations")

    def validate(self, key: str = "transform.window") -> None:
        if self.kind in RESERVED_WINDOW_KINDS:
            _fail(f"{key}.kind", f"{self.kind!r} windows are not available in this version",
                  'use "tumbling" or "hopping"')
        if self.kind not in WINDOW_KINDS:
            _fail(f"{key}.kind", f"unknown window kind {self.kind!r}", 'use "tumbling" or "hopping"')
        _positive(f"{key}.duration_ms", self.duration_ms)
        if self.kind == "hopping":
            if self.hop_ms is None:
                _fail(f"{key}.hop_ms", "is required for hopping windows",
                      "set hop_ms (the distance between window starts), <= duration_ms")
            _positive(f"{key}.hop_ms", self.hop_ms)
            if self.hop_ms > self.duration_ms:
                _fail(f"{key}.hop_ms", f"{self.hop_ms} is larger than duration_ms={self.duration_ms}",
                      "use hop_ms <= duration_ms (gaps between windows would drop rows)")
        elif self.hop_ms is not None:
            _fail(f"{key}.hop_ms", f"hop_ms = {self.hop_ms!r} only applies to hopping windows, not {self.kind!r}",
                  'remove it or use kind = "hopping"')
        if self.event_time_unit not in TIME_UNITS:
            _fail(f"{key}.event_time_unit", f"unknown unit {self.event_time_unit!r}", 'use "ms", "us" or "s"')
        if self.time_mode not in TIME_MODES:
            _fail(f"{key}.time_mode", f"unknown time mode {self.time_mode!r}", 'use "event" or "processing"')
        _non_negative(f"{key}.lateness_ms", self.lateness_ms)
        _positive(f"{key}.source_idleness_ms", self.source_idleness_ms)
        if self.late_data not in LATE_POLICIES:
            _fail(f"{key}.late_data", f"unknown policy {self.late_data!r}", 'use "drop", "reopen" or "dlq"')
        if self.late_data == "reopen":
            if self.allowed_lateness_ms is None:
                _fail(f"{key}.allowed_lateness_ms", 'is required with late_data = "reopen"',
                      "set how long (ms past window end) emitted windows accept corrections")
            _positive(f"{key}.allowed_lateness_ms", self.allowed_lateness_ms)
        elif self.allowed_lateness_ms is not None:
            _fail(f"{key}.allowed_lateness_ms",
                  f'allowed_lateness_ms = {self.allowed_lateness_ms!r} only applies to late_data = "reopen", '
                  f"not {self.late_data!r}",
                  "remove it or use late_data = \"reopen\"")
        if self.max_groups_per_window is None:
            _fail(f"{key}.max_groups_per_window", "is mandatory", "set the most groups one window may hold")
        _positive(f"{key}.max_groups_per_window", self.max_groups_per_window)
        if not isinstance(self.hll_precision, int) or isinstance(self.hll_precision, bool) \
                or not 4 <= self.hll_precision <= 21:
            _fail(f"{key}.hll_precision", f"{self.hll_precision!r} is outside 4..21", "use 14 (~0.8 % error)")
        if self.crash_recovery == "kafka_eos":
            _fail(f"{key}.crash_recovery", '"kafka_eos" is reserved and not available',
                  'use "at_least_once" or "persisted"')
        if self.crash_recovery not in ("at_least_once", "persisted"):
            _fail(f"{key}.crash_recovery", f"unknown value {self.crash_recovery!r}",
                  'use "at_least_once" or "persisted"')
        if self.on_state_cap in ("drop_new_groups", "backpressure"):
            _fail(f"{key}.on_state_cap", f"{self.on_state_cap!r} is reserved and not available",
                  'use "fail" (the only accepted value)')
        if self.on_state_cap != "fail":
            _fail(f"{key}.on_state_cap", f"unknown value {self.on_state_cap!r}", 'use "fail"')
        if not self.aggregations:
            _fail(f"{key}.aggregations", "at least one aggregation is required",
                  'add [[transform.window.aggregations]] with agg = "count", as = "n"')
        for col_key, col in (("window_start_column", self.window_start_column),
                             ("window_end_column", self.window_end_column)):
            if not _is_ident(col):
                _fail(f"{key}.{col_key}", f"{col!r} is not a valid column name", "use letters, digits and _")
            if _is_reserved(col):
                _fail(f"{key}.{col_key}", f"{col!r} is reserved by the engine", "pick another column name")
        if self.window_start_column.lower() == self.window_end_column.lower():
            _fail(f"{key}.window_end_column", "equals window_start_column", "give the two window columns different names")
        if self.event_time_column != "_event_ts" and not _is_ident(self.event_time_column):
            _fail(f"{key}.event_time_column", f"{self.event_time_column!r} is not a column name", "name a payload column")
        seen: dict[str, str] = {}
        for i, g in enumerate(self.group_by):
            if not _is_ident(g):
                _fail(f"{key}.group_by[{i}]", f"{g!r} is not a valid column name", "name a column of the input")
            if _is_reserved(g):
                _fail(f"{key}.group_by[{i}]", f"{g!r} is reserved by the engine", "group by a payload column")
            if g.lower() in seen:
                _fail(f"{key}.group_by[{i}]", f"{g!r} appears twice", "list each group column once")
            seen[g.lower()] = "group_by column"
        # Output column names are compared case-insensitively, as Spark and unquoted SQL do.
        for name, what in ((self.window_start_column, "window_start_column"),
                           (self.window_end_column, "window_end_column")):
            if name.lower() in seen:
                _fail(f"{key}.{what}", f"{name!r} collides with a {seen[name.lower()]}", "rename one of them")
            seen[name.lower()] = what
        for i, agg in enumerate(self.aggregations):
            akey = f"{key}.aggregations[{i}]"
            agg.validate(akey)
            if agg.as_.lower() in seen:
                _fail(f"{akey}.as", f"{agg.as_!r} collides with the {seen[agg.as_.lower()]}", "pick a unique alias")
            seen[agg.as_.lower()] = "alias of another aggregation"

    @property
    def hop(self) -> int:
        """Distance between window starts (the duration for tumbling windows)."""
        return self.hop_ms if self.kind == "hopping" else self.duration_ms  # type: ignore[return-value]

    @property
    def retention_ms(self) -> int:
        """How long past its end a window stays in state (0 unless ``reopen``)."""
        return (self.allowed_lateness_ms or 0) if self.late_data == "reopen" else 0


@dataclass(frozen=True)
class Source:
    """One ``[[sources]]`` entry; its ``name`` becomes the ``_source`` value of its rows."""

    name: str
    kind: str
    format: str | None = None
    path: str | None = None
    schema: str | None = None
    event_time_column: str | None = None
    event_time_unit: str = "ms"
    max_files_per_trigger: int | None = None
    max_future_skew_ms: int = 3_600_000
    rows_per_second: int | None = None
    bootstrap_servers: str | None = None
    topic: str | None = None
    max_offsets_per_trigger: int | None = None
    starting_offsets: str | None = None
    header: bool | None = None

    def validate(self, key: str) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            _fail(f"{key}.name", f"{self.name!r} is not a valid source name", "use [a-z0-9_-]")
        if self.name == "_heartbeat":
            _fail(f"{key}.name", '"_heartbeat" is reserved for the engine', "pick another name")
        if self.kind not in SOURCE_KINDS:
            _fail(f"{key}.kind", f"unknown source kind {self.kind!r}", 'use "files", "rate" or "kafka"')
        if self.event_time_unit not in TIME_UNITS:
            _fail(f"{key}.event_time_unit", f"unknown unit {self.event_time_unit!r}", 'use "ms", "us" or "s"')
        _non_negative(f"{key}.max_future_skew_ms", self.max_future_skew_ms)
        allowed = {
            "files": {"format", "path", "schema", "event_time_column", "max_files_per_trigger", "header"},
            "rate": {"rows_per_second"},
            "kafka": {"bootstrap_servers", "topic", "max_offsets_per_trigger", "starting_offsets"},
        }[self.kind]
        optional = {"format", "path", "schema", "event_time_column", "max_files_per_trigger", "rows_per_second",
                    "bootstrap_servers", "topic", "max_offsets_per_trigger", "starting_offsets", "header"}
        for f in sorted(optional - allowed):
            if getattr(self, f) is not None:
                _fail(f"{key}.{f}", f"does not apply to a {self.kind} source", "remove it")
        if self.kind == "files":
            if self.format not in FILE_FORMATS:
                _fail(f"{key}.format", f"{self.format!r} is not a file format", 'use "parquet", "json" or "csv"')
            if not self.path:
                _fail(f"{key}.path", "is required for a files source", "name the directory to watch")
            if not self.schema:
                _fail(f"{key}.schema", "is required for a files source (streaming reads infer nothing)",
                      'give a DDL schema such as "user_id BIGINT, ts TIMESTAMP"')
            if not self.event_time_column:
                _fail(f"{key}.event_time_column", "is required for a files source",
                      "name the column that holds each row's event time")
            if self.max_files_per_trigger is not None:
                _positive(f"{key}.max_files_per_trigger", self.max_files_per_trigger)
            if self.header is not None and self.format != "csv":
                _fail(f"{key}.header", f"header = {str(self.header).lower()} only applies to csv files, "
                      f"not {self.format}", "remove it")
        elif self.kind == "rate":
            if self.rows_per_second is not None:
                _positive(f"{key}.rows_per_second", self.rows_per_second)
        else:
            if not self.bootstrap_servers:
                _fail(f"{key}.bootstrap_servers", "is required for a kafka source", 'e.g. "127.0.0.1:9092"')
            if not self.topic:
                _fail(f"{key}.topic", "is required for a kafka source", "name the topic to read")
            if self.max_offsets_per_trigger is not None:
                _positive(f"{key}.max_offsets_per_trigger", self.max_offsets_per_trigger)


@dataclass(frozen=True)
class Target:
    """Where closed windows go (``[target]``)."""

    kind: str
    url: str | None = field(default=None, repr=False)  # resolved, it may hold a password
    table: str | None = None
    create_table: bool = False
    same_transaction: bool = False
    path: str | None = None

    def validate(self, key: str = "target") -> None:
        if self.kind not in TARGET_KINDS:
            _fail(f"{key}.kind", f"unknown target kind {self.kind!r}", 'use "postgres", "parquet" or "console"')
        _validate_sink_fields(key, self.kind, self.url, self.table, self.path)
        if self.same_transaction and self.kind != "postgres":
            _fail(f"{key}.same_transaction", "only a postgres target can share the store's transaction", "remove it")


@dataclass(frozen=True)
class DeadLetter:
    """Where late, invalid, future and malformed rows go (``[dead_letter]``)."""

    kind: str
    path: str | None = None
    url: str | None = field(default=None, repr=False)  # resolved, it may hold a password
    table: str | None = None
    create_table: bool = False

    def validate(self, key: str = "dead_letter") -> None:
        if self.kind not in DEAD_LETTER_KINDS:
            _fail(f"{key}.kind", f"unknown dead-letter kind {self.kind!r}", 'use "parquet" or "postgres"')
        _validate_sink_fields(key, self.kind, self.url, self.table, self.path)


@dataclass(frozen=True)
class StateStore:
    """Where window state lives between batches (``[state_store]``; absent: SQLite).

    ``checkpoint_interval_ms`` (seed 001) is accepted and has no effect: every micro-batch commits
    its state, which is stricter than any interval.
    """

    kind: str = "sqlite"
    path: str | None = None
    url: str | None = field(default=None, repr=False)  # resolved, it may hold a password
    schema: str | None = None
    checkpoint_interval_ms: int | None = None

    def validate(self, key: str = "state_store") -> None:
        if self.kind not in STATE_STORE_KINDS:
            _fail(f"{key}.kind", f"unknown state store {self.kind!r}", 'use "in_memory", "sqlite" or "postgres"')
        if self.checkpoint_interval_ms is not None:
            _positive(f"{key}.checkpoint_interval_ms", self.checkpoint_interval_ms)
        if self.kind == "postgres" and not self.url:
            _fail(f"{key}.url", "is required for a postgres store", 'use url = "${EMATIX_STATE_URL}"')
        if self.kind != "sqlite" and self.path is not None:
            _fail(f"{key}.path", f"does not apply to a {self.kind} store", "remove it")
        if self.kind != "postgres":
            if self.url is not None:  # never shown: it may hold a password
                _fail(f"{key}.url", f"does not apply to a {self.kind} store", "remove it")
            if self.schema is not None:
                _fail(f"{key}.schema", f"schema = {self.schema!r} does not apply to a {self.kind} store", "remove it")
        if self.schema is not None and not _IDENT_RE.match(self.schema):
            _fail(f"{key}.schema", f"{self.schema!r} is not a schema name", "use letters, digits and _")

    @property
    def durable(self) -> bool:
        return self.kind != "in_memory"


@dataclass(frozen=True)
class Run:
    """How the streaming query is triggered and where its checkpoint lives (``[run]``)."""

    checkpoint_location: str
    trigger: str = "available_now"
    trigger_interval_ms: int = 1_000
    end_of_input: str = "keep"

    def validate(self, key: str = "run") -> None:
        if self.trigger not in TRIGGERS:
            _fail(f"{key}.trigger", f"unknown trigger {self.trigger!r}", 'use "available_now" or "processing_time"')
        _positive(f"{key}.trigger_interval_ms", self.trigger_interval_ms)
        if self.end_of_input not in END_OF_INPUT:
            _fail(f"{key}.end_of_input", f"unknown value {self.end_of_input!r}", 'use "keep" or "flush"')
        if self.end_of_input == "flush" and self.trigger != "available_now":
            _fail(f"{key}.end_of_input", '"flush" only applies to trigger = "available_now"',
                  'remove it or use trigger = "available_now"')
        if not self.checkpoint_location:
            _fail(f"{key}.checkpoint_location", f"{self.checkpoint_location!r} is not a path",
                  'e.g. ".ematix/checkpoints/<pipeline>"')
        if "://" in self.checkpoint_location and not self.checkpoint_location.startswith("file://"):
            _fail(f"{key}.checkpoint_location", "must be a local path (the engine reads its offsets log)",
                  "use a local directory")


@dataclass(frozen=True)
class PipelineSpec:
    """A whole pipeline: sources -> optional row-wise SQL -> window -> target."""

    pipeline_name: str
    sources: tuple[Source, ...]
    window: Window
    target: Target
    run: Run
    transform_sql: str | None = None
    dead_letter: DeadLetter | None = None
    state_store: StateStore = field(default_factory=StateStore)
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        _listed_as_tuple(self, "sources")

    def validate(self) -> "PipelineSpec":
        """Check the types as written, then every value rule on the resolved copy; return ``self``."""
        _check_types(self)
        self.resolved()._validate_values()
        return self

    def resolved(self) -> "PipelineSpec":
        """This spec with ``${NAME}`` expanded in every string: what sources, stores, targets and
        checkpoints are opened with. Never dump it or fingerprint it (it may hold passwords)."""
        return _resolved(self, "")

    def _validate_values(self) -> None:
        if not _NAME_RE.match(self.pipeline_name):
            _fail("pipeline_name", f"{self.pipeline_name!r} is not a valid name", "use [a-z0-9_-]")
        if not self.sources:
            _fail("sources", "at least one [[sources]] entry is required", "add a [[sources]] table")
        names: set[str] = set()
        for i, src in enumerate(self.sources):
            src.validate(f"sources[{i}]")
            if src.name in names:
                _fail(f"sources[{i}].name", f"{src.name!r} is used twice", "give every source a unique name")
            names.add(src.name)
        self.window.validate()
        self.target.validate()
        if self.dead_letter is not None:
            self.dead_letter.validate()
        if self.window.late_data == "dlq" and self.dead_letter is None:
            _fail("dead_letter", 'is required with late_data = "dlq"', "add a [dead_letter] table (parquet or postgres)")
        self.state_store.validate()
        if self.window.crash_recovery == "persisted" and not self.state_store.durable:
            _fail("transform.window.crash_recovery", '"persisted" needs a durable [state_store]',
                  'add [state_store] kind = "sqlite" or "postgres", or use "at_least_once"')
        if self.target.same_transaction and self.state_store.kind != "postgres":
            _fail("target.same_transaction", "needs a postgres [state_store] in the same database",
                  'set [state_store] kind = "postgres" or remove same_transaction')
        self.run.validate()
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            _fail("metrics_port", f"{self.metrics_port!r} is not a TCP port", "use 1..65535")
        if self.transform_sql is not None and not self.transform_sql.strip():
            _fail("transform.sql", "is empty", "remove [transform] sql or write a SELECT")

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    def state_upper_bound_bytes(self) -> int:
        """Seed 000's sizing formula: active windows x max groups x per-group state."""
        w = self.window
        # A window stays open until the watermark (max event time - lateness_ms) passes its end, then
        # is retained for allowed_lateness_ms under reopen; with lateness 0 this is seed 000's formula.
        active = math.ceil((w.duration_ms + w.lateness_ms + w.retention_ms) / w.hop)
        per_group = 64 + 16 * len(w.group_by)
        for a in w.aggregations:
            if a.agg == "count_distinct":
                per_group += (1 << w.hll_precision) if a.distinct_mode == "approximate" \
                    else 48 * (a.max_distinct_values_per_group or 0)
            elif a.agg in ("first", "last", "avg"):
                per_group += 32
            else:
                per_group += 16
        return active * w.max_groups_per_window * per_group


def _positive(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        _fail(key, f"{value!r} must be a positive integer", "use a value > 0")


def _non_negative(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        _fail(key, f"{value!r} must be an integer >= 0", "use a value >= 0")


def _validate_sink_fields(key: str, kind: str, url: str | None, table: str | None, path: str | None) -> None:
    if kind == "postgres":
        if not url:
            _fail(f"{key}.url", "is required for postgres", 'use url = "${EMATIX_TARGET_URL}"')
        if not table:
            _fail(f"{key}.table", "is required for postgres", 'e.g. table = "public.user_clicks_1min"')
        parts = table.split(".")
        if len(parts) > 2 or not all(_IDENT_RE.match(p) for p in parts):
            _fail(f"{key}.table", f"{table!r} is not schema.table", 'e.g. "public.user_clicks_1min"')
        if path is not None:
            _fail(f"{key}.path", "does not apply to postgres", "remove it")
    elif kind == "parquet":
        if not path:
            _fail(f"{key}.path", "is required for parquet", "name an output directory")
        if url is not None:
            _fail(f"{key}.url", "does not apply to parquet", "remove it")  # never shown: it may hold a password
        if table is not None:
            _fail(f"{key}.table", f"table = {table!r} does not apply to parquet", "remove it")
    else:
        if url is not None or table is not None or path is not None:
            _fail(f"{key}.kind", "console takes no url, table or path", "remove them")


# ---------------------------------------------------------------------------------------------
# ${ENV} placeholders


def resolve_env(value: str | None) -> str | None:
    """Expand ``${NAME}`` from the environment at the point of use."""
    if value is None:
        return None

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in os.environ:
            raise PipelineConfigError(f"${{{name}}}", "environment variable is not set", f"export {name}=...")
        return os.environ[name]

    return _ENV_RE.sub(sub, value)


_TOML_KEYS = {"window": "transform.window", "transform_sql": "transform.sql", "as_": "as"}
_T = TypeVar("_T")


def _child(key: str, field_name: str) -> str:
    name = _TOML_KEYS.get(field_name, field_name)
    return f"{key}.{name}" if key else name


def _resolved(obj: _T, key: str) -> _T:
    # Unset variables are reported with the TOML key that uses them, not just the variable's name.
    if isinstance(obj, str):
        for name in _ENV_RE.findall(obj):
            if name not in os.environ:
                _fail(key or "spec", f"uses ${{{name}}} but the environment variable {name} is not set",
                      f"export {name}=... where the pipeline is loaded and run")
        return resolve_env(obj)  # type: ignore[return-value]
    if isinstance(obj, tuple):
        return tuple(_resolved(item, f"{key}[{i}]") for i, item in enumerate(obj))  # type: ignore[return-value]
    if is_dataclass(obj) and not isinstance(obj, type):
        return replace(obj, **{f.name: _resolved(getattr(obj, f.name), _child(key, f.name)) for f in fields(obj)})
    return obj


def _listed_as_tuple(obj: Any, *names: str) -> None:
    # Lists (TOML arrays, Python callers) become tuples so specs stay hashable and comparable; any
    # other value is left for the type check to report instead of being split into characters.
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, list):
            object.__setattr__(obj, name, tuple(value))


# ---------------------------------------------------------------------------------------------
# Types, from the dataclass annotations


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping) or is_dataclass(value):
        return "a table"
    if isinstance(value, (_dt.date, _dt.time)):
        return "a date/time"
    return f"a {type(value).__name__}"


def _int_bound(name: str) -> tuple[int, str] | None:
    if name.endswith("_ms"):
        return MAX_DURATION_MS, "1000 years: durations become 64-bit microseconds added to event times"
    return _INT_BOUNDS.get(name)


def _check_types(obj: Any, key: str = "") -> None:
    """Every field of ``obj`` (recursively) against its annotation, so that no rule compares or
    formats a value of the wrong type, and ``"false"`` is never taken for a true boolean."""
    hints = _hints(type(obj))
    for f in fields(obj):
        _check_type(_child(key, f.name), _TOML_KEYS.get(f.name, f.name), getattr(obj, f.name), hints[f.name])


def _check_type(key: str, name: str, value: Any, hint: Any) -> None:
    if get_origin(hint) in (Union, types.UnionType):  # X | None
        if value is None:
            return
        (hint,) = [a for a in get_args(hint) if a is not type(None)]
    if value is None:
        _fail(key, "is mandatory", f"set {name}")
    if get_origin(hint) is tuple:
        if not isinstance(value, tuple):
            example = f'["{value}"]' if isinstance(value, str) else "[...]"
            _fail(key, f"{value!r} is {_toml_type(value)}, not a list", f"write a list, e.g. {name} = {example}")
        for i, item in enumerate(value):
            _check_type(f"{key}[{i}]", name, item, get_args(hint)[0])
    elif is_dataclass(hint):
        if not isinstance(value, hint):
            _fail(key, f"is {_toml_type(value)}, not a {hint.__name__}", f"write the [{key}] table")
        _check_types(value, key)
    elif hint is bool:
        if not isinstance(value, bool):
            _fail(key, f"{value!r} is {_toml_type(value)}, not a boolean",
                  f"write {name} = true or {name} = false, without quotes")
    elif hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            _fail(key, f"{value!r} is {_toml_type(value)}, not an integer", "write a whole number without quotes")
        bound = _int_bound(name)
        if bound is not None and value > bound[0]:
            _fail(key, f"{value} is larger than {bound[0]:_} ({bound[1]})", f"use at most {bound[0]:_}")
    elif hint is str:
        if not isinstance(value, str):
            scalar = isinstance(value, (int, float))
            _fail(key, f"{value!r} is {_toml_type(value)}, not a string",
                  f'write it in quotes, e.g. "{value}"' if scalar else "write a string in quotes")
    else:  # a field whose annotation has no rule here: a programming error, not a config error
        raise TypeError(f"{key}: no type rule for {hint!r}")


# ---------------------------------------------------------------------------------------------
# Warnings: valid, but unwise

_URL_USERINFO = re.compile(r"://([^/?#@\s]*)@")
_QUERY_PASSWORD = re.compile(r"[?&]password=([^&#\s]*)", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def _literal_password(url: str) -> bool:
    """Whether ``url`` holds a password typed into the file (not only ``${NAME}`` placeholders)."""
    found = [m.group(1).partition(":")[2] for m in _URL_USERINFO.finditer(url)]
    found += [m.group(1) for m in _QUERY_PASSWORD.finditer(url)] + [m.group(1) for m in _KV_PASSWORD.finditer(url)]
    return any(_ENV_RE.sub("", password).strip("'") for password in found)


def spec_warnings(spec: PipelineSpec) -> list[str]:
    """One line per unwise but valid setting of ``spec`` as written: today, each URL whose password
    is typed into the file (files are shared, versioned and printed). The password is never shown."""
    urls = (("target.url", spec.target.url, "EMATIX_TARGET_URL"),
            ("dead_letter.url", spec.dead_letter.url if spec.dead_letter is not None else None, "EMATIX_DLQ_URL"),
            ("state_store.url", spec.state_store.url, "EMATIX_STATE_URL"))
    return [f"{key}: the URL holds a password written in the pipeline file; move the password to an environment "
            f'variable, e.g. url = "postgresql://user:${{PGPASSWORD}}@host/db" (any string may use ${{NAME}}), '
            f'or the whole URL, e.g. url = "${{{variable}}}"'
            for key, url, variable in urls if url and _literal_password(url)]


# ---------------------------------------------------------------------------------------------
# TOML <-> dataclasses

_TOP_KEYS = {"pipeline_name", "metrics_port", "sources", "transform", "target", "dead_letter", "state_store", "run"}


def _take(table: Mapping[str, Any], key: str, cls: type, renames: Mapping[str, str] | None = None) -> Any:
    """Build ``cls`` from a TOML table, refusing unknown keys and seed-001 spellings."""
    if not isinstance(table, Mapping):
        _fail(key, f"must be a table, got {type(table).__name__}", f"write [{key}]")
    renames = dict(renames or {})
    known = {renames.get(f.name, f.name): f.name for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for k, v in table.items():
        if k not in known:
            canonical = _SEED_001_SPELLINGS.get(k)
            if canonical and canonical in known:
                _fail(f"{key}.{k}", f"{k} = {v!r} is seed 001's spelling", f"use {canonical!r} instead of {k!r}")
            _fail(f"{key}.{k}", "unknown key", f"known keys: {', '.join(sorted(known))}")
        kwargs[known[k]] = v
    required = [f.name for f in fields(cls) if f.default is _MISSING and f.default_factory is _MISSING]
    for name in required:
        if name not in kwargs:
            _fail(f"{key}.{renames.get(name, name)}", "is required", f"add {renames.get(name, name)} = ...")
    return cls(**kwargs)



def spec_from_dict(doc: Mapping[str, Any]) -> PipelineSpec:
    """Build and validate a spec from parsed TOML."""
    for k in doc:
        if k not in _TOP_KEYS:
            _fail(k, "unknown top-level key", f"known keys: {', '.join(sorted(_TOP_KEYS))}")
    for k in ("pipeline_name", "sources", "transform", "target", "run"):
        if k not in doc:
            _fail(k, "is required", f"add {k}")
    transform = doc["transform"]
    if not isinstance(transform, Mapping):
        _fail("transform", "must be a table", "write [transform]")
    for k in transform:
        if k not in ("sql", "window"):
            _fail(f"transform.{k}", "unknown key", "known keys: sql, window")
    if "window" not in transform:
        _fail("transform.window", "is required", "add [transform.window]")
    if not isinstance(transform["window"], Mapping):
        _fail("transform.window", "must be a table", "write [transform.window]")
    wdoc = dict(transform["window"])
    aggs_doc = wdoc.pop("aggregations", None)
    if aggs_doc is not None and not isinstance(aggs_doc, list):
        _fail("transform.window.aggregations", "must be an array of tables",
              "write [[transform.window.aggregations]] (double brackets)")
    if not aggs_doc:
        _fail("transform.window.aggregations", "at least one aggregation is required",
              'add [[transform.window.aggregations]] with agg = "count", as = "n"')
    aggs = tuple(_take(a, f"transform.window.aggregations[{i}]", Aggregation, {"as_": "as"})
                 for i, a in enumerate(aggs_doc))
    if "max_groups_per_window" not in wdoc:
        _fail("transform.window.max_groups_per_window", "is mandatory",
              "set the most groups one window may hold, e.g. 1_000_000")
    wdoc["aggregations"] = aggs
    window = _take(wdoc, "transform.window", Window)
    if not isinstance(doc["sources"], list):
        _fail("sources", "must be an array of tables", "write [[sources]]")
    sources = tuple(_take(s, f"sources[{i}]", Source) for i, s in enumerate(doc["sources"]))
    spec = PipelineSpec(
        pipeline_name=doc["pipeline_name"],
        metrics_port=doc.get("metrics_port"),
        sources=sources,
        transform_sql=transform.get("sql"),
        window=window,
        target=_take(doc["target"], "target", Target),
        dead_letter=_take(doc["dead_letter"], "dead_letter", DeadLetter) if "dead_letter" in doc else None,
        state_store=_take(doc["state_store"], "state_store", StateStore) if "state_store" in doc else StateStore(),
        run=_take(doc["run"], "run", Run),
    )
    return spec.validate()


def load_pipeline_str(text: str) -> PipelineSpec:
    """Parse TOML text into a validated spec."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PipelineConfigError("toml", f"not valid TOML: {exc}", "fix the syntax at the position shown") from None
    return spec_from_dict(doc)


def load_pipeline(path: str | os.PathLike[str]) -> PipelineSpec:
    """Load a pipeline TOML file."""
    p = Path(path)
    if not p.is_file():
        raise PipelineConfigError("path", f"{str(p)!r} does not exist", "pass the path of a pipeline TOML file")
    return load_pipeline_str(p.read_text())


def _table(obj: Any, renames: Mapping[str, str] | None = None, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Dataclass -> TOML table with defaults omitted, so dumps stay short and stable."""
    renames = renames or {}
    out: dict[str, Any] = {}
    for f in fields(obj):
        if f.name in skip:
            continue
        v = getattr(obj, f.name)
        default = f.default if f.default is not _MISSING else _MISSING
        if v is None or (default is not _MISSING and v == default):
            continue
        out[renames.get(f.name, f.name)] = list(v) if isinstance(v, tuple) else v
    return out


def spec_to_dict(spec: PipelineSpec) -> dict[str, Any]:
    doc: dict[str, Any] = {"pipeline_name": spec.pipeline_name}
    if spec.metrics_port is not None:
        doc["metrics_port"] = spec.metrics_port
    doc["sources"] = [_table(s) for s in spec.sources]
    transform: dict[str, Any] = {}
    if spec.transform_sql is not None:
        transform["sql"] = spec.transform_sql
    window = _table(spec.window, skip=("aggregations",))
    window["group_by"] = list(spec.window.group_by)
    window["max_groups_per_window"] = spec.window.max_groups_per_window
    window["aggregations"] = [_table(a, {"as_": "as"}) for a in spec.window.aggregations]
    transform["window"] = window
    doc["transform"] = transform
    doc["target"] = _table(spec.target)
    if spec.dead_letter is not None:
        doc["dead_letter"] = _table(spec.dead_letter)
    if spec.state_store != StateStore():
        doc["state_store"] = _table(spec.state_store) | {"kind": spec.state_store.kind}
    doc["run"] = _table(spec.run)
    return doc


def dump_pipeline(spec: PipelineSpec) -> str:
    """Serialise a spec to TOML; ``load_pipeline_str(dump_pipeline(s)) == s``."""
    return tomli_w.dumps(spec_to_dict(spec))


def with_overrides(spec: PipelineSpec, **changes: Any) -> PipelineSpec:
    """A validated copy of ``spec`` with top-level fields replaced (used by Dagster resources)."""
    return replace(spec, **changes).validate()
