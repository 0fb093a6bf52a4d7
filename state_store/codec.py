"""Versioned, compact, safe encoding of group keys and accumulator lists.

Everything is msgpack with a few extension types; decoding never runs code (no pickle), and
every failure to decode is a :class:`~state_store.errors.CorruptState`.

Group keys (:func:`encode_key` / :func:`decode_key`)
    ``KEY_FORMAT`` byte (1) + a msgpack array of the key's values. The encoding is canonical and
    deterministic, so the bytes are a primary key: ``1``, ``1.0``, ``"1"``, ``True``, ``None``,
    ``Decimal("1")`` and ``Decimal("1.0")`` all encode differently and decode to equal values of the
    same type. Every NaN encodes as the same NaN; ``-0.0`` keeps its sign. The key format is
    stable forever (it is not versioned with the state: a key written by any version must keep
    finding its row).

Accumulator lists (:func:`encode_state` / :func:`decode_state`)
    One byte of state version (``STATE_VERSION``, 1..127) + the version's body. Version 2 (current)
    is a msgpack array with one element per aggregation; tuples are msgpack arrays (decoded with
    ``use_list=False``, so they come back as tuples), and the extension types below carry what
    msgpack lacks. Older blobs are brought forward by :func:`migrate`, a chain of pure functions that
    lives forever; a newer blob is refused with :class:`StateVersionError`.

Whole windows (:func:`encode_window` / :func:`window_groups`)
    A window stored as one row: the state version byte + a msgpack array ``[keys, states]``, each
    state's bytes exactly the body of that group's own blob (see "whole windows" below).

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

Version history
    1. Every value tagged as ``[type name, payload]``; ints, floats and decimals as text,
       timestamps and dates as ISO-8601 strings, sets as plain (sorted) lists. Readable, but large
       and slow to decode (a Python call per value). Fixtures: ``tests/fixtures/state_v1``.
    2. Native msgpack scalars + extension types (µs integers instead of ISO strings, sets as maps):
       2-4x smaller, and decoding runs in C except for extension values.
"""

from __future__ import annotations

import gc
import struct
import threading
from contextlib import contextmanager
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from itertools import chain
from typing import Any, Callable, Iterable, Iterator

import msgpack
from msgpack import ExtType

from state_store.codec_v1 import v1_values
from state_store.errors import CorruptState, StateVersionError

KEY_FORMAT = 1
STATE_VERSION = 2
_MAX_VERSION_BYTE = 127  # version bytes 0 and 128..255 are never valid: such a blob is corrupt

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
_NAN = float("nan")
_KEY_PREFIX = bytes([KEY_FORMAT])
_STATE_PREFIX = bytes([STATE_VERSION])


# ---- values ----------------------------------------------------------------------------------


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
            items.sort(key=_packb)
        return dict.fromkeys(items)
    if isinstance(o, (bytearray, memoryview)):
        return bytes(o)
    raise TypeError(f"cannot encode a value of type {type(o).__name__} in window state")


_PACKERS = threading.local()  # a Packer is reused (cheaper than packb's new one per call), one per thread


def _packb(o: Any) -> bytes:
    packer = getattr(_PACKERS, "packer", None)
    if packer is None:
        packer = _PACKERS.packer = msgpack.Packer(default=_default, use_bin_type=True)
    try:
        return packer.pack(o)
    except BaseException:
        _PACKERS.packer = None  # never reuse a buffer a failed pack may have left half written
        raise


def _ext_hook(code: int, data: bytes) -> Any:
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


def _unpackb(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, object_hook=set, use_list=False, raw=False,
                           strict_map_key=False)


# ---- group keys ------------------------------------------------------------------------------

_KEY_TYPES = (type(None), bool, int, float, str, bytes, Decimal, datetime, date, time, timedelta)


_PLAIN_KEY_TYPES = frozenset({type(None), bool, int, str, bytes})  # encoded as they are


