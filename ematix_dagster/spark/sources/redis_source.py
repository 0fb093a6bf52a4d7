"""``kind = "redis_stream"``: Redis Streams read through PySpark's Python Data Source API (no jar).

Spark calls the reader's planning methods (``initialOffset``, ``latestOffset``, ``partitions``)
and its ``read`` in Python worker processes, so this module imports nothing of the package but
:func:`~ematix_dagster.spec.environment.public_url` and its ``${NAME}`` pattern: both modules are
shipped to those workers by value (:func:`ematix_dagster.spark.sources.readers.ship_redis_reader`) and
must stay light.

Offsets (docs/contract/redis-streams.md). A stream's offset is the id of the last entry a batch
took (``id``) and that entry's ordinal ``n``, the stream's ``entries-added`` counter when it was
added. A batch reads the ids in ``(start.id, end.id]`` with ``XRANGE``, so a replayed batch reads
exactly the entries the first try read, and since the ordinals say how many there are, a replay
that finds fewer knows entries were deleted. Before each batch the reader checks that all
``entries-added - n`` entries added after the offset are still there (Redis 7's ``XINFO STREAM``);
the ones missing were trimmed (or ``XDEL``'d) before the pipeline read them. That is terminal,
unless ``on_trimmed = "skip"``, which moves on and counts them in the offset's ``skipped``. A
stream deleted and created again restarts its counter below ``n``: the same choice, with the number
lost unknown (``rebased`` then keeps the batch's count of entries right).

The password never reaches Spark: the ``url`` option is the URL as written, its ``${NAME}``
placeholders unexpanded, and the reader expands them from its own environment (the JVM's, which
Spark's Python workers inherit). Spark's option redaction (``spark.sql.redaction.options.regex``,
``(?i)url`` by default) covers a URL typed with its password.

Failures leave the workers as exceptions whose class name the driver recognises in Spark's error
text (:func:`ematix_dagster.spark.failures.classify.query_failure`): ``RedisUnreachable`` (transient),
``RedisRefused`` (wrong credentials) and ``StreamTrimmed`` (both terminal).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from ematix_dagster.spec.environment import ENV_PLACEHOLDER, public_url

#: the name Spark knows the source by (``spark.readStream.format(...)``)
FORMAT = "ematix_redis_stream"
#: a Redis entry as a row: decoding into the source's DDL columns happens in Spark (:mod:`.payloads`)
ENTRY_SCHEMA = "stream STRING, entry_id STRING, timestamp TIMESTAMP, fields MAP<STRING, STRING>"
_PAGE = 10_000  # entries per XRANGE call in read()
#: XRANGE's ids without the entries' fields: planning a limited batch needs only where it ends
_IDS_SCRIPT = """
local ids = {}
for i, entry in ipairs(redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[2], 'COUNT', ARGV[3])) do ids[i] = entry[1] end
return ids
"""
_SEQ_MAX = 2**64 - 1


class RedisUnreachable(Exception):
    """Redis did not answer (refused, timed out, lost mid-read): retrying may help."""


class RedisRefused(Exception):
    """Redis refused the credentials: a retry is refused the same way until they are fixed."""


class StreamTrimmed(Exception):
    """Entries after the pipeline's offset are gone from the stream: a retry finds them gone too."""


def parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def id_before(entry_id: str) -> str:
    """The largest id below ``entry_id``: an exclusive start that takes ``entry_id`` itself."""
    ms, seq = parse_id(entry_id)
    if seq:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{_SEQ_MAX}" if ms else "0-0"


def skipped_entries(offset: str) -> int:
    """How many trimmed entries ``on_trimmed = "skip"`` went past, from a source's offset line."""
    return sum(int(stream.get("skipped", 0)) for stream in json.loads(offset).values())


@dataclass(frozen=True)
class _Info:
    """What ``XINFO STREAM`` says about the stream (zeros for a stream not created yet)."""

    last_id: str = "0-0"
    added: int = 0
    length: int = 0
    max_deleted: str = "0-0"
    first_id: str | None = None


@dataclass(frozen=True)
class StreamRange(InputPartition):
    """One stream's part of a batch: ids in ``(after, until]``, ``expected`` entries of them."""

    stream: str
    after: str
    until: str
    expected: int


