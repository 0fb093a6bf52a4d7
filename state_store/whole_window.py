"""Whole windows: a window stored as one row, in stores of schema 7 and older.

Stores of schema 7 and older may hold a window as one row instead of one per group (written by a
batch that changed most of its groups): its key is ``WINDOW_KEY`` and its blob holds every group.
Commits append segments instead, but a load still expands them into their groups and ``migrate_state``
rewrites an older-version one whole (:func:`window_blob`). The blob is the state version byte and
a msgpack array ``[keys, states]`` (the groups' encoded keys, their accumulator lists): msgpack
concatenates, so each state's bytes are exactly a group blob's body (``state_store.codec``), and a
reader cuts the groups out without decoding a value (:func:`window_groups`).
"""

from __future__ import annotations

import msgpack

from state_store.codec import describe, state_version
from state_store.errors import CorruptState
from state_store.msgpack_values import failure_reason

#: the group key of a whole-window row (an encoded key is never empty: it starts with ``KEY_FORMAT``)
WINDOW_KEY = b""


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
        raise CorruptState(f"whole-window blob is corrupt: {describe(blob)} does not decode ({failure_reason(exc)})") from None
    if WINDOW_KEY in keys:
        raise CorruptState(f"whole-window blob is corrupt: {describe(blob)} holds an empty group key")
    return [(key, prefix + body[a:b]) for key, a, b in zip(keys, bounds, bounds[1:])]


__all__ = ["WINDOW_KEY", "window_blob", "window_groups"]
