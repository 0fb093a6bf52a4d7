"""``[transform.window]`` and its aggregations, with their value rules, and what the spec knows of
each window kind (:class:`WindowKindSpec`): its own keys and their rules, its hop, whether it takes
early triggers, retractions of corrections and backfills, and whether the driver can decide its
rows' lateness. The driver's rules and state of each kind (``streaming.kinds``) name the spec kinds
they run; the spec needs neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ematix_dagster.columns import EVENT_TS
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

#: the ``agg`` names a spec may use (``streaming.aggregators.AGGREGATORS`` builds each, in this order)
AGGREGATIONS = ("count", "count_col", "sum", "min", "max", "avg", "first", "last", "count_distinct")


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
    #: the driver's memory guard; None only with ``[run] window_state = "executors"``, where it does not apply
    max_groups_per_window: int | None
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

    @property
    def groups_cap(self) -> int:
        """``max_groups_per_window``, where the driver holds the window state (validated: set)."""
        if self.max_groups_per_window is None:
            _fail(f"{self.TOML_TABLE}.max_groups_per_window", "is not set, and the driver holds this window state",
                  "set it")
        return self.max_groups_per_window

    def validate(self, key: str = "transform.window", *, groups_on_driver: bool = True) -> None:
        """``groups_on_driver``: the window state is the driver's (``[run] window_state = "driver"``),
        so ``max_groups_per_window`` is required."""
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
        self._validate_common(key, groups_on_driver)
        self.emit_trigger.validate(f"{key}.emit_trigger")
        if self.emit_trigger.fires_early and not rules.early_triggers:
            _fail(f"{key}.emit_trigger",
                  f"emit_trigger = {self.emit_trigger.to_toml()!r} does not apply to {self.kind} windows: "
                  "they emit on the watermark only",
                  'remove it (the default is "watermark"), or use another window kind')

    def _validate_common(self, key: str, groups_on_driver: bool) -> None:
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
            if groups_on_driver:
                _fail(f"{key}.max_groups_per_window", "is mandatory: the window state is held in the driver's memory",
                      'set the most groups one window may hold, e.g. 1_000_000 (or keep window state on Spark\'s '
                      'executors: [run] window_state = "executors")')
        else:
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
        """Distance between window starts (the duration for tumbling windows): the kind's answer."""
        return WINDOW_KINDS[self.kind].hop(self)  # type: ignore[return-value]

    @property
    def retention_ms(self) -> int:
        """How long past its end a window stays in state (0 unless ``reopen``)."""
        return (self.allowed_lateness_ms or 0) if self.late_data == "reopen" else 0


# -- what the spec knows of each window kind ----------------------------------------------------

#: the session windows' id column (docs/contract/windows.md)
SESSION_ID = "session_id"


def format_span_ms(ms: int) -> str:
    """A spec's duration for messages: whole seconds as seconds.

    >>> format_span_ms(60_000), format_span_ms(1_500)
    ('60 s', '1500 ms')
    """
    return f"{ms // 1000} s" if ms % 1000 == 0 else f"{ms} ms"


