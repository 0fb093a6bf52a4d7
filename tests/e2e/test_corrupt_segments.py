"""A stored state segment (schema step 8) that does not decode, or holds state of the wrong shape, is
reported by ``ematix-dagster check`` with its reason, as a row's blob is (test_corrupt_state.py)."""

from __future__ import annotations

import pytest

from ematix_dagster.cli import main
from ematix_dagster.operations import check, migrate, summary
from state_store.codec import encode_key
from state_store.contract import BatchCommit
from state_store.segments import FORMAT_VERSION, MAGIC, Segment, encode_segment
from tests.e2e.corrupt_state_setup import (  # noqa: F401 - setup_fixture is the setup fixture
    PIPELINE,
    S,
    Setup,
    _toml,
    _valid_accs,
    setup_fixture,
)


def _segment(accs: list) -> bytes:
    """One upsert of group ("b") in the second window, accumulators ``accs``."""
    return encode_segment(Segment(base=False, starts=[60 * S], ends=[120 * S], keys=[encode_key(("b",))],
                                  emitted=None, written=None, accs=[[a] for a in accs]))


GOOD = _segment(_valid_accs())
DAMAGED = [  # (case id, the segment stored, fragments of the problem's message)
    ("header", b"not a segment at all", ["state segment 1 is corrupt", "does not start with the segment header"]),
    ("arrow-garbage", MAGIC + bytes([FORMAT_VERSION]) + b"\x00\x01garbage", ["state segment 1 is corrupt", "does not decode"]),
    ("truncated", GOOD[:-40], ["state segment 1 is corrupt", "does not decode"]),
    ("unknown-version", MAGIC + b"\x00" + GOOD[len(MAGIC) + 1:], ["state segment 1 is corrupt", "unknown format version 0"]),
    ("count-is-text", _segment(["3", *_valid_accs()[1:]]), ["('b',)", "'n' (count)"]),
    ("accumulator-missing", _segment(_valid_accs()[:-1]), ["('b',)", "7 accumulators"]),
]


def _store_segment(setup: Setup, blob: bytes) -> None:
    store = setup.store()
    record = store.load(PIPELINE, groups=False).record
    store.commit(BatchCommit(record=record, segments=[GOOD, blob] if blob is not GOOD else [GOOD]))


def test_a_valid_segment_is_healthy_and_counted(setup):
    setup.write()  # three rows: ("a") in the first window, ("b") and ("c") in the second
    _store_segment(setup, GOOD)  # ("b") in the second window again, and ("d") in a third
    store = setup.store()
    record = store.load(PIPELINE, groups=False).record
    store.commit(BatchCommit(record=record, segments=[encode_segment(Segment(
        starts=[120 * S], ends=[180 * S], keys=[encode_key(("d",))], emitted=None, written=None,
        accs=[[a] for a in _valid_accs()]))]))
    assert check(setup.spec).healthy
    held = summary(setup.spec)  # what `ematix-dagster state` prints: the rows the segments stand for
    assert (held["groups"], held["open_windows"], held["windows"]) == (4, 3, {0: 1, 60 * S: 2, 120 * S: 1})
    assert migrate(setup.spec, dry_run=True) == ["all 4 state blobs are at version 2"]


@pytest.mark.parametrize("blob,fragments", [pytest.param(b, f, id=i) for i, b, f in DAMAGED])
def test_check_reports_a_corrupt_segment_with_its_reason(setup, blob, fragments, capsys):
    setup.write()
    _store_segment(setup, blob)
    report = check(setup.spec)
    assert [p.code for p in report.problems] == ["corrupt_state"], [str(p) for p in report.problems]
    message = report.problems[0].message
    assert PIPELINE in message and all(f in message for f in fragments), message
    toml = setup.tmp / "pipeline.toml"
    toml.write_text(_toml(setup.tmp, setup.state_store))
    assert main(["check", str(toml)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("problem corrupt_state: ") and "()" not in lines[1], lines[1]


def test_a_segment_of_a_newer_format_is_refused_as_too_new(setup):
    setup.write()
    _store_segment(setup, MAGIC + bytes([FORMAT_VERSION + 1]) + GOOD[len(MAGIC) + 1:])
    problems = check(setup.spec).problems
    assert [p.code for p in problems] == ["state_too_new"] and "state segment 1 is of format 2, newer than this code" in problems[0].message