class RedisStreamDataSource(DataSource):
    """Options: ``url`` (as written), ``streams`` (a JSON list), ``start`` (default ``earliest``),
    ``max_entries`` (default none) and ``on_trimmed`` (default ``fail``), as
    docs/contract/redis-streams.md says; the source owns these defaults, the spec leaves them unset."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return ENTRY_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RedisStreamReader(dict(self.options))


class RedisStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans batches as id ranges per stream and reads them with ``XRANGE``."""

    def __init__(self, options: dict[str, str]) -> None:
        self.url = options["url"]
        self.streams: list[str] = json.loads(options["streams"])
        self.start = options.get("start", "earliest")
        self.max_entries = int(options["max_entries"]) if options.get("max_entries") else None
        self.skip_trimmed = options.get("on_trimmed", "fail") == "skip"
        self.target: dict[str, _Info] | None = None  # the end of an available_now run
        #: per stream, what had left it (see _checked) when a check last found it holding every entry
        #: after an offset, and that offset: the check is not repeated while nothing more has left
        self._whole: dict[str, tuple[tuple[int, str], tuple[int, int]]] = {}
        self._client: Any = None

    # -- Redis ----------------------------------------------------------------------------------

    def client(self) -> Any:
        if self._client is None:
            import redis

            def sub(m: re.Match[str]) -> str:
                if m.group(1) not in os.environ:
                    raise RedisRefused(f"the Redis URL names ${{{m.group(1)}}}, which is not set in the "
                                       "environment Spark's Python workers inherited")
                return os.environ[m.group(1)]

            self._client = redis.Redis.from_url(ENV_PLACEHOLDER.sub(sub, self.url), socket_timeout=10,
                                                socket_connect_timeout=5, decode_responses=True)
        return self._client

    def _call(self, what: str, fn: Any) -> Any:
        """Run ``fn`` against Redis; a connection problem becomes :class:`RedisUnreachable`."""
        import redis

        try:
            return fn(self.client())
        except redis.AuthenticationError as exc:  # a ConnectionError too: first
            raise RedisRefused(f"Redis at {public_url(self.url)} refused the credentials while {what}: {exc} "
                               "(check the password the URL names)") from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise RedisUnreachable(f"Redis at {public_url(self.url)} is unreachable while {what}: {exc} "
                                   "(retrying may help once it is back)") from None

    def _info(self, stream: str) -> _Info:
        import redis

        def info(client: Any) -> Any:
            try:
                return client.xinfo_stream(stream)
            except redis.ResponseError as exc:
                if "no such key" in str(exc).lower():
                    return None
                raise

        raw = self._call(f"reading stream {stream!r}", info)
        if raw is None:
            return _Info()
        first = raw.get("first-entry")
        return _Info(last_id=raw["last-generated-id"], added=int(raw["entries-added"]), length=int(raw["length"]),
                     max_deleted=raw["max-deleted-entry-id"], first_id=first[0] if first else None)

    def _count_after(self, stream: str, after: str) -> int:
        count, cursor = 0, after
        while True:
            ids = self._call(f"reading stream {stream!r}",
                             lambda c, cur=cursor: c.eval(_IDS_SCRIPT, 1, stream, f"({cur}", "+", _PAGE))
            count += len(ids)
            if len(ids) < _PAGE:
                return count
            cursor = ids[-1]

    # -- offsets --------------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        offsets = {}
        for stream in self.streams:
            info = self._info(stream)
            if self.start == "latest":
                offsets[stream] = {"id": info.last_id, "n": info.added, "skipped": 0}
            elif self.start == "earliest":
                start = id_before(info.first_id) if info.first_id else info.last_id
                offsets[stream] = {"id": start, "n": info.added - info.length, "skipped": 0}
            else:
                after = self._count_after(stream, self.start)
                offsets[stream] = {"id": self.start, "n": info.added - after, "skipped": 0}
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_entries) if self.max_entries else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {stream: self._info(stream) for stream in self.streams}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        checked = {s: self._checked(s, start[s]) for s in self.streams}
        end = {s: dict(offset) for s, (_, offset) in checked.items()}
        # the newest entry each stream may give: under available_now, none added after the run began
        newest = {s: info if self.target is None or parse_id(info.last_id) <= parse_id(self.target[s].last_id)
                  else self.target[s] for s, (info, _) in checked.items()}
        fresh = [s for s in self.streams if parse_id(newest[s].last_id) > parse_id(end[s]["id"])]
        if not isinstance(limit, ReadMaxRows):
            for s in fresh:
                end[s].update(id=newest[s].last_id, n=newest[s].added)
            return end
        taken: list[tuple[tuple[int, int], str, str]] = []
        for s in fresh:
            ids = self._call(f"reading stream {s!r}", lambda c, s=s: c.eval(
                _IDS_SCRIPT, 1, s, f"({end[s]['id']}", newest[s].last_id, limit.max_rows))
            taken += [(parse_id(entry_id), s, entry_id) for entry_id in ids]
        for _, s, entry_id in sorted(taken)[:limit.max_rows]:  # the oldest ids of all streams first
            end[s].update(id=entry_id, n=end[s]["n"] + 1)
        return end

    def _checked(self, stream: str, offset: dict) -> tuple[_Info, dict]:
        """The stream's state, after making sure it still holds every entry after ``offset``: an
        error, or under ``on_trimmed = "skip"`` an offset moved past the gap with the gap counted.

        All ``entries-added - n`` entries added after the offset must be there. Trimming removes
        the oldest entries, so when the first entry left is past the offset, all ``length`` are
        after it; otherwise only an ``XDEL`` (``max-deleted-entry-id``) can have removed some, and
        counting them scans the stream after the offset. That scan is not repeated each trigger
        while the offset is still before the deleted id: ``entries-added - length`` counts every
        entry that ever left the stream (an ``XDEL`` below the max deleted id too), so while it and
        the max deleted id are what they were when a check found the stream whole after an
        earlier offset, nothing has left it since.
        """
        info = self._info(stream)
        after = parse_id(offset["id"])
        front_gone = info.first_id is None or parse_id(info.first_id) > after
        recreated = info.added < offset["n"]  # deleted and created again: its count of entries restarted
        if not (front_gone or recreated or parse_id(info.max_deleted) > after):
            return info, offset
        removed = (info.added - info.length, info.max_deleted)
        seen = self._whole.get(stream)
        if not recreated and seen is not None and seen[0] == removed and seen[1] <= after:
            return info, offset
        present = info.length if front_gone else self._count_after(stream, offset["id"])
        if recreated:
            if not self.skip_trimmed:
                raise StreamTrimmed(
                    f"stream {stream!r} at {public_url(self.url)} was deleted and created again since the "
                    f"pipeline's offset {offset['id']}: an unknown number of entries it had not read may be gone. "
                    'Set on_trimmed = "skip" on the source to go on from what the stream holds now')
            # the ordinals restart: "rebased" keeps the batch's count of entries right (partitions)
            rebased = offset.get("rebased", 0) + info.added - present - offset["n"]
            return info, {**offset, "n": info.added - present, "rebased": rebased}
        missing = info.added - offset["n"] - present
        if missing > 0:
            if not self.skip_trimmed:
                raise StreamTrimmed(
                    f"stream {stream!r} at {public_url(self.url)} no longer holds entries after the pipeline's "
                    f"offset {offset['id']}: {missing} entries it has not read were trimmed or deleted. Keep the "
                    'stream longer (trim only what the pipeline committed), or set on_trimmed = "skip" on the '
                    "source to go on without them (counted)")
            gap = id_before(info.first_id) if info.first_id and parse_id(info.first_id) > after else offset["id"]
            offset = {"id": gap, "n": offset["n"] + missing, "skipped": offset["skipped"] + missing}
        self._whole[stream] = (removed, parse_id(offset["id"]))
        return info, offset

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        parts = []
        for s in self.streams:
            before, after = start[s], end[s]
            expected = (after["n"] - before["n"] - (after["skipped"] - before["skipped"])
                        - (after.get("rebased", 0) - before.get("rebased", 0)))
            if expected > 0:  # ids in between that were skipped as trimmed are gone: XRANGE passes over them
                parts.append(StreamRange(s, before["id"], after["id"], expected))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The range's entries as Arrow record batches, one per ``XRANGE`` page (Spark takes them
        without converting row by row)."""
        import pyarrow as pa

        assert isinstance(partition, StreamRange)
        p, cursor, count = partition, partition.after, 0
        while True:
            page = self._call(f"reading stream {p.stream!r}",
                              lambda c, cur=cursor: c.xrange(p.stream, f"({cur}", p.until, count=_PAGE))
            if page:
                count += len(page)
                ids = [entry_id for entry_id, _ in page]
                yield pa.RecordBatch.from_arrays([
                    pa.array([p.stream] * len(page), pa.string()), pa.array(ids, pa.string()),
                    pa.array([int(entry_id.partition("-")[0]) * 1000 for entry_id in ids], pa.timestamp("us", "UTC")),
                    pa.array([list(fields.items()) for _, fields in page], pa.map_(pa.string(), pa.string())),
                ], names=["stream", "entry_id", "timestamp", "fields"])
            if len(page) < _PAGE:
                break
            cursor = page[-1][0]
        if count < p.expected and not self.skip_trimmed:
            raise StreamTrimmed(f"stream {p.stream!r} at {public_url(self.url)} lost {p.expected - count} of the "
                                f"{p.expected} entries in ({p.after}, {p.until}] that this batch read before (they "
                                "were trimmed or deleted since): the batch cannot be read again as it was")

    def commit(self, end: dict) -> None:
        """Spark's checkpoint and the state store own the offsets; Redis keeps no consumer position."""
