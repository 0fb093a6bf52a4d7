"""msgpack bytes of whole columns, laid out by NumPy.

The most common group key is one integer (a user or device id), and a commit or a batch of
``session_id`` encodes hundreds of thousands of keys and window starts: one msgpack call and one
concatenation per value were most of that encoding's cost. An int's msgpack bytes are a format
byte and its big-endian low bytes (or the value itself, a fixint), and a byte string's header is
a format byte and its length, so NumPy lays a whole column out at once. The bytes are exactly
msgpack's (tests compare them at every format's bounds).

>>> msgpack_ints(np.array([1, 300, -40])).to_pylist()
[b'\\x01', b'\\xcd\\x01,', b'\\xd0\\xd8']
>>> packed_int_keys(np.array([7]), 1).to_pylist(), bin_headers(np.array([3, 256])).to_pylist()
([b'\\x01\\x91\\x07'], [b'\\xc4\\x03', b'\\xc5\\x01\\x00'])
>>> packed_binaries(pa.array([b"ab", None], pa.binary())).to_pylist()
[b'\\xc4\\x02ab', None]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_ONE_ELEMENT_ARRAY = 0x91

#: (lowest, highest, format byte, bytes after it) of msgpack's int formats but the fixints
_INT_FORMATS = (
    (128, 255, 0xCC, 1), (256, 65535, 0xCD, 2), (65536, 2**32 - 1, 0xCE, 4), (2**32, 2**63 - 1, 0xCF, 8),
    (-128, -33, 0xD0, 1), (-32768, -129, 0xD1, 2), (-(2**31), -32769, 0xD2, 4), (-(2**63), -(2**31) - 1, 0xD3, 8),
)
#: the same for a byte string's header (bin 8, 16, 32)
_BIN_FORMATS = ((0, 255, 0xC4, 1), (256, 65535, 0xC5, 2), (65536, 2**32 - 1, 0xC6, 4))


def msgpack_ints(values: np.ndarray) -> pa.BinaryArray:
    """Each int64's msgpack bytes, as ``msgpack.packb`` gives them."""
    values = values.astype(np.int64, copy=False)
    rows, lengths = _formatted(values, _INT_FORMATS)
    fixint = (values >= -32) & (values <= 127)  # the value is its own byte (negative: two's complement)
    rows[fixint, 0] = values[fixint].astype(np.uint8)
    lengths[fixint] = 1
    return _cut(rows, lengths)


def bin_headers(lengths: np.ndarray) -> pa.BinaryArray:
    """The msgpack header of a byte string of each length (``use_bin_type``: bin 8, 16 or 32)."""
    rows, sizes = _formatted(lengths.astype(np.int64, copy=False), _BIN_FORMATS)
    return _cut(rows, sizes)


def packed_binaries(values: pa.BinaryArray) -> pa.BinaryArray:
    """Each byte string's msgpack bytes (``use_bin_type``: its bin header, then the bytes), a null
    staying null."""
    lengths = pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    return joined([bin_headers(lengths), values])


def packed_int_keys(values: np.ndarray, key_format: int) -> pa.BinaryArray:
    """``key_format`` + msgpack of ``[v]`` for each int64 ``v``, as ``codec.encode_key`` gives them."""
    prefix = bytes([key_format, _ONE_ELEMENT_ARRAY])
    return joined([prefix, msgpack_ints(values)])


def joined(parts: Sequence[bytes | pa.Array]) -> pa.BinaryArray:
    """Row by row, the concatenation of ``parts`` (byte strings repeat on every row)."""
    return pc.binary_join_element_wise(*parts, b"")


def _formatted(values: np.ndarray, formats: tuple[tuple[int, int, int, int], ...]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a format byte and the value's big-endian low bytes, and each row's length, for the
    values ``formats`` covers (the caller fills the rest)."""
    n = len(values)
    rows = np.zeros((n, 9), dtype=np.uint8)
    lengths = np.zeros(n, dtype=np.int64)
    big_endian = values.astype(">i8").view(np.uint8).reshape(n, 8)
    for low, high, byte, width in formats:
        at = np.flatnonzero((values >= low) & (values <= high))
        if len(at):
            rows[at, 0] = byte
            rows[at, 1:1 + width] = big_endian[at, 8 - width:]
            lengths[at] = 1 + width
    return rows, lengths


def _cut(rows: np.ndarray, lengths: np.ndarray) -> pa.BinaryArray:
    """Each row's first ``lengths`` bytes as one Arrow binary column."""
    data = rows[np.arange(rows.shape[1]) < lengths[:, None]]  # row after row, each cut to its length
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


__all__ = ["bin_headers", "joined", "msgpack_ints", "packed_binaries", "packed_int_keys"]
