"""The keys of the message-broker sources (``kafka``, ``redis_stream``) and how their payloads decode.

A broker delivers text: a Kafka message's value, a Redis entry's flat fields. ``format`` says how
that text becomes the DDL ``schema``'s columns (docs/contract/redis-streams.md): ``"json"``, one
JSON document (a Kafka value, or the Redis field ``json_field``), or ``"fields"``, a Redis entry's
fields cast to their DDL types. Without ``format`` a Kafka source keeps its raw key and value.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ematix_dagster.spec.rules import _fail, _positive

if TYPE_CHECKING:
    from ematix_dagster.spec.model import Source

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
