"""``IntKeyColumn``: one integer group-by column handed along as the column reads exactly as the
list of one-element key tuples it stands for, and encodes to the same bytes (``codec.encode_key``)."""

from __future__ import annotations

import msgpack
import numpy as np
import pyarrow as pa
import pytest

from state_store import codec
from state_store.int_key_column import IntKeyColumn, chained, taken

EDGES = [-2**63, -2**63 + 1, -2**31 - 1, -129, -33, -32, -1, 0, 1, 127, 128, 255, 256, 65535, 65536, 2**32,
         2**63 - 1]


def test_it_reads_as_the_tuples_it_stands_for() -> None:
    rng = np.random.default_rng(3)
    values = [*EDGES, *rng.integers(-2**63, 2**63 - 1, 200, dtype=np.int64, endpoint=True).tolist()]
    column, tuples = IntKeyColumn(np.array(values, dtype=np.int64)), [(v,) for v in values]
    assert len(column) == len(tuples) and list(column) == tuples
    assert all(type(key[0]) is int for key in column)
    assert [column[i] for i in range(len(values))] == tuples and column[-1] == tuples[-1]
    assert list(column[3:40:2]) == tuples[3:40:2]
    rows = rng.permutation(len(values))[:50].tolist()
    assert list(taken(column, rows)) == [tuples[r] for r in rows] == taken(tuples, rows)
    assert list(chained([], column)) == tuples and chained(column, [("x",)]) == [*tuples, ("x",)]
    assert chained(tuples[:1], column[1:]) == tuples


def test_it_encodes_to_the_bytes_of_the_tuples() -> None:
    values = np.array([*EDGES, 5, 5, -5], dtype=np.int64)
    column, tuples = IntKeyColumn(values), [(int(v),) for v in values]
    want = [codec.encode_key(key) for key in tuples]
    assert want == [bytes([codec.KEY_FORMAT]) + msgpack.packb([int(v)]) for v in values]  # msgpack's own bytes
    assert codec.encode_keys(column) == codec.encode_keys(tuples) == want
    assert codec.encoded_key_array(column).to_pylist() == codec.encoded_key_array(tuples).to_pylist() == want
    assert codec.decode_keys(want) == tuples


@pytest.mark.parametrize("array,column", [
    (pa.array([3, -1, 2**62], pa.int64()), [3, -1, 2**62]),
    (pa.chunked_array([pa.array([1, 2], pa.int32()), pa.array([-2**31], pa.int32())]), [1, 2, -2**31]),
    (pa.array([7], pa.int8()), [7]),
    (pa.array([1, None], pa.int64()), None),  # a NULL key is (None,): the keys stay tuples
    (pa.array([1], pa.uint64()), None),  # past int64
    (pa.array([True], pa.bool_()), None),  # bool keys stay bool
    (pa.array(["a"]), None),
    (pa.array([1.0]), None),
])
def test_only_signed_integer_columns_without_a_null_become_one(array: pa.Array, column: list[int] | None) -> None:
    got = IntKeyColumn.of_arrow(array)
    if column is None:
        assert got is None
    else:
        assert got is not None and got.ids.dtype == np.int64 and got.ids.tolist() == column
        assert list(got) == [(v,) for v in array.to_pylist()]
