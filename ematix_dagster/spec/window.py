"""``[transform.window]`` and its aggregations, with their value rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ematix_dagster.columns import EVENT_TS
from ematix_dagster.spec.registries import AGGREGATIONS, WINDOW_KINDS
from ematix_dagster.spec.rules import (
    LATE_POLICIES,
    _fail,
    _is_ident,
    _is_reserved,
    _listed_as_tuple,
    _positive,
    _validate_watermark,
)
from ematix_dagster.spec.trigger import EmitTrigger


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
        if self.agg not in AGGREGATIONS:
            _fail(f"{key}.agg", f"unknown aggregator {self.agg!r}", f"use one of {', '.join(AGGREGATIONS)}")
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

    TOML_TABLE: ClassVar[str] = "transform.window"

    kind: str
    max_groups_per_window: int
    aggregations: tuple[Aggregation, ...]
    duration_ms: int | None = None  # tumbling, hopping and sliding (the time difference); sessions have none
    group_by: tuple[str, ...] = ()
    hop_ms: int | None = None
    gap_ms: int | None = None  # session: the most time between a key's consecutive rows in one session
    max_session_duration_ms: int | None = None  # session: sessions never cross a multiple of it (docs/contract/windows.md)
    max_events_per_group: int | None = None  # sliding: distinct event times one key retains (docs/contract/windows.md)
    event_time_column: str = EVENT_TS
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
    #: when rows leave besides the watermark (docs/contract/emission.md)
    emit_trigger: EmitTrigger = field(default_factory=EmitTrigger)

    def __post_init__(self) -> None:
        _listed_as_tuple(self, "group_by", "aggregations")
        # TOML and the facade name the trigger as a string or a one-key table
        object.__setattr__(self, "emit_trigger", EmitTrigger.parse(self.emit_trigger, "transform.window.emit_trigger"))

    def validate(self, key: str = "transform.window") -> None:
        kinds = " or ".join(f'"{k}"' for k in WINDOW_KINDS)
        if self.kind not in WINDOW_KINDS:
            _fail(f"{key}.kind", f"unknown window kind {self.kind!r}", f"use {kinds}")
        rules = WINDOW_KINDS[self.kind]
        for name, other in WINDOW_KINDS.items():  # another kind's own keys
            for field_name in other.own_keys:
                if field_name not in rules.own_keys and getattr(self, field_name) is not None:
                    _fail(f"{key}.{field_name}", f"{field_name} only applies to {name} windows, not {self.kind!r}",
                          f'remove it or use kind = "{name}"')
        rules.validate(self, key)
        self._validate_common(key)
        self.emit_trigger.validate(f"{key}.emit_trigger")
        if self.emit_trigger.fires_early and not rules.early_triggers:
            _fail(f"{key}.emit_trigger",
                  f"emit_trigger = {self.emit_trigger.to_toml()!r} does not apply to {self.kind} windows: "
                  "they emit on the watermark only",
                  'remove it (the default is "watermark"), or use another window kind')

    def _validate_common(self, key: str) -> None:
        _validate_watermark(self, key)
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

    def validate_duration(self, key: str, what: str) -> None:
        """``duration_ms`` is given and positive (``what``: what it means for this kind)."""
        if self.duration_ms is None:
            _fail(f"{key}.duration_ms", f"is required for {self.kind} windows", f"set {what} in ms")
        _positive(f"{key}.duration_ms", self.duration_ms)

    @property
    def shape(self) -> str:
        """The windows in words, for messages and descriptions (the kind's own words)."""
        return WINDOW_KINDS[self.kind].shape(self)

    @property
    def hop(self) -> int:
        """Distance between window starts (the duration for tumbling windows)."""
        return self.hop_ms if self.kind == "hopping" else self.duration_ms  # type: ignore[return-value]

    @property
    def retention_ms(self) -> int:
        """How long past its end a window stays in state (0 unless ``reopen``)."""
        return (self.allowed_lateness_ms or 0) if self.late_data == "reopen" else 0