def encode_key(key: tuple) -> bytes:
    """Canonical bytes of a group key (a tuple of scalar values); equal inputs give equal bytes."""
    if set(map(type, key)) <= _PLAIN_KEY_TYPES:  # the common case, checked at C speed
        return _KEY_PREFIX + _packb(list(key))
    values = []
    for v in key:
        if type(v) is float and v != v:
            v = _NAN  # one NaN, whatever its payload bits
        elif isinstance(v, (bytearray, memoryview)):
            v = bytes(v)
        elif not isinstance(v, _KEY_TYPES):
            raise TypeError(f"cannot use a value of type {type(v).__name__} in a group key")
        values.append(v)
    return _KEY_PREFIX + _packb(values)


def decode_key(b: bytes) -> tuple:
    """The tuple :func:`encode_key` made; raises :class:`CorruptState` for anything else."""
    if not b or b[0] != KEY_FORMAT:
        raise CorruptState(f"group key is corrupt: {_describe(b)} is not a key of format {KEY_FORMAT}")
    try:
        key = _unpackb(b[1:])
    except Exception as exc:  # noqa: BLE001 - every decoding failure is corruption
        raise CorruptState(f"group key is corrupt: {_describe(b)} does not decode ({exc})") from None
    if type(key) is not tuple or any(not isinstance(v, _KEY_TYPES) for v in key):
        raise CorruptState(f"group key is corrupt: {_describe(b)} is not a tuple of scalar values")
    return key


# ---- accumulator lists -----------------------------------------------------------------------


_NOT_VALUES = (list, dict)  # msgpack would pack them, but they would come back as a tuple / a set


_PLAIN_STATE_TYPES = frozenset({type(None), bool, int, float, str, bytes})  # need no checks


def encode_state(accs: list) -> bytes:
    """One (window, group)'s accumulators in the current ``STATE_VERSION``."""
    if not (type(accs) is list and set(map(type, accs)) <= _PLAIN_STATE_TYPES):
        _check_accumulators(accs)
    try:
        return _STATE_PREFIX + _packb(accs if type(accs) is list else list(accs))
    except OverflowError as exc:  # pragma: no cover - msgpack hands big ints to _default
        raise TypeError(str(exc)) from None


def _check_accumulators(accs: Iterable[Any]) -> None:
    for a in accs:
        kind = type(a)
        if kind is tuple:
            if any(type(x) in _NOT_VALUES for x in a):
                raise TypeError("an accumulator tuple cannot hold a list or a dict")
        elif kind in _NOT_VALUES:
            raise TypeError(f"an accumulator cannot be a {kind.__name__} (use a tuple or a set)")


def decode_state(b: bytes) -> list:
    """The accumulator list of a blob of the current or an older version (migrated on the fly)."""
    version = state_version(b)
    if version != STATE_VERSION:
        b = migrate(b, version, STATE_VERSION)
    try:
        accs = _unpackb(bytes(b[1:]))
    except Exception as exc:  # noqa: BLE001
        raise CorruptState(f"state blob is corrupt: {_describe(b)} does not decode ({exc})") from None
    if type(accs) is not tuple:
        raise CorruptState(f"state blob is corrupt: {_describe(b)} is not a list of accumulators")
    return list(accs)


def state_version(b: bytes) -> int:
    """The version byte of a blob; refuses blobs that are not state at all or are too new."""
    if not b:
        raise CorruptState("state blob is corrupt: it is empty")
    version = b[0]
    if version == 0 or version > _MAX_VERSION_BYTE:
        raise CorruptState(f"state blob is corrupt: {_describe(b)} has no valid version byte")
    if version > STATE_VERSION:
        raise StateVersionError(_newer(version))
    return version


def _newer(version: int) -> str:
    return f"state version {version} is newer than this code ({STATE_VERSION}); upgrade ematix-dagster"


def _describe(b: bytes | memoryview) -> str:
    b = bytes(b)
    head = b[:16].hex()
    return f"{len(b)} bytes ({head}{'...' if len(b) > 16 else ''})"


# ---- migrations (forward only, pure, kept forever) --------------------------------------------


