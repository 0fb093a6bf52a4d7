"""Versioned, compact, safe encoding of group keys and accumulator lists.

Everything is msgpack with a few extension types (``state_store.msgpack_values``, which lists the
value types); decoding never runs code (no pickle), and every failure to decode is a
:class:`~state_store.errors.CorruptState`. A window stored as one row is
``state_store.whole_window``'s; a load's groups are decoded by ``state_store.loaded_groups``.

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

Held output rows (:func:`encode_row` / :func:`decode_row`)
    A row held back by ``WATERMARK_TS()``: ``ROW_FORMAT`` byte (2) + a msgpack array of the row's
    values as Arrow's ``to_pylist`` gives them, with state version 2's extension types. Unlike
    accumulators, lists and dicts are values here (Arrow lists, maps' entries, structs): arrays
    decode as tuples, maps as dicts. Like the key format, the row format is not versioned with
    the state: a held row written by any version must still leave.

Version history
    1. Every value tagged as ``[type name, payload]``; ints, floats and decimals as text,
       timestamps and dates as ISO-8601 strings, sets as plain (sorted) lists. Readable, but large
       and slow to decode (a Python call per value). Fixtures: ``tests/fixtures/state_v1``.
    2. Native msgpack scalars + extension types (µs integers instead of ISO strings, sets as maps):
       2-4x smaller, and decoding runs in C except for extension values.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from decimal import Decimal
from itertools import chain
from operator import itemgetter
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from state_store.codec_v1 import v1_values
from state_store.errors import CorruptState, StateVersionError
from state_store.int_key_column import IntKeyColumn
from state_store.msgpack_columns import packed_int_keys
from state_store.msgpack_values import failure_reason, new_packer, packb, unpackb, unpackb_values

KEY_FORMAT = 1
STATE_VERSION = 2
_MAX_VERSION_BYTE = 127  # version bytes 0 and 128..255 are never valid: such a blob is corrupt
_NAN = float("nan")
_KEY_PREFIX = bytes([KEY_FORMAT])
STATE_PREFIX = bytes([STATE_VERSION])
ROW_FORMAT = 2  # the byte before a held row's values: stable forever, like KEY_FORMAT
_ROW_PREFIX = bytes([ROW_FORMAT])


# ---- group keys ------------------------------------------------------------------------------

_KEY_TYPES = (type(None), bool, int, float, str, bytes, Decimal, datetime, date, time, timedelta)
_KEY_TYPE_SET = frozenset(_KEY_TYPES)


_PLAIN_KEY_TYPES = frozenset({type(None), bool, int, str, bytes})  # encoded as they are


def encode_key(key: tuple) -> bytes:
    """Canonical bytes of a group key (a tuple of scalar values); equal inputs give equal bytes."""
    if set(map(type, key)) <= _PLAIN_KEY_TYPES:  # the common case, checked at C speed
        return _KEY_PREFIX + packb(list(key))
    values = []
    for v in key:
        if type(v) is float and v != v:
            v = _NAN  # one NaN, whatever its payload bits
        elif isinstance(v, (bytearray, memoryview)):
            v = bytes(v)
        elif not isinstance(v, _KEY_TYPES):
            raise TypeError(f"cannot use a value of type {type(v).__name__} in a group key")
        values.append(v)
    return _KEY_PREFIX + packb(values)


def encode_keys(keys: Sequence[tuple]) -> list[bytes]:
    """:func:`encode_key` of every key of a commit at once: keys of plain values (the common case,
    checked once for all at C speed) are packed by one packer without a check per key, about
    three times faster on a state's million keys (a tuple packs as the list would); keys of one
    int64 are laid out by NumPy (``state_store.msgpack_columns``), three times faster again."""
    if isinstance(keys, IntKeyColumn):
        return packed_int_keys(keys.ids, KEY_FORMAT).to_pylist()
    types = set(map(type, chain.from_iterable(keys)))
    if types == {int} and set(map(len, keys)) == {1}:
        try:
            return packed_int_keys(np.fromiter(chain.from_iterable(keys), np.int64, len(keys)), KEY_FORMAT).to_pylist()
        except OverflowError:  # an int past int64: msgpack's own packer below
            pass
    if types <= _PLAIN_KEY_TYPES:
        pack, prefix = new_packer().pack, _KEY_PREFIX
        return [prefix + pack(key) for key in keys]
    return list(map(encode_key, keys))


def encoded_key_array(keys: Sequence[tuple]) -> pa.BinaryArray:
    """:func:`encode_keys` as one Arrow column, as a segment stores them: a column of int keys goes
    from NumPy to Arrow without a bytes object per key."""
    if isinstance(keys, IntKeyColumn):
        return packed_int_keys(keys.ids, KEY_FORMAT)
    return pa.array(encode_keys(keys), pa.binary())


def decode_key(b: bytes) -> tuple:
    """The tuple :func:`encode_key` made; raises :class:`CorruptState` for anything else."""
    if not b or b[0] != KEY_FORMAT:
        raise CorruptState(f"group key is corrupt: {describe(b)} is not a key of format {KEY_FORMAT}")
    try:
        key = unpackb(b[1:])
    except Exception as exc:  # noqa: BLE001 - every decoding failure is corruption
        raise CorruptState(f"group key is corrupt: {describe(b)} does not decode ({failure_reason(exc)})") from None
    if type(key) is not tuple or any(not isinstance(v, _KEY_TYPES) for v in key):
        raise CorruptState(f"group key is corrupt: {describe(b)} is not a tuple of scalar values")
    return key


def decode_keys(blobs: Sequence[bytes]) -> list[tuple]:
    """:func:`decode_key` of each of ``blobs``: a restore decodes up to millions, so every key is
    unpacked first and all are checked at once at C speed; when any is not a well-formed key,
    they are decoded one by one, raising for the first bad one as :func:`decode_key` does."""
    try:
        keys = list(map(unpackb, map(itemgetter(slice(1, None)), blobs)))
        fits = (set(map(itemgetter(0), blobs)) <= {KEY_FORMAT} and set(map(type, keys)) <= {tuple}
                and set(map(type, chain.from_iterable(keys))) <= _KEY_TYPE_SET)
    except Exception:  # noqa: BLE001 - named key by key below
        fits = False
    return keys if fits else list(map(decode_key, blobs))


# ---- accumulator lists -----------------------------------------------------------------------


_NOT_VALUES = (list, dict)  # msgpack would pack them, but they would come back as a tuple / a set


PLAIN_STATE_TYPES = frozenset({type(None), bool, int, float, str, bytes})  # need no checks


def encode_state(accs: list) -> bytes:
    """One (window, group)'s accumulators in the current ``STATE_VERSION``."""
    if not (type(accs) is list and set(map(type, accs)) <= PLAIN_STATE_TYPES):
        check_accumulators(accs)
    try:
        return STATE_PREFIX + packb(accs if type(accs) is list else list(accs))
    except OverflowError as exc:  # pragma: no cover - msgpack hands big ints to _default
        raise TypeError(str(exc)) from None


