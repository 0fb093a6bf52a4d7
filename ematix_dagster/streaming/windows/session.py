"""Session windows (SPEC.md §8): runs of a key's rows at most ``gap`` apart, cut at cap buckets.

A session's end depends on its rows, so unlike fixed windows a start alone does not name a window:
the driver keeps each key's sessions in :mod:`ematix_dagster.streaming.session_state`, and this
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
from typing import TYPE_CHECKING, Any

import msgpack

from ematix_dagster.streaming.windows.base import WindowBounds, WindowKind
from ematix_dagster.streaming.windows.units import MICROS_PER_MS

if TYPE_CHECKING:
    from ematix_dagster.spec import Window


def session_id(pipeline: str, encoded_key: bytes, window_start: int) -> int:
    """The informational BIGINT ``session_id`` of SPEC.md §8.

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
    packed = msgpack.packb([pipeline, encoded_key, window_start], use_bin_type=True)
    return int.from_bytes(hashlib.sha256(packed).digest()[:8], "big", signed=True)


class SessionWindows(WindowKind):
    """Gap-based sessions per key; ``gap`` and ``cap`` (``max_session_duration_ms``) in µs.

    A session is final once ``window_end < W`` (strict: a row at exactly ``last + gap`` still
    joins, and the late rule accepts rows at ``t >= W_prev``), and under ``reopen`` it is retained
    until ``window_end + retention < W``. Then no accepted row can reach an evicted session.
    """

    def __init__(self, gap: int, cap: int) -> None:
        if not 0 < gap < cap:
            raise ValueError(f"session windows need 0 < gap < cap, got gap={gap} cap={cap}")
        self.gap = gap
        self.cap = cap

    @classmethod
    def for_window(cls, window: Window) -> SessionWindows:
        # getattr: the spec's session fields are added by the session that wires sessions in.
        return cls(getattr(window, "gap_ms") * MICROS_PER_MS,
                   getattr(window, "max_session_duration_ms") * MICROS_PER_MS)

    @classmethod
    def fingerprint(cls, window: Window) -> dict[str, Any]:
        return {"window.gap_ms": getattr(window, "gap_ms"),
                "window.max_session_duration_ms": getattr(window, "max_session_duration_ms")}

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

    def bounds(self, start: int) -> WindowBounds:
        raise NotImplementedError("a session's end depends on its rows; SessionState holds it")

    def valid_end(self, start: int, end: int) -> bool:
        """A session ends after its start (by the gap at least) and never past its bucket's end."""
        return start < end <= self.bucket_end(self.bucket(start))

    def row_windows(self, t: int, closed_before: int | None) -> list[WindowBounds]:
        """The row's own one-row session (state merges it with its neighbours), or none if late."""
        if self.is_late(t, closed_before):
            return []
        return [WindowBounds(t, self.session_end(t, self.bucket(t)))]

    def is_final(self, window: WindowBounds, watermark: int | None) -> bool:
        return watermark is not None and window.end < watermark

    def is_evicted(self, window: WindowBounds, watermark: int | None, retention: int) -> bool:
        return watermark is not None and window.end + retention < watermark

    def expected_open_windows(self, lateness: int, retention: int) -> int:
        """At most this many sessions of one key are held at once in steady state.

        A held session ends at or after ``W - retention`` and starts at or before the newest row
        (``W + lateness``), so its rows meet a span of ``lateness + retention + gap``; sessions of
        a key in one bucket start more than ``gap`` apart, and each bucket boundary in the span
        can cut one more.
        """
        span = lateness + retention + self.gap
        return span // self.gap + 1 + span // self.cap + 1