class WindowKindSpec:
    """What the spec asks of a window kind, by its ``kind`` name: the keys only it takes and their
    rules, its windows in words, the sizes its stored state depends on, and the kind's answers to
    every question the spec, the fingerprint and the Spark plan ask of it."""

    #: the spec's ``kind``
    name: ClassVar[str]
    #: ``[transform.window]`` keys only this kind takes (another kind's spec refuses them)
    own_keys: ClassVar[tuple[str, ...]] = ()
    #: the kind takes an ``emit_trigger`` other than ``"watermark"`` (docs/contract/emission.md)
    early_triggers: ClassVar[bool] = True
    #: the kind keeps the rows it wrote, so a ``correction`` under ``reopen`` can be preceded by a
    #: retraction of the row it supersedes (``[target] retractions``)
    retracts_corrections: ClassVar[bool] = True
    #: a column the kind adds to its output after the window bounds (sessions: session_id)
    id_column: ClassVar[str | None] = None
    #: a time range's boundaries never cut a window, so ``[backfill]`` can rewrite the windows in it
    backfills: ClassVar[bool] = False
    #: a row is late exactly when its one window is, so the driver can decide lateness without
    #: joining the batch values to every row (``spark.plans.windows.driver_late``)
    late_on_driver: ClassVar[bool] = False

    @classmethod
    def validate(cls, window: Window, key: str) -> None:
        """Refuse a spec of this kind whose own keys are missing or wrong, naming the key."""
        raise NotImplementedError

    @classmethod
    def shape(cls, window: Window) -> str:
        """A spec of this kind's windows in words, for messages and descriptions."""
        raise NotImplementedError

    @classmethod
    def fingerprint(cls, window: Window) -> dict[str, Any]:
        """The spec's sizes that the stored state depends on (docs/contract/operations.md), by fingerprint key."""
        raise NotImplementedError

    @classmethod
    def hop(cls, window: Window) -> int | None:
        """The distance between window starts (the duration, where windows do not hop)."""
        return window.duration_ms


class FixedSpec(WindowKindSpec):
    """Fixed-size windows ``[start, start + duration)``: tumbling and hopping."""

    backfills = True

    @classmethod
    def validate(cls, window: Window, key: str) -> None:
        window.validate_duration(key, "the window's length")
        if window.hop_ms is not None:
            _fail(f"{key}.hop_ms", f"hop_ms = {window.hop_ms!r} only applies to hopping windows, not {window.kind!r}",
                  'remove it or use kind = "hopping"')

    @classmethod
    def shape(cls, window: Window) -> str:
        assert window.duration_ms is not None
        return f"{window.kind} windows of {format_span_ms(window.duration_ms)}"

    @classmethod
    def fingerprint(cls, window: Window) -> dict[str, Any]:
        return {"window.duration_ms": window.duration_ms, "window.hop_ms": window.hop_ms}


class TumblingSpec(FixedSpec):
    """Tumbling windows: fixed windows whose hop is their duration, so a row is in one window."""

    name = "tumbling"
    late_on_driver = True


class HoppingSpec(FixedSpec):
    """Hopping windows: fixed windows starting every ``hop_ms``, at most ``duration_ms`` apart."""

    name = "hopping"

    @classmethod
    def validate(cls, window: Window, key: str) -> None:
        window.validate_duration(key, "the window's length")
        assert window.duration_ms is not None
        if window.hop_ms is None:
            _fail(f"{key}.hop_ms", "is required for hopping windows",
                  "set hop_ms (the distance between window starts), <= duration_ms")
        _positive(f"{key}.hop_ms", window.hop_ms)
        if window.hop_ms > window.duration_ms:
            _fail(f"{key}.hop_ms", f"{window.hop_ms} is larger than duration_ms={window.duration_ms}",
                  "use hop_ms <= duration_ms (gaps between windows would drop rows)")

    @classmethod
    def shape(cls, window: Window) -> str:
        return f"{super().shape(window)} every {format_span_ms(window.hop)}"

    @classmethod
    def hop(cls, window: Window) -> int | None:
        return window.hop_ms


