"""Session windows (docs/contract/windows.md): runs of a key's rows at most ``gap`` apart, cut at cap buckets.

A session's end depends on its rows, so unlike fixed windows a start alone does not name a window:
the driver keeps each key's sessions in :mod:`ematix_dagster.streaming.kinds.sessions.session_state`, and this
module holds the rules that need no state. The cap is a grid of tumbling buckets of the cap's
size counted from the epoch, not a duration since the session's first row: a row's bucket is
``t // cap`` whatever the batch split, and Spark computes it from the row alone. Times are
microseconds since the epoch (UTC).

>>> rules = SessionWindows(gap=10, cap=100)
>>> rules.bucket(95), rules.bucket_end(0)
(0, 100)
>>> rules.session_end(last_ts=80, bucket=0), rules.session_end(last_ts=95, bucket=0)  # capped
(90, 100)
>>> rules.row_windows(95, closed_before=None)   # the row's own one-row session
[WindowBounds(start=95, end=100)]
>>> rules.row_windows(95, closed_before=96)     # late
[]
>>> s = WindowBounds(0, 10)
>>> rules.is_final(s, watermark=10), rules.is_final(s, watermark=11)
(False, True)
>>> rules.is_evicted(s, watermark=15, retention=5), rules.is_evicted(s, watermark=16, retention=5)
(False, True)
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Sequence

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ematix_dagster.spec.window import SESSION_ID
from ematix_dagster.streaming.emitted import Column
from ematix_dagster.streaming.kinds.kind import WindowBounds, WindowKind
from ematix_dagster.streaming.kinds.time_units import MICROS_PER_MS, format_us
from state_store.msgpack_columns import bin_headers, joined, msgpack_ints

if TYPE_CHECKING:
    from typing import Self

    from ematix_dagster.spec import Window


def session_id(pipeline: str, encoded_key: bytes, window_start: int) -> int:
    """The informational BIGINT ``session_id`` of docs/contract/windows.md.

    The hashed bytes are ``msgpack.packb([pipeline, encoded_key, window_start], use_bin_type=True)``:
    a 3-element array of the pipeline name as a msgpack str (UTF-8), the state store's key encoding
    (``state_store.codec.encode_key``, its format byte included) as msgpack bin, and the session's
    start in µs as a msgpack int (its smallest encoding). The id is the first 8 bytes of the
    SHA-256 of those bytes read as a big-endian signed integer, so any language can recompute it.

    >>> session_id("clicks", b"\\x01\\x91\\xa1a", 0)
    3052484969341834349
    >>> session_id("clicks", b"\\x01\\x91\\xa1a", 1) != session_id("clicks", b"\\x01\\x91\\xa1a", 0)
    True
    """
    return session_ids(pipeline, [encoded_key], [window_start])[0]


def session_ids(pipeline: str, encoded_keys: Sequence[bytes], starts: Column) -> list[int]:
    """:func:`session_id` of every emitted row at once (a batch emits a row per session): the array
    header and the pipeline name are packed once, the keys' headers and the starts are msgpack's
    bytes laid out a column at a time (``state_store.msgpack_columns``), so Python only hashes
    each row. The digests are read as big-endian int64s in one NumPy view."""
    if not len(encoded_keys):
        return []
    head = b"\x93" + msgpack.packb(pipeline, use_bin_type=True)  # a 3-element msgpack array, then the name
    keys = pa.array(encoded_keys, pa.binary())
    messages = joined([head, bin_headers(pc.binary_length(keys).to_numpy()), keys,
                       msgpack_ints(np.fromiter(starts, np.int64, len(keys)))])
    sha256 = hashlib.sha256
    digests = b"".join([sha256(message).digest() for message in messages.to_pylist()])
    return np.frombuffer(digests, ">i8")[::4].tolist()  # a SHA-256 digest is 4 int64s: its first 8 bytes


class SessionWindows(WindowKind):
    """Gap-based sessions per key; ``gap`` and ``cap`` (``max_session_duration_ms``) in µs.

    A session is final once ``window_end < W`` (strict: a row at exactly ``last + gap`` still
    joins, and the late rule accepts rows at ``t >= W_prev``), and under ``reopen`` it is retained
    until ``window_end + retention < W``. Then no accepted row can reach an evicted session.
    Sessions merge, so the rows written for one may be retracted (docs/contract/emission.md).
    """

    id_column = SESSION_ID
    rows_per_key = "sessions"

    def __init__(self, gap: int, cap: int) -> None:
        if not 0 < gap < cap:
            raise ValueError(f"session windows need 0 < gap < cap, got gap={gap} cap={cap}")
        self.gap = gap
        self.cap = cap

    @classmethod
    def for_window(cls, window: Window) -> Self:
        assert window.gap_ms is not None and window.max_session_duration_ms is not None
        return cls(window.gap_ms * MICROS_PER_MS, window.max_session_duration_ms * MICROS_PER_MS)

    # -- pure helpers ---------------------------------------------------------------------------

    def bucket(self, t: int) -> int:
        """The cap bucket of event time ``t``: rows in different buckets never join."""
        return t // self.cap

    def bucket_end(self, bucket: int) -> int:
        """The exclusive end of ``bucket``, where every session in it is cut."""
        return (bucket + 1) * self.cap

    def session_end(self, last_ts: int, bucket: int) -> int:
        """``window_end``: how far a row could still join (``last + gap``), capped at the bucket end."""
        return min(last_ts + self.gap, self.bucket_end(bucket))

    def is_late(self, t: int, closed_before: int | None) -> bool:
        """The late rule: ``t < W_prev`` (less the allowance under ``reopen``), decidable from W alone."""
        return closed_before is not None and t < closed_before

    # -- the WindowKind interface -----------------------------------------------------------------

    def valid_end(self, start: int, end: int) -> bool:
        """A session ends after its start (by the gap at least) and never past its bucket's end."""
        return start < end <= self.bucket_end(self.bucket(start))

    def end_rule(self, start: int) -> str:
        return "a session's end after its start, within its cap bucket"

    def describe_at(self, start: int) -> str:
        return f"session starting {format_us(start)}"

    def row_ids(self, pipeline: str, encoded_keys: Sequence[bytes], starts: Column) -> list[int]:
        return session_ids(pipeline, encoded_keys, starts)

    def row_windows(self, t: int, closed_before: int | None) -> list[WindowBounds]:
        """The row's own one-row session (state merges it with its neighbours), or none if late."""
        if self.is_late(t, closed_before):
            return []
        return [WindowBounds(t, self.session_end(t, self.bucket(t)))]

    def is_final(self, window: WindowBounds, watermark: int | None) -> bool:
        return watermark is not None and window.end < watermark

    def evicted_before(self, watermark: int | None, retention: int) -> int | None:
        """Evicted once ``end + retention < W``: a later batch still accepts a row at ``W -
        retention``, which joins a session ending there."""
        return None if watermark is None else watermark - retention

    def expected_open_windows(self, lateness: int, retention: int) -> int:
        """At most this many sessions of one key are held at once in steady state.

        A held session ends at or after ``W - retention`` and starts at or before the newest row
        (``W + lateness``), so its rows meet a span of ``lateness + retention + gap``; sessions of
        a key in one bucket start more than ``gap`` apart, and each bucket boundary in the span
        can cut one more.
        """
        span = lateness + retention + self.gap
        return span // self.gap + 1 + span // self.cap + 1