def encode_row(values: list | tuple) -> bytes:
    """One held output row's values (any Arrow column's Python values)."""
    try:
        return _ROW_PREFIX + packb(values)
    except OverflowError as exc:  # pragma: no cover - msgpack hands big ints to _default
        raise TypeError(str(exc)) from None


def decode_row(b: bytes) -> list:
    """The values of a held row written by :func:`encode_row`."""
    if b[:1] != _ROW_PREFIX:
        raise CorruptState(f"held row is corrupt: {describe(b)} has no row format byte {ROW_FORMAT}")
    return _decoded_list(b, unpackb_values, "held row", "values")


def _decoded_list(b: bytes, unpack: Callable[[bytes], Any], what: str, items: str) -> list:
    """The msgpack array after a blob's first byte, as a list; anything else is corrupt."""
    try:
        values = unpack(bytes(b[1:]))
    except Exception as exc:  # noqa: BLE001
        raise CorruptState(f"{what} is corrupt: {describe(b)} does not decode ({failure_reason(exc)})") from None
    if type(values) is not tuple:
        raise CorruptState(f"{what} is corrupt: {describe(b)} is not a list of {items}")
    return list(values)


def check_accumulators(accs: Iterable[Any]) -> None:
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
    return _decoded_list(b, unpackb, "state blob", "accumulators")


def state_version(b: bytes) -> int:
    """The version byte of a blob; refuses blobs that are not state at all or are too new."""
    if not b:
        raise CorruptState("state blob is corrupt: it is empty")
    version = b[0]
    if version == 0 or version > _MAX_VERSION_BYTE:
        raise CorruptState(f"state blob is corrupt: {describe(b)} has no valid version byte")
    if version > STATE_VERSION:
        raise StateVersionError(_newer(version))
    return version


def _newer(version: int) -> str:
    return f"state version {version} is newer than this code ({STATE_VERSION}); upgrade ematix-dagster"


def describe(b: bytes | memoryview) -> str:
    b = bytes(b)
    head = b[:16].hex()
    return f"{len(b)} bytes ({head}{'...' if len(b) > 16 else ''})"


# ---- migrations (forward only, pure, kept forever) --------------------------------------------


def _v1_to_v2(blob: bytes) -> bytes:
    return bytes([2]) + packb(v1_values(blob))


# from_version -> step to from_version + 1. A version missing here cannot be migrated: the
# pipeline stops with StateVersionError and the operator resets it.
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
        raise CorruptState(f"state blob is corrupt: {describe(blob)} is not a version-{from_version} blob")
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
                f"state blob is corrupt: {describe(blob)} does not decode as version {version} ({failure_reason(exc)})") from None
    return blob


__all__ = ["KEY_FORMAT", "ROW_FORMAT", "STATE_VERSION", "encode_key", "encode_keys", "encoded_key_array", "decode_key", "decode_keys", "encode_state",
           "decode_state", "encode_row", "decode_row", "state_version", "migrate"]
