"""State segments (schema step 8): many groups' changes in one blob, as columns.

A segment is ``MAGIC``, a format version byte, then an Arrow IPC stream of one table: one row per
operation, ``op`` (:data:`UPSERT`, :data:`DELETE` by ``(window_start, group_key)``, or
:data:`DELETE_BEFORE` every group whose start is before ``window_start``), ``window_end``,
``group_key`` (``state_store.codec.encode_key`` bytes), ``emitted`` and ``written`` (the schema step
5 and 6 values of a row, null where a row stores none) and one column per accumulator. Arrow IPC
because it is a documented, versioned columnar format both written and read at C speed, with no
code in it (pickle, NumPy's ``allow_pickle``, is never used). An accumulator column is typed
(``int64`` or ``float64``, nulls for None) when every value is exactly an int in range, or a float;
else each value is its msgpack bytes (``state_store.msgpack_values``, the codec's value encoding),
null for None. Each field's ``codec`` metadata says which, so a decoded value has exactly the type the row codec
would give (ints stay ints, Decimals, sets, sketches and tuples come back as they were). Buffers
are LZ4-compressed (Arrow IPC's own buffer compression, which a reader undoes by itself: blobs
written uncompressed, as the first code of this format did, read the same).

Upserts of a segment replace their ``(window_start, key)``; a reader applies a segment's deletes
before its upserts. A *base* segment (schema metadata ``base``) holds the whole state; the ones
after it are deltas. A store need not begin with a base: once the engine drops a dead prefix
(``segment_replay.dead_prefix``) the oldest stored segment may be a delta, replayed from empty
state like any other. Every decoding failure is :class:`CorruptState` naming where it was read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Sequence

import msgpack
import numpy as np
import pyarrow as pa

from state_store.errors import CorruptState, StateVersionError
from state_store.msgpack_columns import packed_binaries
from state_store.msgpack_values import ext_hook, failure_reason, new_packer

MAGIC = b"EMXSEG"
FORMAT_VERSION = 1
UPSERT, DELETE, DELETE_BEFORE = 0, 1, 2
_INT, _FLOAT, _PACKED = b"int64", b"float64", b"msgpack"
_FIXED = [("op", pa.int8()), ("window_start", pa.int64()), ("window_end", pa.int64()), ("group_key", pa.binary()),
          ("emitted", pa.bool_()), ("written", pa.binary())]
#: LZ4 buffer compression (docs/decisions.md, "Columnar driver state"), on the committing thread
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)
#: decompressed on the reading thread too: Arrow's thread pool costs a segment of a few hundred rows
#: four times its decoding (a 20-row segment: 124 against 30 µs)
_READ_OPTIONS = pa.ipc.IpcReadOptions(use_threads=False)
_unpack = partial(msgpack.unpackb, ext_hook=ext_hook, object_hook=set, use_list=False, raw=False,
                  strict_map_key=False)


@dataclass
class Segment:
    """One segment's operations as Python columns: the upserts, then the deletes a reader applies first."""

    base: bool = False
    starts: Sequence[int] | np.ndarray = field(default_factory=list)
    ends: Sequence[int] | np.ndarray = field(default_factory=list)
    keys: Sequence[bytes] | pa.Array = field(default_factory=list)  # encoding: an Arrow binary array too
    #: None (encoding only): no flags stored
    emitted: Sequence[bool | None] | np.ndarray | None = field(default_factory=list)
    #: None (encoding only): no written rows stored
    written: Sequence[bytes | None] | None = field(default_factory=list)
    #: one column per accumulator (a list, or a NumPy object array)
    accs: Sequence[Sequence[Any] | np.ndarray] = field(default_factory=list)
    deletes: list[tuple[int, bytes]] = field(default_factory=list)
    deleted_before: int | None = None

    def __len__(self) -> int:
        """Operations held: what the compaction rule weighs against twice the state's rows."""
        return len(self.keys) + len(self.deletes) + (self.deleted_before is not None)


