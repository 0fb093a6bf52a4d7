"""The state segment blob (``state_store.segments``) and its replay over rows (``segment_replay``).

Ground truth: the row codec. A value read back from a segment must be exactly (type included: ints
stay ints, NaN and -0.0 survive, Decimals, sets, tuples, sketches) what ``codec.decode_state``
gives for the same accumulators, and a replay must leave the rows a plain dict model of upserts and
deletes leaves.
"""

from __future__ import annotations

import random
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from ematix_dagster.errors import CorruptState, StateVersionError
from state_store import codec
from state_store.contract import PipelineRecord, RecoveredState
from state_store.segment_replay import SegmentFacts, SegmentSizes, replay, replayed
from state_store.segments import FORMAT_VERSION, MAGIC, Segment, decode_segment, encode_segment
from tests.fixtures.state_v1.make_fixtures import CASES
from tests.state_store.test_codec import same


def _columns(rows: list[list]) -> list[list]:
    width = max(map(len, rows))
    return [[row[i] for row in rows] for i in range(width)]


def _upserts(rows: list[list], base: bool = False, **extra) -> Segment:
    n = len(rows)
    return Segment(base=base, starts=list(range(n)), ends=[s + 10 for s in range(n)],
                   keys=[codec.encode_key((i,)) for i in range(n)], accs=_columns(rows), **extra)


def test_every_fixture_value_reads_back_as_the_row_codec_reads_it():
    rows = [accs for _key, accs in CASES.values() if accs]
    width = max(map(len, rows))
    rows = [accs + [None] * (width - len(accs)) for accs in rows]
    got = decode_segment(encode_segment(_upserts(rows)), "here")
    for r, accs in enumerate(rows):
        want = codec.decode_state(codec.encode_state(accs))
        for i, value in enumerate(want):
            assert (got.accs[i][r] == value and type(got.accs[i][r]) is type(value)) if isinstance(value, set) \
                else same(got.accs[i][r], value), (r, i, got.accs[i][r], value)


def test_columns_are_typed_where_every_value_is_an_int_or_a_float():
    rows = [[1, 1.5, True, 2**70, 1, Decimal("1.10"), (1, "x"), {"a"}],
            [None, float("nan"), False, 3, 2.0, None, None, frozenset()],
            [-(2**63), -0.0, None, None, None, Decimal("2"), (2, None), set()]]
    blob = encode_segment(_upserts(rows))
    table = pa.ipc.open_stream(pa.py_buffer(blob[len(MAGIC) + 1:])).read_all()
    assert [(f.type, f.metadata[b"codec"]) for f in table.schema if f.name.startswith("acc")] == [
        (pa.int64(), b"int64"), (pa.float64(), b"float64")] + [(pa.binary(), b"msgpack")] * 6
    got = decode_segment(blob, "here")
    for r, accs in enumerate(rows):
        want = codec.decode_state(codec.encode_state(accs))
        assert all(same(got.accs[i][r], w) or (isinstance(w, set) and got.accs[i][r] == w) for i, w in enumerate(want))
    assert type(got.accs[3][1]) is int and type(got.accs[2][0]) is bool  # bools are never ints


def test_numpy_object_columns_deletes_and_a_range_delete_round_trip():
    accs = [np.array([3, None], dtype=object), np.array([(1, "a"), (2, "b")], dtype=object)]
    segment = Segment(base=True, starts=np.array([5, 6]), ends=np.array([9, 9]), keys=[b"\x01a", b"\x01b"],
                      emitted=np.array([True, False]), written=[b"row", None], accs=accs,
                      deletes=[(1, b"\x01c")], deleted_before=-4)
    got = decode_segment(encode_segment(segment), "here")
    assert (got.base, got.starts, got.ends, got.keys, got.emitted, got.written) == (
        True, [5, 6], [9, 9], [b"\x01a", b"\x01b"], [True, False], [b"row", None])
    assert got.accs == [[3, None], [(1, "a"), (2, "b")]] and got.deletes == [(1, b"\x01c")]
    assert got.deleted_before == -4 and len(got) == 4
    plain = decode_segment(encode_segment(Segment(starts=[1], ends=[1], keys=[b"\x01a"], emitted=None, written=None,
                                                  accs=[[1]])), "here")
    assert plain.emitted == [None] and plain.written == [None] and not plain.base


