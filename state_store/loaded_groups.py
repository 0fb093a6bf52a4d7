"""Decoding the groups a store loaded (``RecoveredState.groups``) into the engine's accumulators.

One fast path (one ``unpackb`` per key and per blob, each key decoded once) and, for anything
unusual, the checked path of ``state_store.codec`` that migrates older blobs and names the exact
failure; and :func:`gc_paused`, for building millions of small containers.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterable, Iterator

import msgpack

from state_store.codec import KEY_FORMAT, STATE_VERSION, decode_key, decode_state
from state_store.errors import CorruptState, StateVersionError
from state_store.msgpack_values import ext_hook


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
    unpackb, hook, version, key_format = msgpack.unpackb, ext_hook, STATE_VERSION, KEY_FORMAT
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


__all__ = ["decode_groups", "gc_paused"]