def _v1_to_v2(blob: bytes) -> bytes:
    return bytes([2]) + _packb(v1_values(blob))


# from_version -> step to from_version + 1. A version missing here cannot be migrated (seed 001's
# "Unsupported"): the pipeline stops with StateVersionError and the operator resets it.
_MIGRATIONS: dict[int, Callable[[bytes], bytes]] = {1: _v1_to_v2}


def migrate(blob: bytes, from_version: int, to_version: int = STATE_VERSION) -> bytes:
    """Bring a blob of ``from_version`` forward to ``to_version`` (pure; forward only)."""
    if to_version > STATE_VERSION:
        raise StateVersionError(f"cannot migrate to state version {to_version}: this code knows up to {STATE_VERSION}")
    if from_version > STATE_VERSION:
        raise StateVersionError(_newer(from_version))
    if from_version > to_version:
        raise StateVersionError(
            f"cannot migrate state from version {from_version} back to {to_version}: migrations are forward only")
    if not blob or blob[0] != from_version:
        raise CorruptState(f"state blob is corrupt: {_describe(blob)} is not a version-{from_version} blob")
    for version in range(from_version, to_version):
        step = _MIGRATIONS.get(version)
        if step is None:
            raise StateVersionError(
                f"state version {version} cannot be migrated to {version + 1} (unsupported); "
                "reset the pipeline's state (ematix-dagster reset) and replay from the source")
        try:
            blob = step(blob)
        except (StateVersionError, CorruptState):
            raise
        except Exception as exc:  # noqa: BLE001
            raise CorruptState(
                f"state blob is corrupt: {_describe(blob)} does not decode as version {version} ({exc})") from None
    return blob


# ---- whole windows ---------------------------------------------------------------------------
#
# A window whose groups mostly changed in a batch is stored as one row instead of one per group
# (``BatchCommit.whole_windows``): its key is ``WINDOW_KEY`` and its blob holds every group. The
# blob is the state version byte and a msgpack array ``[keys, states]`` (the groups' encoded keys,
# their accumulator lists): msgpack concatenates, so each state's bytes are exactly a group blob's
# body, and a reader cuts the groups out without decoding a value (:func:`window_groups`).

#: the group key of a whole-window row (an encoded key is never empty: it starts with ``KEY_FORMAT``)
WINDOW_KEY = b""


def encode_window(keys: list[bytes], states: list[list]) -> bytes:
    """Every group of one window (encoded keys and their accumulator lists) as one blob, in one
    msgpack call: a batch that changed most of a window writes it this way."""
    if not set(map(type, chain.from_iterable(states))) <= _PLAIN_STATE_TYPES:
        for accs in states:
            _check_accumulators(accs)
    if type(states) is not list or not set(map(type, states)) <= {list}:
        states = [list(accs) for accs in states]
    return _STATE_PREFIX + _packb([keys, states])


def window_blob(version: int, keys: list[bytes], blobs: list[bytes]) -> bytes:
    """The whole-window blob of groups already encoded (``blobs`` of version ``version``)."""
    packer = msgpack.Packer(use_bin_type=True)
    return b"".join([bytes([version]), packer.pack_array_header(2), packer.pack(keys),
                     packer.pack_array_header(len(blobs)), *(blob[1:] for blob in blobs)])