@pytest.mark.parametrize("blob,error,text", [
    (b"", CorruptState, "does not start with the segment header"),
    (MAGIC, CorruptState, "does not start with the segment header"),
    (b"PAR1" + bytes(20), CorruptState, "does not start with the segment header"),
    (MAGIC + b"\x00", CorruptState, "unknown format version 0"),
    (MAGIC + bytes([FORMAT_VERSION + 1]), StateVersionError, "newer than this code"),
    (MAGIC + bytes([FORMAT_VERSION]) + b"\xff" * 12, CorruptState, "does not decode"),
])
def test_a_blob_that_is_no_segment_is_refused_with_its_reason(blob, error, text):
    with pytest.raises(error, match=f"pipeline 'p', state segment 3 .*{text}"):
        decode_segment(blob, "pipeline 'p', state segment 3")


@pytest.mark.parametrize("column, codec_name", [([1, 2**63 - 1, -(2**63)], b"int64"), ([1, 2**63], b"msgpack"),
                                                ([1, True], b"msgpack"), ([1, None], b"int64")])
def test_an_int_column_is_int64_only_when_every_value_fits(column, codec_name):
    blob = encode_segment(_upserts([[v] for v in column]))
    table = pa.ipc.open_stream(pa.py_buffer(blob[len(MAGIC) + 1:])).read_all()
    assert table.schema.field("acc0").metadata[b"codec"] == codec_name
    got = decode_segment(blob, "here").accs[0]
    assert got == column and list(map(type, got)) == list(map(type, column))


def test_buffers_are_compressed_and_an_uncompressed_blob_reads_the_same():
    rows = [[n, n * 0.5] for n in range(1000)]
    blob = encode_segment(_upserts(rows))
    body = pa.py_buffer(blob[len(MAGIC) + 1:])
    table = pa.ipc.open_stream(body).read_all()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:  # as the first code of format 1 wrote it
        writer.write_table(table)
    plain = sink.getvalue()
    assert len(body) < len(plain) * 0.8
    assert decode_segment(MAGIC + bytes([FORMAT_VERSION]) + plain.to_pybytes(), "here") == decode_segment(blob, "here")


