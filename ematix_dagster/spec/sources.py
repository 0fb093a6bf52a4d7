"""``[[sources]]``: each entry (:class:`Source`), the keys of the message-broker sources (``kafka``,
``redis_stream``) and how their payloads decode.

A broker delivers text: a Kafka message's value, a Redis entry's flat fields. ``format`` says how
that text becomes the DDL ``schema``'s columns (docs/contract/redis-streams.md): ``"json"``, one
JSON document (a Kafka value, or the Redis field ``json_field``), or ``"fields"``, a Redis entry's
fields cast to their DDL types. Without ``format`` a Kafka source keeps its raw key and value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ematix_dagster.columns import HEARTBEAT
from ematix_dagster.spec.rules import (
    _NAME_RE,
    FILE_FORMATS,
    ON_UNREADABLE_FILE,
    SOURCE_KINDS,
    TIME_UNITS,
    _fail,
    _listed_as_tuple,
    _non_negative,
    _positive,
)

PAYLOAD_FORMATS = {"kafka": ("json",), "redis_stream": ("json", "fields")}
REDIS_STARTS = ("earliest", "latest")
ON_TRIMMED = ("fail", "skip")
_ENTRY_ID = re.compile(r"^[0-9]+-[0-9]+$")

#: the keys each message source takes besides ``name``, ``kind`` and the event-time keys
MESSAGE_KEYS = {
    "kafka": {"bootstrap_servers", "topic", "max_offsets_per_trigger", "starting_offsets", "format", "schema",
              "event_time_column"},
    "redis_stream": {"url", "streams", "start", "max_entries_per_trigger", "on_trimmed", "format", "schema",
                     "event_time_column", "json_field"},
}


def validate_message_source(source: Source, key: str) -> None:
    """The rules of a ``kafka`` or ``redis_stream`` source beyond the keys it may have."""
    if source.kind == "kafka":
        if not source.bootstrap_servers:
            _fail(f"{key}.bootstrap_servers", "is required for a kafka source", 'e.g. "127.0.0.1:9092"')
        if not source.topic:
            _fail(f"{key}.topic", "is required for a kafka source", "name the topic to read")
        if source.max_offsets_per_trigger is not None:
            _positive(f"{key}.max_offsets_per_trigger", source.max_offsets_per_trigger)
    else:
        _validate_redis(source, key)
    formats = PAYLOAD_FORMATS[source.kind]
    if source.format is not None and source.format not in formats:
        _fail(f"{key}.format", f"{source.format!r} is not a {source.kind} payload format",
              " or ".join(f'"{f}"' for f in formats))
    if source.format is not None and not source.schema:
        _fail(f"{key}.schema", f"is required to decode {source.format} payloads",
              'give the payload\'s DDL schema, e.g. "user_id BIGINT, page STRING, ts TIMESTAMP"')
    if source.format is None and (source.schema or source.event_time_column):
        field = f"{key}.schema" if source.schema else f"{key}.event_time_column"
        _fail(field, "names payload columns, but the source does not decode its payloads",
              'set format = "json" (or remove it: the event time is then the broker\'s timestamp)')
    if source.json_field is not None and source.format != "json":
        _fail(f"{key}.json_field", 'only applies to format = "json"', "remove it")


def _validate_redis(source: Source, key: str) -> None:
    if not source.url:
        _fail(f"{key}.url", "is required for a redis_stream source", 'e.g. "redis://127.0.0.1:6379/0"')
    if not source.url.startswith(("redis://", "rediss://", "unix://")) and not source.url.startswith("${"):
        _fail(f"{key}.url", "is not a Redis URL", 'use "redis://host:port/db" (rediss:// for TLS)')
    if not source.streams:
        _fail(f"{key}.streams", "is required for a redis_stream source", 'list the stream keys, e.g. ["clicks"]')
    if len(set(source.streams)) != len(source.streams) or not all(source.streams):
        _fail(f"{key}.streams", "lists an empty or repeated stream key", "list each stream once")
    if source.start is not None and source.start not in REDIS_STARTS and not _ENTRY_ID.match(source.start):
        _fail(f"{key}.start", f"{source.start!r} is neither earliest, latest nor an entry id",
              'use "earliest", "latest" or an id such as "1700000000000-0" (reading starts after it)')
    if source.max_entries_per_trigger is not None:
        _positive(f"{key}.max_entries_per_trigger", source.max_entries_per_trigger)
    if source.on_trimmed is not None and source.on_trimmed not in ON_TRIMMED:
        _fail(f"{key}.on_trimmed", f"unknown value {source.on_trimmed!r}",
              'use "fail" (stop, terminal) or "skip" (go on without the trimmed entries, counted)')
    if source.format is None:
        _fail(f"{key}.format", "is required for a redis_stream source",
              '"fields" (an entry\'s fields are the columns) or "json" (one field holds a JSON document)')


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
    #: files only: what a file that cannot be read (truncated, not in its format, a column of another
    #: type) does to the run. None means "fail": stop, naming the file (terminal); "skip": leave the
    #: file out of its batch, count it and record it in the dead letters (``spark.input.input_files.InputFiles``).
    on_unreadable_file: str | None = None
    #: redis_stream (docs/contract/redis-streams.md). ``url`` is expanded by the reader, never by
    #: :meth:`PipelineSpec.resolved`: a password in it must not reach Spark's options.
    url: str | None = field(default=None, repr=False, metadata={"expanded_by_reader": True})
    streams: tuple[str, ...] = ()
    start: str | None = None
    max_entries_per_trigger: int | None = None
    on_trimmed: str | None = None
    json_field: str | None = None

    def __post_init__(self) -> None:
        _listed_as_tuple(self, "streams")

    @property
    def skips_unreadable_files(self) -> bool:
        return self.on_unreadable_file == "skip"

    @property
    def is_local(self) -> bool:
        """Whether the path is on this machine (no scheme, or ``file://``)."""
        return bool(self.path) and ("://" not in (self.path or "") or (self.path or "").startswith("file://"))

    @property
    def read_by_engine(self) -> bool:
        """Whether the engine reads this source's batches instead of Spark's stream
        (``spark.input.input_files.InputFiles``): a files source that skips unreadable files, or a
        parquet source on a local path (its footers are checked and TIMESTAMP(NANOS) columns read)."""
        return self.kind == "files" and (self.skips_unreadable_files or (self.format == "parquet" and self.is_local))

    def validate(self, key: str) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            _fail(f"{key}.name", f"{self.name!r} is not a valid source name", "use [a-z0-9_-]")
        if self.name == HEARTBEAT:
            _fail(f"{key}.name", f'"{HEARTBEAT}" is reserved for the engine', "pick another name")
        if self.kind not in SOURCE_KINDS:
            _fail(f"{key}.kind", f"unknown source kind {self.kind!r}",
                  'use "files", "rate", "kafka" or "redis_stream"')
        if self.event_time_unit not in TIME_UNITS:
            _fail(f"{key}.event_time_unit", f"unknown unit {self.event_time_unit!r}", 'use "ms", "us" or "s"')
        _non_negative(f"{key}.max_future_skew_ms", self.max_future_skew_ms)
        allowed = {
            "files": {"format", "path", "schema", "event_time_column", "max_files_per_trigger", "header",
                      "on_unreadable_file"},
            "rate": {"rows_per_second"},
            **MESSAGE_KEYS,
        }[self.kind]
        optional = set().union(*MESSAGE_KEYS.values(), {"path", "max_files_per_trigger", "rows_per_second",
                                                        "header", "on_unreadable_file"})
        for f in sorted(optional - allowed):
            if getattr(self, f) not in (None, ()):
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
            if self.on_unreadable_file is not None and self.on_unreadable_file not in ON_UNREADABLE_FILE:
                _fail(f"{key}.on_unreadable_file", f"unknown value {self.on_unreadable_file!r}",
                      'use "fail" (stop and name the file) or "skip" (leave it out, count it, dead-letter it)')
        elif self.kind == "rate":
            if self.rows_per_second is not None:
                _positive(f"{key}.rows_per_second", self.rows_per_second)
        else:
            validate_message_source(self, key)
