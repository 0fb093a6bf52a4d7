"""state_store.codec: canonical group keys, accumulator round trips, versions and migrations."""

from __future__ import annotations

import json
import math
import random
import struct
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import msgpack
import pytest
from datasketches import hll_sketch, hll_union

from ematix_dagster.errors import CorruptState, StateVersionError
from state_store import codec, loaded_groups

FIXTURES = Path(__file__).parent.parent / "fixtures" / "state_v1"
UTC = timezone.utc


def same(a, b) -> bool:
    """Equal and of the same type, recursively; NaN equals NaN and the sign of zero counts."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, Decimal):
        return str(a) == str(b)  # same digits and exponent, not only equal
    if isinstance(a, datetime):
        return a == b and (a.tzinfo is None) == (b.tzinfo is None)
    return a == b


# ---- keys ------------------------------------------------------------------------------------

DISTINCT_VALUES = [
    None, True, False, 0, 1, -1, 1.0, 0.0, -0.0, float("nan"), float("inf"), "1", "", "0", b"1", b"",
    Decimal("1"), Decimal("1.0"), Decimal("1.00"), Decimal("-0"), Decimal("0"), 2**63, 2**64, -(2**63) - 1, 2**200,
    datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 1), date(2024, 1, 1),
    time(12, 30, 1, 5), timedelta(days=1, microseconds=3), "None", "True",
]


def test_key_values_stay_distinct_and_decode_to_the_same_type():
    encoded = [codec.encode_key((v,)) for v in DISTINCT_VALUES]
    assert len(set(encoded)) == len(DISTINCT_VALUES)
    for value, blob in zip(DISTINCT_VALUES, encoded):
        (back,) = codec.decode_key(blob)
        assert same(back, value), (value, back)
    # multi-column keys, and keys that only differ by the type of one column
    keys = [(1, "a"), (1.0, "a"), ("1", "a"), (True, "a"), (None, "a"), (Decimal("1"), "a"), ("a", 1), ()]
    blobs = [codec.encode_key(k) for k in keys]
    assert len(set(blobs)) == len(keys)
    assert all(type(codec.decode_key(b)) is tuple for b in blobs)
    assert all(same(codec.decode_key(b), k) for b, k in zip(blobs, keys))


@pytest.mark.parametrize("keys", [
    [(v,) for v in DISTINCT_VALUES],  # some not plain: key by key
    [(v,) for v in (None, True, 0, -1, 2**63, 2**64, -(2**63) - 1, 2**200, "x", b"y")],  # plain, big ints too
    [(1, "a"), (None, b""), (True, -5), ()],
    [],
])
def test_keys_encoded_at_once_are_the_keys_encoded_one_by_one(keys):
    assert codec.encode_keys(keys) == [codec.encode_key(k) for k in keys]


#: each msgpack int format's bounds (fixints, uint8..64, int8..64)
_INT_FORMAT_BOUNDS = (0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1,
                      -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63))


def test_one_int_keys_laid_out_at_once_are_msgpacks_bytes():
    """Keys of one int64 take NumPy's path (``state_store.msgpack_columns``): every msgpack int format's
    bounds and their neighbours, and random ints of every width, give msgpack's own bytes."""
    rng = random.Random(5)
    values = sorted({v + d for v in _INT_FORMAT_BOUNDS for d in (-1, 0, 1) if -(2**63) <= v + d < 2**63})
    values += [rng.randrange(-(2**bits), 2**bits) for bits in (5, 7, 8, 15, 16, 31, 32, 62, 63) for _ in range(50)]
    keys = [(v,) for v in values]
    assert codec.encode_keys(keys) == [codec.encode_key(k) for k in keys] == [b"\x01" + msgpack.packb([v]) for v in values]
    assert codec.encode_keys([(2**63,), (1,)]) == [codec.encode_key((2**63,)), codec.encode_key((1,))]  # past int64


