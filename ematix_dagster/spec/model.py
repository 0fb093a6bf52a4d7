"""The pipeline spec's dataclasses besides the window (:mod:`.window`), a row pipeline's
``[transform]`` (:mod:`.rows`) and ``[run]`` (:mod:`.run`), and the rules between its tables.

:meth:`PipelineSpec.validate` checks the types on the spec as written and the values on its resolved
copy (see the package docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ematix_dagster.spec.backfill import Backfill
from ematix_dagster.spec.emit import EmitRelease, validate_emit
from ematix_dagster.spec.environment import password_warnings, resolved_spec
from ematix_dagster.spec.rows import RowTransform, validate_row_pipeline
from ematix_dagster.spec.rules import (
    _IDENT_RE,
    _NAME_RE,
    STATE_STORE_KINDS,
    WatermarkKeys,
    _fail,
    _listed_as_tuple,
    _positive,
)
from ematix_dagster.spec.run import Run
from ematix_dagster.spec.sinks import DeadLetter, Target
from ematix_dagster.spec.sources import Source
from ematix_dagster.spec.type_checks import _check_types
from ematix_dagster.spec.window import WINDOW_KINDS, Window
from ematix_dagster.spec.window_state import executor_refusals
from ematix_dagster.sql.release_plan import WATERMARK_TS, uses_watermark_ts


@dataclass(frozen=True)
class StateStoreConfig:
    """Where window state lives between batches (``[state_store]``; absent: SQLite).

    ``checkpoint_interval_ms`` is accepted, so configs that set it still load, and has no effect: every micro-batch
    commits its state, which is stricter than any interval.
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
class PipelineSpec:
    """A whole pipeline: sources -> optional row-wise SQL -> window -> target, or, without a window
    (a *row pipeline*, docs/contract/row-pipelines.md), sources -> SQL -> target.

    ``shape`` says which, in one field: a :class:`Window` (``[transform.window]``) or a
    :class:`RowTransform` (a row pipeline's ``[transform]`` keys). A spec built without one is a
    row pipeline with the default keys, as a TOML file without ``[transform.window]`` is.
    """

    pipeline_name: str
    sources: tuple[Source, ...]
    target: Target
    run: Run
    shape: Window | RowTransform = field(default_factory=RowTransform)
    transform_sql: str | None = None
    dead_letter: DeadLetter | None = None
    state_store: StateStoreConfig = field(default_factory=StateStoreConfig)
    metrics_port: int | None = None
    backfill: Backfill | None = None  # docs/contract/backfill.md
    emit: EmitRelease | None = None  # ``[emit]``: a windowed pipeline's rows published late

    def __post_init__(self) -> None:
        _listed_as_tuple(self, "sources")

    @property
    def window_spec(self) -> Window | None:
        """The window of a windowed pipeline; None for a row pipeline."""
        return self.shape if isinstance(self.shape, Window) else None

    @property
    def rows(self) -> RowTransform | None:
        """A row pipeline's ``[transform]`` keys; None for a windowed pipeline."""
        return self.shape if isinstance(self.shape, RowTransform) else None

    @property
    def is_row_pipeline(self) -> bool:
        """Whether the pipeline writes its SQL's rows instead of windows (it has no ``[transform.window]``)."""
        return self.window_spec is None

    @property
    def window(self) -> Window:
        """The window; a ``PipelineConfigError`` for a row pipeline, so windowed code never runs on one."""
        if self.window_spec is None:
            _fail("transform.window", f"pipeline {self.pipeline_name} is a row pipeline: it has no window",
                  "add [transform.window] to aggregate; code serving both kinds reads spec.watermark or spec.rows")
        return self.window_spec

    @property
    def watermark(self) -> WatermarkKeys:
        """The keys that set the watermark: the window's, or a row pipeline's ``[transform]``."""
        return self.shape

    @property
    def watermark_table(self) -> str:
        """The TOML table :attr:`watermark` is written in, for messages that name one of its keys."""
        return "transform" if self.window_spec is None else "transform.window"

    def validate(self) -> "PipelineSpec":
        """Check the types as written, then every value rule on the resolved copy; return ``self``."""
        _check_types(self)
        self.resolved()._validate_values()
        return self

    def resolved(self) -> "PipelineSpec":
        """This spec with ``${NAME}`` expanded in every string: what sources, stores, targets and
        checkpoints are opened with. Never dump it or fingerprint it (it may hold passwords)."""
        return resolved_spec(self)

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
        if self.transform_sql is not None and not self.transform_sql.strip():
            _fail("transform.sql", "is empty", "remove [transform] sql or write a SELECT")
        self.target.validate()
        if self.dead_letter is not None:
            self.dead_letter.validate()
        self.state_store.validate()
        if isinstance(self.shape, RowTransform):
            validate_row_pipeline(self.shape, self.transform_sql, self.state_store.durable, self.target)
        else:
            self._validate_windowed(self.shape)
        if self.emit is not None:
            validate_emit(self.emit, self.window_spec, self.state_store.durable)
        if self.target.same_transaction and self.state_store.kind != "postgres":
            _fail("target.same_transaction", "needs a postgres [state_store] in the same database",
                  'set [state_store] kind = "postgres" or remove same_transaction')
        self.run.validate()
        if self.run.window_state == "executors":
            self._validate_executors()
        if self.backfill is not None:
            self._validate_backfill(self.backfill)
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            _fail("metrics_port", f"{self.metrics_port!r} is not a TCP port", "use 1..65535")

    def _validate_windowed(self, window: Window) -> None:
        """The rules between ``[transform.window]`` and the other tables."""
        window.validate(groups_on_driver=self.run.window_state == "driver")
        if self.transform_sql is not None and uses_watermark_ts(self.transform_sql):
            _fail("transform.sql", f"calls {WATERMARK_TS}() in a windowed pipeline: it may appear only in the "
                  "top-level WHERE of a row pipeline's [transform] sql (a pipeline without [transform.window])",
                  "filter with ordinary conditions here; to hold rows back until the watermark, write a row pipeline")
        if self.target.key:
            _fail("target.key", "a windowed pipeline's key is always its window start and group_by columns",
                  "remove it (key applies to row pipelines)")
        if window.late_data == "dlq" and self.dead_letter is None:
            _fail("dead_letter", 'is required with late_data = "dlq"', "add a [dead_letter] table (parquet or postgres)")
        if window.crash_recovery == "persisted" and not self.state_store.durable:
            _fail("transform.window.crash_recovery", '"persisted" needs a durable [state_store]',
                  'add [state_store] kind = "sqlite" or "postgres", or use "at_least_once"')
        if (self.target.retractions and window.late_data == "reopen"
                and not WINDOW_KINDS[window.kind].retracts_corrections):
            _fail("target.retractions", f'{window.kind} windows under late_data = "reopen" do not keep the rows '
                  "they wrote, so a correction cannot retract the row it replaces",
                  'remove retractions (readers keep the latest row per key), or use late_data = "drop" or "dlq", '
                  "where each window is written once")

    def _validate_executors(self) -> None:
        """``window_state = "executors"``: a windowed pipeline without a key Spark cannot honour."""
        if self.window_spec is None:
            _fail("run.window_state", '"executors" keeps window state; a row pipeline has none',
                  'remove it (row pipelines run on the driver)')
        for refusal in executor_refusals(self):
            if refusal.refused:
                _fail(refusal.key, f'not supported with window_state = "executors": {refusal.reason}',
                      'change the key, or use window_state = "driver"')

    def _validate_backfill(self, backfill: Backfill) -> None:
        """What a backfill can rewrite: windows that a range boundary never cuts, from files, in a table."""
        backfill.validate()
        if self.window_spec is None:
            _fail("backfill", "applies to windowed pipelines: a row pipeline has no windows to recompute",
                  "remove [backfill]")
        if self.window_spec.max_groups_per_window is None:  # only window_state = "executors" leaves it out
            _fail("transform.window.max_groups_per_window", "is required with [backfill]: a backfill recomputes its "
                  "range's windows in one run whose window state is the driver's, whatever window_state says",
                  "set the most groups one window of the range may hold")
        if not WINDOW_KINDS[self.window_spec.kind].backfills:
            _fail("backfill", f"does not apply to {self.window_spec.kind} windows: a range boundary would cut their "
                  "windows (a session or a sliding window that starts in the range takes in rows from before "
                  "it), so rewriting the range would change windows outside it", "remove [backfill]")
        for i, source in enumerate(self.sources):
            if source.kind != "files":
                _fail(f"sources[{i}].kind", f"a backfill reads archived files; source {source.name!r} is "
                      f"{source.kind!r}", "remove [backfill], or read the source's archive as a files source")
        if self.target.kind != "postgres":
            _fail("backfill", f"rewrites a range of windows in one PostgreSQL transaction; the target is "
                  f"{self.target.kind!r}, whose rows cannot be replaced that way",
                  'use a [target] kind = "postgres", or remove [backfill]')
        for i, archived in enumerate(backfill.sources):
            if archived.name not in self.source_names:
                _fail(f"backfill.sources[{i}].name", f"no source is named {archived.name!r}",
                      f"name one of {', '.join(self.source_names)}")

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)


def spec_warnings(spec: PipelineSpec) -> list[str]:
    """One line per unwise but valid setting of ``spec`` as written: each URL whose password is
    typed into the file (files are shared, versioned and printed; the password is never shown), and
    under ``window_state = "executors"`` each key that does not apply or behaves otherwise there."""
    executors = [f"{r.key} {r.reason}" for r in executor_refusals(spec) if not r.refused] \
        if spec.run.window_state == "executors" and spec.window_spec is not None else []
    return executors + password_warnings((
        ("target.url", spec.target.url, "EMATIX_TARGET_URL"),
        ("dead_letter.url", spec.dead_letter.url if spec.dead_letter is not None else None, "EMATIX_DLQ_URL"),
        ("state_store.url", spec.state_store.url, "EMATIX_STATE_URL"),
        *((f"sources[{i}].url", s.url, "REDIS_URL") for i, s in enumerate(spec.sources))))
