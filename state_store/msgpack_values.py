"""Window state's values in msgpack: the extension types for what msgpack lacks, and a reused packer.

Decoding never runs code (no pickle). Used by the codec (``state_store.codec``) for group keys and
accumulator lists, and by the decoding of loaded groups (``state_store.loaded_groups``).

Value types (keys and accumulators): ``None``, ``bool``, ``int`` (any size: outside msgpack's
64-bit range as extension 1, two's complement big-endian), ``float``, ``str``, ``bytes``,
``Decimal`` (ext 2, its exact text, so the exponent survives), ``datetime`` (ext 3: tz-aware, as
µs since the epoch, decoded as UTC; ext 4: naive, µs since 1970-01-01), ``date`` (ext 5, days since
1970-01-01), ``time`` (ext 6, µs since midnight), ``timedelta`` (ext 7, µs). Accumulators may also
hold tuples (``(event_ts_us, value)`` for first/last, ``(float_sum, count)`` for avg), ``set`` (a
msgpack map from each element, sorted for deterministic bytes, to nil; maps are used for nothing
else and decode straight to sets through ``object_hook=set``, in C; exact count_distinct) and
``bytes`` (HLL sketches). Lists are not accumulator values (they would come back as tuples) and
are refused.
"""

from __future__ import annotations

import struct
import threading
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from functools import partial
from typing import Any, Callable

import msgpack
from msgpack import ExtType

_EXT_BIGINT = 1
_EXT_DECIMAL = 2
_EXT_DATETIME_UTC = 3
_EXT_DATETIME_NAIVE = 4
_EXT_DATE = 5
_EXT_TIME = 6
_EXT_TIMEDELTA = 7
# 8 and up: free. Sets are msgpack maps {element: nil}.

_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_US = timedelta(microseconds=1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def _default(o: Any) -> Any:
    """msgpack's hook for what it cannot pack natively."""
    if isinstance(o, int):  # msgpack calls us only for ints outside [-2**63, 2**64)
        return ExtType(_EXT_BIGINT, o.to_bytes((o.bit_length() + 8) // 8, "big", signed=True))
    if isinstance(o, Decimal):
        return ExtType(_EXT_DECIMAL, str(o).encode("ascii"))
    if isinstance(o, datetime):
        if o.utcoffset() is None:
            return ExtType(_EXT_DATETIME_NAIVE, _Q.pack((o.replace(tzinfo=None) - _EPOCH_NAIVE) // _US))
        return ExtType(_EXT_DATETIME_UTC, _Q.pack((o - _EPOCH_UTC) // _US))
    if isinstance(o, date):
        return ExtType(_EXT_DATE, _I.pack(o.toordinal() - _EPOCH_ORDINAL))
    if isinstance(o, time):
        if o.utcoffset() is not None:
            raise TypeError("cannot encode a time of day with a time zone")
        return ExtType(_EXT_TIME, _Q.pack(((o.hour * 60 + o.minute) * 60 + o.second) * 1_000_000 + o.microsecond))
    if isinstance(o, timedelta):
        return ExtType(_EXT_TIMEDELTA, _Q.pack(o // _US))
    if isinstance(o, (set, frozenset)):
        items = list(o)
        try:
            items.sort()
        except TypeError:  # mixed types: order by encoding, still deterministic
            items.sort(key=packb)
        return dict.fromkeys(items)
    if isinstance(o, (bytearray, memoryview)):
        return bytes(o)
    raise TypeError(f"cannot encode a value of type {type(o).__name__} in window state")


_PACKERS = threading.local()  # a Packer is reused (cheaper than packb's new one per call), one per thread


def new_packer() -> msgpack.Packer:
    """A packer of its own (one reused for every value of a column, each ``pack`` a separate value)."""
    return msgpack.Packer(default=_default, use_bin_type=True)


def packb(o: Any) -> bytes:
    packer = getattr(_PACKERS, "packer", None)
    if packer is None:
        packer = _PACKERS.packer = new_packer()
    try:
        return packer.pack(o)
    except BaseException:
        _PACKERS.packer = None  # never reuse a buffer a failed pack may have left half written
        raise


def ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_DATETIME_UTC:
        return _EPOCH_UTC + timedelta(microseconds=_Q.unpack(data)[0])
    if code == _EXT_DECIMAL:
        return Decimal(data.decode("ascii"))
    if code == _EXT_BIGINT:
        return int.from_bytes(data, "big", signed=True)
    if code == _EXT_DATETIME_NAIVE:
        return _EPOCH_NAIVE + timedelta(microseconds=_Q.unpack(data)[0])
    if code == _EXT_DATE:
        return date.fromordinal(_I.unpack(data)[0] + _EPOCH_ORDINAL)
    if code == _EXT_TIME:
        seconds, micro = divmod(_Q.unpack(data)[0], 1_000_000)
        return time(seconds // 3600, seconds // 60 % 60, seconds % 60, micro)
    if code == _EXT_TIMEDELTA:
        return timedelta(microseconds=_Q.unpack(data)[0])
    raise ValueError(f"unknown extension type {code}")


#: a value from its bytes (bytes or a memoryview); a partial rather than a function, as a restore
#: calls it once per key, up to millions of times
unpackb: Callable[[bytes | memoryview], Any] = partial(msgpack.unpackb, ext_hook=ext_hook, object_hook=set,
                                                       use_list=False, raw=False, strict_map_key=False)


def unpackb_values(data: bytes | memoryview) -> Any:
    """Plain values (a held output row): maps come back as dicts (Arrow structs), not as sets."""
    return msgpack.unpackb(data, ext_hook=ext_hook, use_list=False, raw=False, strict_map_key=False)


def failure_reason(exc: Exception) -> str:
    """Why bytes did not decode, for a corrupt-state message: some of msgpack's errors carry no text
    (a ``FormatError`` from a byte that starts no value), which would leave the reason empty."""
    if isinstance(exc, msgpack.FormatError):
        return "a byte that starts no msgpack value"
    if isinstance(exc, msgpack.ExtraData):
        return f"{len(exc.extra)} bytes follow the value"
    return str(exc) or type(exc).__name__


__all__ = ["new_packer", "packb", "unpackb", "unpackb_values", "ext_hook", "failure_reason"]