@pytest.mark.parametrize("keys", [
    [(v,) for v in DISTINCT_VALUES],
    [(1, "a"), (None, b""), (True, -5), ()],
    [],
])
def test_keys_decoded_at_once_are_the_keys_decoded_one_by_one(keys):
    blobs = codec.encode_keys(keys)
    decoded = codec.decode_keys(blobs)
    assert all(type(k) is tuple for k in decoded) and len(decoded) == len(keys)
    assert codec.encode_keys(decoded) == blobs


@pytest.mark.parametrize("bad", [b"", b"\x01", b"\x02\x91\x01", b"\x01\x01", b"\x01\x91\xc1", b"\x01\x91\x91\x01"])
def test_a_bad_key_among_good_ones_is_reported_as_decode_key_reports_it(bad):
    blobs = [codec.encode_key(("a",)), bad, codec.encode_key((1,))]
    with pytest.raises(CorruptState) as one:
        codec.decode_key(bad)
    with pytest.raises(CorruptState) as all_at_once:
        codec.decode_keys(blobs)
    assert str(all_at_once.value) == str(one.value)


def test_keys_are_deterministic_and_canonical():
    key = (7, "x", Decimal("2.50"), datetime(2024, 5, 1, 1, 2, 3, 4, tzinfo=UTC), date(2020, 2, 29), b"\x00", None)
    assert codec.encode_key(key) == codec.encode_key(tuple(key)) == codec.encode_key(list(key))  # type: ignore[arg-type]
    # every NaN is one NaN, whatever its payload bits
    other_nan = struct.unpack(">d", bytes.fromhex("7ff8000000000123"))[0]
    assert math.isnan(other_nan)
    assert codec.encode_key((other_nan,)) == codec.encode_key((float("nan"),))
    # the same instant in another zone is the same key (decoded as UTC)
    plus2 = datetime(2024, 5, 1, 3, 2, 3, 4, tzinfo=timezone(timedelta(hours=2)))
    assert codec.encode_key((plus2,)) == codec.encode_key((datetime(2024, 5, 1, 1, 2, 3, 4, tzinfo=UTC),))
    assert codec.decode_key(codec.encode_key((plus2,)))[0].tzinfo == UTC
    # the key format byte leads
    assert codec.encode_key(()) [0] == codec.KEY_FORMAT


def test_key_bytes_are_stable_across_versions():
    """Keys written by version-1 code must keep finding their rows: the bytes never change."""
    expected = json.loads((FIXTURES / "expected.json").read_text())
    for case, doc in expected.items():
        key = tuple(typed_value(v) for v in doc["key"])
        assert codec.encode_key(key) == (FIXTURES / f"{case}.key.bin").read_bytes(), case


def test_keys_refuse_what_they_cannot_hold():
    for bad in [([1],), ({1},), ({"a": 1},), (object(),), ((1, 2),)]:
        with pytest.raises(TypeError):
            codec.encode_key(bad)


# ---- accumulators ----------------------------------------------------------------------------


def _hll(values, lg_k: int = 12) -> bytes:
    sketch = hll_sketch(lg_k)
    for v in values:
        sketch.update(v)
    return sketch.serialize_compact()


def test_every_accumulator_type_round_trips():
    hll = _hll([f"v{i}" for i in range(1000)])
    accs = [
        None, 0, 42, -(2**63), 2**63 - 1, 2**63, 2**64, -(2**64) - 5, 10**40,  # counts and exact integer sums
        2.5, float("nan"), float("-inf"), -0.0,  # float sums, min/max
        Decimal("12.340"), Decimal("-1E+3"), Decimal("NaN"),  # decimal sums
        "text", "", b"\x00\x01", True, False,  # min/max of strings, binary, booleans
        datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, 59, 999999), date(1, 1, 1),
        date(9999, 12, 31), time(23, 59, 59, 999999), timedelta(microseconds=-1),
        (1_700_000_000_000_000, "first"), (1_700_000_000_000_001, datetime(2024, 1, 1, tzinfo=UTC)),  # first/last
        (-1, None), (5, Decimal("1.5")), (6, b"raw"), (7, float("nan")),
        (10.5, 3), (0.0, 0),  # avg
        hll,  # approximate count_distinct
        {"a", "b", ""}, {1, 2, 3, 2**40, -7}, set(),  # exact count_distinct
    ]
    blob = codec.encode_state(accs)
    assert blob[0] == codec.STATE_VERSION
    back = codec.decode_state(blob)
    assert type(back) is list and len(back) == len(accs)
    for original, decoded in zip(accs, back):
        if isinstance(original, set):
            assert type(decoded) is set and decoded == original
        else:
            assert same(decoded, original), (original, decoded)
    # the HLL sketch still works after the round trip
    union = hll_union(12)
    union.update(hll_sketch.deserialize(back[accs.index(hll)]))
    assert round(union.get_result().get_estimate()) == round(hll_sketch.deserialize(hll).get_estimate())
    assert codec.decode_state(codec.encode_state([])) == []


