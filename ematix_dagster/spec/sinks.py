"""Where rows go: the target, the dead letters, and the fields every sink kind takes.

Kept apart from ``spec.model`` (the pipeline spec), which uses them, so the row pipeline's rules
(``spec.rows``) can check the target without importing the pipeline spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ematix_dagster.spec.rules import (
    _IDENT_RE,
    DEAD_LETTER_KINDS,
    SOURCE_ROW_CHOICES,
    TARGET_KINDS,
    _fail,
    _listed_as_tuple,
)


@dataclass(frozen=True)
class DeadLetter:
    """Where late, invalid, future and malformed rows go (``[dead_letter]``)."""

    kind: str
    path: str | None = None
    url: str | None = field(default=None, repr=False)  # resolved, it may hold a password
    table: str | None = None
    create_table: bool = False
    #: which post-SQL dead letters carry ``_source_row``, the row before the SQL: ``sql_error`` rows
    #: (the failing value is only there), ``all`` (late and rejected rows too) or ``none`` (the SQL
    #: may drop columns that must not reach the dead letters)
    include_source_row: str = "sql_error"

    def validate(self, key: str = "dead_letter") -> None:
        if self.kind not in DEAD_LETTER_KINDS:
            _fail(f"{key}.kind", f"unknown dead-letter kind {self.kind!r}", 'use "parquet" or "postgres"')
        validate_sink_fields(key, self.kind, self.url, self.table, self.path)
        if self.include_source_row not in SOURCE_ROW_CHOICES:
            _fail(f"{key}.include_source_row", f"{self.include_source_row!r} is not a choice",
                  f"use one of {', '.join(repr(c) for c in SOURCE_ROW_CHOICES)}")


def validate_sink_fields(key: str, kind: str, url: str | None, table: str | None, path: str | None) -> None:
    """The fields a sink of ``kind`` needs and refuses (url and table for postgres, path for parquet)."""
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


@dataclass(frozen=True)
class Target:
    """Where closed windows go (``[target]``)."""

    kind: str
    url: str | None = field(default=None, repr=False)  # resolved, it may hold a password
    table: str | None = None
    create_table: bool = False
    same_transaction: bool = False
    path: str | None = None
    #: append targets (parquet, console) precede every superseding row with a ``retract`` of the one
    #: it replaces (docs/contract/emission.md)
    retractions: bool = False
    #: a row pipeline's postgres upsert key (docs/contract/row-pipelines.md); a windowed pipeline's
    #: key is always its window start and group columns
    key: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _listed_as_tuple(self, "key")

    def validate(self, key: str = "target") -> None:
        if self.kind not in TARGET_KINDS:
            _fail(f"{key}.kind", f"unknown target kind {self.kind!r}", 'use "postgres", "parquet" or "console"')
        validate_sink_fields(key, self.kind, self.url, self.table, self.path)
        if self.same_transaction and self.kind != "postgres":
            _fail(f"{key}.same_transaction", "only a postgres target can share the store's transaction", "remove it")
        if self.retractions and self.kind == "postgres":
            _fail(f"{key}.retractions", "a postgres target keeps one row per key and deletes the keys that "
                  "disappear, so a retract row has nothing to mean there",
                  "remove it: retractions = true applies to parquet and console targets")