def encode_segment(segment: Segment) -> bytes:
    """The blob of ``segment``; its columns may be lists or NumPy arrays (object ones for accumulators).
    NumPy columns go to Arrow without a Python object per value, where their type allows."""
    n, deletes = len(segment.keys), segment.deletes
    before = [] if segment.deleted_before is None else [segment.deleted_before]
    m = len(deletes) + len(before)
    starts = pa.array(segment.starts, pa.int64())
    keys = segment.keys if isinstance(segment.keys, pa.Array) else pa.array(segment.keys, pa.binary())
    if m:  # the deletes' rows after the upserts' (most segments have none: nothing to concatenate)
        starts = pa.concat_arrays([starts, pa.array([start for start, _ in deletes] + before, pa.int64())])
        keys = pa.concat_arrays([keys, pa.array([*(key for _, key in deletes), *(b"" for _ in before)], pa.binary())])
    columns = [pa.array(np.repeat(np.array([UPSERT, DELETE, DELETE_BEFORE], np.int8), [n, len(deletes), len(before)])),
               starts, _then_nulls(_upserts(segment.ends, pa.int64(), n), m), keys,
               _then_nulls(_upserts(segment.emitted, pa.bool_(), n), m),
               _then_nulls(_upserts(segment.written, pa.binary(), n), m)]
    fields = [pa.field(name, kind) for name, kind in _FIXED]
    for i, column in enumerate(segment.accs):
        array, codec = _accumulator_array(column)
        columns.append(_then_nulls(array, m))
        fields.append(pa.field(f"acc{i}", array.type, metadata={b"codec": codec}))
    schema = pa.schema(fields, metadata={b"base": b"1" if segment.base else b"0"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=_WRITE_OPTIONS) as writer:
        writer.write_batch(pa.record_batch(columns, schema=schema))
    return MAGIC + bytes([FORMAT_VERSION]) + sink.getvalue().to_pybytes()


def _upserts(values: Any, kind: pa.DataType, n: int) -> pa.Array:
    """The ``n`` upserts' ``values`` (None or empty: all null)."""
    return pa.nulls(n, kind) if values is None or not len(values) else pa.array(values, kind)


def _then_nulls(upserts: pa.Array, m: int) -> pa.Array:
    """An upserts' column, then the ``m`` deletes' nulls (most segments have no deletes: no concatenation)."""
    return pa.concat_arrays([upserts, pa.nulls(m, upserts.type)]) if m else upserts


def _accumulator_array(values: Sequence[Any] | np.ndarray) -> tuple[pa.Array, bytes]:
    """A typed column when every value is an int in int64 range (or every one a float), nulls for None;
    else each value's msgpack bytes."""
    dtype = getattr(values, "dtype", None)
    if dtype == np.int64:
        return pa.array(values, pa.int64()), _INT
    if dtype == np.float64:
        return pa.array(values, pa.float64(), from_pandas=False), _FLOAT
    if dtype is not None:
        values = values.tolist()  # type: ignore[union-attr]
    present = set(map(type, values))
    types = present - {type(None)}
    if types == {int}:
        try:  # without a None through NumPy: Arrow converts a list of ints three times slower
            return pa.array(np.array(values, dtype=np.int64) if types == present else values, pa.int64()), _INT
        except (pa.ArrowInvalid, OverflowError):  # an int beyond 64 bits
            pass
    elif types == {float}:
        return pa.array(values, pa.float64(), from_pandas=False), _FLOAT
    elif types == {bytes}:  # sketches: their msgpack bytes laid out a column at a time
        return packed_binaries(pa.array(values, pa.binary())), _PACKED
    pack = new_packer().pack
    return pa.array([None if v is None else pack(v) for v in values], pa.binary()), _PACKED


def decode_segment(blob: bytes, where: str) -> Segment:
    """The operations of a segment blob; ``where`` names it in errors (its pipeline, store and seq)."""
    blob = bytes(blob)
    if blob[:len(MAGIC)] != MAGIC or len(blob) <= len(MAGIC):
        raise CorruptState(f"{where} is corrupt: it does not start with the segment header")
    version = blob[len(MAGIC)]
    if version > FORMAT_VERSION:
        raise StateVersionError(f"{where} is of format {version}, newer than this code ({FORMAT_VERSION}); "
                                "upgrade ematix-dagster")
    if version != FORMAT_VERSION:
        raise CorruptState(f"{where} is corrupt: unknown format version {version}")
    try:
        return _decoded(blob[len(MAGIC) + 1:])
    except CorruptState as exc:
        raise CorruptState(f"{where} is corrupt: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - every decoding failure is corruption
        raise CorruptState(f"{where} is corrupt: it does not decode ({failure_reason(exc)})") from None


def _decoded(body: bytes) -> Segment:
    table = pa.ipc.open_stream(pa.py_buffer(body), options=_READ_OPTIONS).read_all()
    table.validate(full=True)
    schema = table.schema
    if [(f.name, f.type) for f in schema][:len(_FIXED)] != _FIXED:
        raise CorruptState("its columns are not op, window_start, window_end, group_key, emitted, written")
    ops = table["op"].to_pylist()
    starts, ends, keys = table["window_start"].to_pylist(), table["window_end"].to_pylist(), table["group_key"].to_pylist()
    if None in starts or None in keys or set(ops) - {UPSERT, DELETE, DELETE_BEFORE}:
        raise CorruptState("an operation has no start, no key or an unknown op")
    n = ops.count(UPSERT)
    if ops[:n] != [UPSERT] * n or ops.count(DELETE_BEFORE) > 1 or (DELETE_BEFORE in ops and ops[-1] != DELETE_BEFORE):
        raise CorruptState("its operations are out of order")
    if None in ends[:n]:
        raise CorruptState("an upsert has no window end")
    accs = []
    for f in list(schema)[len(_FIXED):]:
        codec = (f.metadata or {}).get(b"codec")
        expected = {_INT: pa.int64(), _FLOAT: pa.float64(), _PACKED: pa.binary()}.get(codec or b"")
        if expected != f.type:
            raise CorruptState(f"accumulator column {f.name} has no known codec for its type {f.type}")
        values = table[f.name].slice(0, n).to_pylist()
        accs.append([None if v is None else _unpack(v) for v in values] if codec == _PACKED else values)
    deletes = [(s, k) for op, s, k in zip(ops[n:], starts[n:], keys[n:]) if op == DELETE]
    return Segment(base=(schema.metadata or {}).get(b"base") == b"1", starts=starts[:n], ends=ends[:n],
                   keys=keys[:n], emitted=table["emitted"].slice(0, n).to_pylist(),
                   written=table["written"].slice(0, n).to_pylist(), accs=accs, deletes=deletes,
                   deleted_before=starts[-1] if ops and ops[-1] == DELETE_BEFORE else None)


__all__ = ["DELETE", "DELETE_BEFORE", "FORMAT_VERSION", "MAGIC", "UPSERT", "Segment", "decode_segment",
           "encode_segment"]