def test_state_bytes_are_deterministic_for_sets():
    values = [f"value-{i}" for i in range(50)]
    a = codec.encode_state([set(values), frozenset(reversed(values))])
    b = codec.encode_state([set(reversed(values)), set(values)])
    assert a == b


def test_state_refuses_lists_and_unknown_types():
    with pytest.raises(TypeError):
        codec.encode_state([[1, 2]])
    with pytest.raises(TypeError):
        codec.encode_state([object()])
    with pytest.raises(TypeError):
        codec.encode_state([time(1, tzinfo=UTC)])


def test_held_rows_keep_lists_maps_and_structs_as_values():
    """A held row's values (Arrow's to_pylist) are not accumulators: lists and dicts are values, and the
    row format byte is stable (rows held by an older version still leave)."""
    values = [1, "x", None, [1, None, 3], {"n": 1, "at": datetime(2026, 1, 1, tzinfo=UTC)}, [("k", Decimal("2.5"))]]
    blob = codec.encode_row(values)
    assert blob[0] == codec.ROW_FORMAT == 2
    assert codec.decode_row(blob) == [1, "x", None, (1, None, 3), {"n": 1, "at": datetime(2026, 1, 1, tzinfo=UTC)},
                                      (("k", Decimal("2.5")),)]
    for corrupt in (b"", b"\x01" + blob[1:], blob[:-3], codec.encode_row([1])[:1] + msgpack.packb(7)):
        with pytest.raises(CorruptState, match="held row is corrupt"):
            codec.decode_row(corrupt)


# ---- versions ----------------------------------------------------------------------------------


def test_newer_state_version_is_refused():
    newer = bytes([codec.STATE_VERSION + 1]) + codec.encode_state([1])[1:]
    with pytest.raises(StateVersionError) as err:
        codec.decode_state(newer)
    assert str(err.value) == (f"state version {codec.STATE_VERSION + 1} is newer than this code "
                              f"({codec.STATE_VERSION}); upgrade ematix-dagster")
    with pytest.raises(StateVersionError, match="newer than this code"):
        codec.migrate(newer, codec.STATE_VERSION + 1, codec.STATE_VERSION)
    with pytest.raises(StateVersionError):
        codec.migrate((FIXTURES / "counts.state.bin").read_bytes(), 1, codec.STATE_VERSION + 1)
    with pytest.raises(StateVersionError, match="forward only"):
        codec.migrate(codec.encode_state([1]), codec.STATE_VERSION, 1)


def test_unsupported_migration_is_refused(monkeypatch):
    monkeypatch.delitem(codec._MIGRATIONS, 1)
    with pytest.raises(StateVersionError, match="cannot be migrated.*unsupported"):
        codec.decode_state((FIXTURES / "counts.state.bin").read_bytes())


def typed_value(doc):
    """The value a fixture's JSON describes, built without the codec."""
    kind, payload = doc
    return {
        "none": lambda: None,
        "bool": lambda: bool(payload),
        "int": lambda: int(payload),
        "float": lambda: float(payload),
        "decimal": lambda: Decimal(payload),
        "str": lambda: payload,
        "bytes": lambda: bytes.fromhex(payload),
        "timestamp": lambda: datetime.fromisoformat(payload).astimezone(UTC),
        "timestamp_ntz": lambda: datetime.fromisoformat(payload),
        "date": lambda: date.fromisoformat(payload),
        "tuple": lambda: tuple(typed_value(x) for x in payload),
        "set": lambda: {typed_value(x) for x in payload},
    }[kind]()