def test_a_segment_whose_columns_lie_is_corrupt():
    other = pa.schema([("op", pa.int8()), ("window_start", pa.int64())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other) as writer:
        writer.write_batch(pa.record_batch([pa.array([0], pa.int8()), pa.array([1])], schema=other))
    with pytest.raises(CorruptState, match="its columns are not op"):
        decode_segment(MAGIC + bytes([FORMAT_VERSION]) + sink.getvalue().to_pybytes(), "here")


def test_replay_leaves_what_a_dict_of_upserts_and_deletes_leaves():
    key = codec.encode_key
    rows = [(0, 10, key(("a",)), codec.encode_state([1])), (20, 30, key(("a",)), codec.encode_state([2])),
            (5, 15, key(("b",)), codec.encode_state([3]))]
    recovered = RecoveredState(record=PipelineRecord("p", codec.STATE_VERSION), groups=rows,
                               emitted={(0, key(("a",))): True}, written={(0, key(("a",))): b"w"})
    base = Segment(base=True, starts=[40], ends=[50], keys=[key(("c",))], emitted=[False], written=[b"wc"],
                   accs=[[4]])
    delta = Segment(starts=[0, 60], ends=[12, 70], keys=[key(("a",)), key(("d",))], emitted=[None, True],
                    written=[None, b"wd"], accs=[[7, 8]], deletes=[(20, key(("a",)))], deleted_before=5)
    recovered.segments = [encode_segment(base), encode_segment(delta)]
    out, sizes = replayed(recovered, "pipeline 'p'")
    model = {(s, k): (e, b) for s, e, k, b in rows}
    model[(40, key(("c",)))] = (50, codec.encode_state([4]))
    del model[(20, key(("a",)))]
    model = {k: v for k, v in model.items() if k[0] >= 5}
    model[(0, key(("a",)))] = (12, codec.encode_state([7]))
    model[(60, key(("d",)))] = (70, codec.encode_state([8]))
    assert sorted(out.groups) == sorted((s, e, k, b) for (s, k), (e, b) in model.items())
    assert out.emitted == {(40, key(("c",))): False, (60, key(("d",))): True}  # a's upsert stored none
    assert out.written == {(40, key(("c",))): b"wc", (60, key(("d",))): b"wd"}
    assert sizes == SegmentSizes(segments=(SegmentFacts(1, 40, None), SegmentFacts(4, 60, 5)), rows=3)
    assert replayed(RecoveredState(record=None), "p")[1].rows == 0


def _applied(model: dict, segment: Segment) -> None:
    """The ground truth replay: a plain dict, each range delete looking at every entry."""
    if segment.deleted_before is not None:
        for at in [at for at in model if at[0] < segment.deleted_before]:
            del model[at]
    for at in segment.deletes:
        model.pop(at, None)
    for i, at in enumerate(zip(segment.starts, segment.keys)):
        model[at] = (segment.ends[i], tuple(column[i] for column in segment.accs), segment.emitted[i],
                     segment.written[i])


def _random_segment(rng: random.Random, model: dict, base: bool = False) -> Segment:
    upserts = {(rng.randrange(-5, 40), codec.encode_key((rng.choice("abcd"),))): rng.randrange(100)
               for _ in range(rng.randrange(6))}
    gone = rng.sample(sorted(model), min(len(model), rng.randrange(3))) + [(rng.randrange(40), b"\x01z")]
    gone += rng.sample(sorted(upserts), min(len(upserts), 1))  # deleted and upserted again in one segment
    starts = [start for start, _ in upserts]
    return Segment(base=base, starts=starts, ends=[start + 10 for start in starts], keys=[k for _, k in upserts],
                   emitted=[rng.choice([True, False, None]) for _ in upserts],
                   written=[rng.choice([b"w", None]) for _ in upserts], accs=[list(upserts.values())],
                   deletes=[] if base else gone,
                   deleted_before=rng.randrange(-5, 45) if not base and rng.random() < 0.6 else None)


@pytest.mark.parametrize("seed", range(12))
def test_replay_of_range_deletes_among_upserts_below_earlier_bounds_leaves_what_a_dict_leaves(seed):
    rng = random.Random(seed)
    live: dict = {}
    if seed % 2:  # rows loaded beside the segments
        _applied(live, _random_segment(rng, {}))
    model = dict(live)
    segments = [_random_segment(rng, model, base=True)]
    _applied(model, segments[0])
    for _ in range(40):
        segments.append(_random_segment(rng, model))
        _applied(model, segments[-1])
    replay(live, [encode_segment(s) for s in segments], "here")
    assert live == model


def test_many_small_deltas_each_with_a_range_delete_restore_the_same_rows():
    key, deltas = codec.encode_key, []
    recovered = RecoveredState(record=PipelineRecord("p", codec.STATE_VERSION),
                               groups=[(s, s + 10, key((k,)), codec.encode_state([s])) for s in range(5) for k in "ab"])
    model = {(s, k): (e, (s,), None, None) for s, e, k, _ in recovered.groups}
    for t in range(5, 400):  # like a fixed window: the newest windows upserted, the closed ones deleted
        deltas.append(Segment(starts=[t, t, t - 1], ends=[t + 10, t + 10, t + 9],
                              keys=[key(("a",)), key(("b",)), key(("a",))], emitted=[None, True, False],
                              written=[None, None, b"w"], accs=[[t, t, t - 1]], deleted_before=t - 3))
    deltas.append(Segment(starts=[0], ends=[10], keys=[key(("late",))], emitted=[None], written=[None], accs=[[7]]))
    for segment in deltas:
        _applied(model, segment)
    recovered.segments = [encode_segment(segment) for segment in deltas]
    out, sizes = replayed(recovered, "pipeline 'p'")
    assert sorted(out.groups) == sorted((s, e, k, codec.encode_state(list(accs))) for (s, k), (e, accs, _, _) in model.items())
    assert out.emitted == {at: f for at, (_, _, f, _) in model.items() if f is not None}
    assert out.written == {at: w for at, (_, _, _, w) in model.items() if w is not None}
    assert (0, key(("late",))) in {(s, k) for s, _, k, _ in out.groups}  # below every earlier bound, upserted after
    assert len(out.groups) == 9  # starts 396 to 399 of a and b, late
    assert sizes.segments == tuple(SegmentFacts(len(s), max(s.starts), s.deleted_before) for s in deltas)


def test_a_column_of_byte_strings_is_stored_as_msgpack_packs_each_one():
    """Sketches are byte strings: their column is laid out a column at a time, and must hold exactly
    msgpack's bytes for each (a bin 8, 16 and 32 header at each size's bounds), a None staying null."""
    import msgpack

    values = [b"", b"x" * 255, None, b"y" * 256, b"z" * 65535, b"w" * 65536, bytes(range(256)) * 3]
    blob = encode_segment(_upserts([[v] for v in values]))
    table = pa.ipc.open_stream(pa.py_buffer(blob[len(MAGIC) + 1:])).read_all()
    assert table.schema.field("acc0").metadata[b"codec"] == b"msgpack"
    assert table["acc0"].to_pylist() == [None if v is None else msgpack.packb(v, use_bin_type=True) for v in values]
    assert decode_segment(blob, "here").accs[0] == values