class SessionSpec(WindowKindSpec):
    """Session windows (docs/contract/windows.md): runs of a key's rows at most ``gap_ms`` apart,
    cut at multiples of ``max_session_duration_ms``. Sessions merge, so the rows written for one
    may be retracted (docs/contract/emission.md)."""

    name = "session"
    own_keys = ("gap_ms", "max_session_duration_ms")
    id_column = SESSION_ID

    @classmethod
    def validate(cls, window: Window, key: str) -> None:
        """docs/contract/windows.md's rules, each naming its key."""
        for name in ("duration_ms", "hop_ms"):
            if getattr(window, name) is not None:
                _fail(f"{key}.{name}", f"{name} does not apply to session windows (a session's length "
                      "follows its rows)", "remove it; set gap_ms and max_session_duration_ms")
        if window.gap_ms is None:
            _fail(f"{key}.gap_ms", "is required for session windows",
                  "set the most time (ms) between a key's consecutive rows of one session")
        _positive(f"{key}.gap_ms", window.gap_ms)
        if window.max_session_duration_ms is None:
            _fail(f"{key}.max_session_duration_ms", "is required for session windows",
                  "set the longest a session may run (ms); sessions are cut at its multiples")
        _positive(f"{key}.max_session_duration_ms", window.max_session_duration_ms)
        if window.max_session_duration_ms <= window.gap_ms:
            _fail(f"{key}.max_session_duration_ms", f"{window.max_session_duration_ms} is not larger than "
                  f"gap_ms={window.gap_ms}", "use a cap larger than the gap")
        names = [*window.group_by, *(a.as_ for a in window.aggregations)]
        if SESSION_ID in (n.lower() for n in names):
            _fail(f"{key}.group_by", "session_id is the session windows' id column", "rename that column or alias")
        if not window.group_by:
            _fail(f"{key}.group_by", "is required for session windows (sessions are per key)",
                  'group by the column that identifies a session\'s owner, e.g. group_by = ["user_id"]')

    @classmethod
    def shape(cls, window: Window) -> str:
        assert window.gap_ms is not None and window.max_session_duration_ms is not None
        return (f"session windows (gap {format_span_ms(window.gap_ms)}, "
                f"cut every {format_span_ms(window.max_session_duration_ms)})")

    @classmethod
    def fingerprint(cls, window: Window) -> dict[str, Any]:
        return {"window.gap_ms": window.gap_ms, "window.max_session_duration_ms": window.max_session_duration_ms}


class SlidingSpec(WindowKindSpec):
    """Sliding windows (docs/contract/windows.md, KIP-450): one window ``[t - D, t]`` per distinct
    event time of a key, at most ``max_events_per_group`` event times per key."""

    name = "sliding"
    own_keys = ("max_events_per_group",)
    #: watermark only (docs/contract/windows.md): a row counts in every window ending in
    #: ``[x, x + D]``, so early rows would rewrite each of them for every row that reaches it
    early_triggers = False
    #: a window's values are computed from the partials when it is written, never held: the row a
    #: correction supersedes is not kept (docs/contract/emission.md)
    retracts_corrections = False

    @classmethod
    def validate(cls, window: Window, key: str) -> None:
        """docs/contract/windows.md's rules, each naming its key."""
        window.validate_duration(key, "the time difference D (each window is [t - D, t])")
        if window.hop_ms is not None:
            _fail(f"{key}.hop_ms", "hop_ms does not apply to sliding windows (one window per distinct event time)",
                  'remove it, or use kind = "hopping" for windows at fixed steps')
        if window.max_events_per_group is None:
            _fail(f"{key}.max_events_per_group", "is required for sliding windows",
                  "set the most distinct event times one key may retain, e.g. 10_000")
        _positive(f"{key}.max_events_per_group", window.max_events_per_group)

    @classmethod
    def shape(cls, window: Window) -> str:
        assert window.duration_ms is not None
        return f"sliding windows of {format_span_ms(window.duration_ms)} (one per event time)"

    @classmethod
    def fingerprint(cls, window: Window) -> dict[str, Any]:
        return {"window.duration_ms": window.duration_ms}


#: every window kind a spec may name, in the order messages list them
ALL_WINDOW_KINDS: tuple[type[WindowKindSpec], ...] = (TumblingSpec, HoppingSpec, SessionSpec, SlidingSpec)
#: spec ``kind`` -> what the spec knows of it (built from :data:`ALL_WINDOW_KINDS`)
WINDOW_KINDS: dict[str, type[WindowKindSpec]] = {kind.name: kind for kind in ALL_WINDOW_KINDS}