def window_groups(blob: bytes) -> list[tuple[bytes, bytes]]:
    """The (encoded key, group blob) pairs of a whole-window blob, each group blob of the window's
    version; raises :class:`CorruptState` for anything else."""
    version = state_version(blob)
    body = bytes(blob[1:])
    try:
        unpacker = msgpack.Unpacker(use_list=True, raw=False, max_buffer_size=max(len(body), 1))
        unpacker.feed(body)
        if unpacker.read_array_header() != 2:
            raise ValueError("not [keys, states]")
        keys = unpacker.unpack()
        if type(keys) is not list or not set(map(type, keys)) <= {bytes}:
            raise ValueError("its keys are not a list of byte strings")
        if unpacker.read_array_header() != len(keys):
            raise ValueError("it holds another number of states than keys")
        prefix, bounds = bytes([version]), [unpacker.tell()]
        for _ in keys:
            unpacker.skip()
            bounds.append(unpacker.tell())
        if bounds[-1] != len(body):
            raise ValueError("bytes follow its last state")
    except Exception as exc:  # noqa: BLE001 - every decoding failure is corruption
        raise CorruptState(f"whole-window blob is corrupt: {_describe(blob)} does not decode ({exc})") from None
    if WINDOW_KEY in keys:
        raise CorruptState(f"whole-window blob is corrupt: {_describe(blob)} holds an empty group key")
    return [(key, prefix + body[a:b]) for key, a, b in zip(keys, bounds, bounds[1:])]


# ---- helpers for stores and the engine --------------------------------------------------------


def decode_groups(pipeline: str, groups: Iterable[tuple[int, int | None, bytes, bytes]],
                  store: str | None = None) -> dict[int, dict[tuple, list]]:
    """``RecoveredState.groups`` (``(start, end, key, blob)``) decoded into ``{window_start: {key: accumulators}}``.

    Window ends are not part of the result: the caller checks them against its window kind.

    A key or blob that does not decode raises :class:`CorruptState` naming the pipeline, the
    window and (where it decodes) the group. Fast path: one ``unpackb`` per key and per blob;
    anything unusual (an older version, a decoding error) goes through the checked path.
    """
    groups = groups if isinstance(groups, list) else list(groups)
    with gc_paused():
        try:
            return _decode_groups_fast(groups)
        except Exception:  # noqa: BLE001 - redo carefully: migrate old blobs, name the exact failure
            pass
    windows: dict[int, dict[tuple, list]] = {}
    for start, _end, key_bytes, blob in groups:
        try:
            key = decode_key(key_bytes)
        except CorruptState as exc:
            raise CorruptState(f"{_where(pipeline, store)}: window {start}: {exc}") from None
        try:
            accs = decode_state(blob)
        except (CorruptState, StateVersionError) as exc:
            raise type(exc)(f"{_where(pipeline, store)}: window {start}, group {key!r}: {exc}") from None
        group = windows.get(start)
        if group is None:
            group = windows[start] = {}
        group[key] = accs
    return windows


def _decode_groups_fast(groups: list[tuple[int, int | None, bytes, bytes]]) -> dict[int, dict[tuple, list]]:
    windows: dict[int, dict[tuple, list]] = {}
    keys: dict[bytes, tuple] = {}  # a group seen in several windows decodes (and is stored) once
    unpackb, hook, version, key_format = msgpack.unpackb, _ext_hook, STATE_VERSION, KEY_FORMAT
    for start, _end, key_bytes, blob in groups:
        key = keys.get(key_bytes)
        if key is None:
            if key_bytes[0] != key_format:
                raise ValueError("not a key")
            key = unpackb(key_bytes[1:], ext_hook=hook, object_hook=set, use_list=False, raw=False,
                          strict_map_key=False)
            if type(key) is not tuple:
                raise ValueError("not a tuple")
            keys[key_bytes] = key
        if blob[0] != version:
            raise ValueError("not the current version")
        accs = unpackb(blob[1:], ext_hook=hook, object_hook=set, use_list=False, raw=False, strict_map_key=False)
        if type(accs) is not tuple:
            raise ValueError("not a tuple")
        group = windows.get(start)
        if group is None:
            group = windows[start] = {}
        group[key] = list(accs)
    return windows


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC while building millions of small containers (none of them form cycles)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _where(pipeline: str, store: str | None) -> str:
    return f"pipeline {pipeline!r}" + (f" in {store}" if store else "")


__all__ = [
    "KEY_FORMAT", "STATE_VERSION", "encode_key", "decode_key", "encode_state", "decode_state",
    "state_version", "migrate", "decode_groups", "WINDOW_KEY", "encode_window", "window_blob", "window_groups",
]