def test_version_1_fixtures_migrate_to_the_expected_values():
    expected = json.loads((FIXTURES / "expected.json").read_text())
    assert codec.STATE_VERSION == 2
    kinds_seen: set[str] = set()
    for case, doc in expected.items():
        blob = (FIXTURES / f"{case}.state.bin").read_bytes()
        assert blob[0] == 1, f"{case} must stay a committed version-1 blob"
        migrated = codec.migrate(blob, 1, codec.STATE_VERSION)
        assert migrated[0] == codec.STATE_VERSION
        want = [typed_value(v) for v in doc["state"]]
        for got in (codec.decode_state(migrated), codec.decode_state(blob)):  # explicit, and on the fly
            assert len(got) == len(want), case
            for g, w in zip(got, want):
                assert (type(g) is set and g == w) if isinstance(w, set) else same(g, w), (case, g, w)
        assert codec.migrate(migrated, codec.STATE_VERSION, codec.STATE_VERSION) == migrated
        assert len(migrated) <= len(blob)
        kinds_seen |= {v[0] for v in doc["state"]}
        kinds_seen |= {x[0] for v in doc["state"] if v[0] in ("tuple", "set") for x in v[1]}
    assert kinds_seen >= {"none", "bool", "int", "float", "decimal", "str", "bytes", "timestamp", "timestamp_ntz",
                          "date", "tuple", "set"}
    hll = codec.decode_state(codec.migrate((FIXTURES / "hll.state.bin").read_bytes(), 1))[0]
    assert 100 <= hll_sketch.deserialize(hll).get_estimate() <= 110


# ---- corruption ----------------------------------------------------------------------------------


@pytest.mark.parametrize("blob", [
    b"", b"\x00", b"\x00\x90", b"\xff\x90", b"\x80", bytes([codec.STATE_VERSION]),
    bytes([codec.STATE_VERSION]) + b"\xc1", bytes([codec.STATE_VERSION]) + b"\x93\x01",  # truncated array
    bytes([codec.STATE_VERSION]) + b"\x81\x01\x02",  # a map, not a list
    bytes([codec.STATE_VERSION]) + msgpack.packb([msgpack.ExtType(99, b"x")]),  # unknown extension type
    bytes([codec.STATE_VERSION]) + msgpack.packb([1]) + b"\x01",  # trailing bytes
    b"\x01\x91\x92\xa3int\xa1x",  # version 1 with a bad int payload
    b"\x01\xc1",
])
def test_corrupt_state_is_refused(blob):
    with pytest.raises(CorruptState):
        codec.decode_state(blob)


@pytest.mark.parametrize("blob", [b"", b"\x02\x90", b"\x01", b"\x01\xc1", b"\x01\x91\x91\x01", b"\x01\x01"])
def test_corrupt_keys_are_refused(blob):
    with pytest.raises(CorruptState):
        codec.decode_key(blob)


def test_decode_groups_names_the_pipeline():
    good = (0, 60, codec.encode_key(("a",)), codec.encode_state([1]))
    windows = loaded_groups.decode_groups("clicks", [good, (60, 120, codec.encode_key(("b",)), codec.encode_state([2]))])
    assert windows == {0: {("a",): [1]}, 60: {("b",): [2]}}
    with pytest.raises(CorruptState, match="pipeline 'clicks' in the store.*window 60.*'b'"):
        loaded_groups.decode_groups("clicks", [good, (60, 120, codec.encode_key(("b",)), b"\x02\xc1")], "the store")
    with pytest.raises(CorruptState, match="pipeline 'clicks'.*window 0"):
        loaded_groups.decode_groups("clicks", [(0, 60, b"\x07", codec.encode_state([1]))])
