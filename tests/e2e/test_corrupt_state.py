"""Corrupt state ends as terminal ``EmatixError``s that name the cause, never as raw tracebacks.

A real pipeline's state is written with the real store (SQLite and PostgreSQL, tests/e2e/corrupt_state_setup.py),
damaged with plain SQL, and then loaded the way a run restores it (``store.load`` -> ``loaded_groups.decode_groups``
-> ``Engine.restore``) and the way ``ematix-dagster check`` inspects it. Each case asserts the error class,
``terminal is True`` and that the message names what is wrong and where (pipeline, store, window and group, column).
No Spark is started.
"""

from __future__ import annotations

import pytest

from ematix_dagster.cli import main
from ematix_dagster.errors import CorruptState
from ematix_dagster.operations import check
from ematix_dagster.spec import PipelineSpec, load_pipeline_str
from ematix_dagster.streaming.micro_batch import BatchInput, SourceStats
from state_store.codec import STATE_VERSION, encode_state
from tests.e2e.corrupt_state_setup import (  # noqa: F401 - setup_fixture is the setup fixture
    KINDS,
    PIPELINE,
    TARGET_WINDOW,
    S,
    Setup,
    _assert_names_target,
    _sketch,
    _terminal,
    _toml,
    _valid_accs,
    _with,
    setup_fixture,
)

# ---- 1. well-formed but wrongly shaped blobs, restored as a run restores them -------------------


SHAPES = [  # (case id, accumulators stored for TARGET, fragments the message must contain)
    ("count-is-text", _with(0, "3"), ["'n' (count)", "str '3'"]),
    ("count-is-bool", _with(0, True), ["'n' (count)", "bool True"]),
    ("integer-sum-is-float", _with(1, 4.5), ["'total' (sum)", "integer sum"]),
    ("avg-triple", _with(2, (7.5, 3, 1)), ["'mean' (avg)", "(7.5, 3, 1)"]),
    ("avg-single", _with(2, (7.5,)), ["'mean' (avg)", "(7.5,)"]),
    ("avg-count-is-text", _with(2, (7.5, "3")), ["'mean' (avg)"]),
    ("avg-is-float", _with(2, 2.5), ["'mean' (avg)", "float 2.5"]),
    ("first-single", _with(3, (5 * S,)), ["'first_page' (first)", "pair"]),
    ("first-time-is-text", _with(3, ("5", "home")), ["'first_page' (first)"]),
    ("last-value-is-pair", _with(4, (59 * S, (1, 2))), ["'last_page' (last)"]),
    ("last-is-set", _with(4, {"cart"}), ["'last_page' (last)", "set"]),
    ("max-is-tuple", _with(5, (1, 2)), ["'top' (max)", "tuple"]),
    ("exact-distinct-is-int", _with(6, 2), ["'pages' (count_distinct)", "set of distinct values"]),
    ("hll-is-text", _with(7, "sketch"), ["'approx_pages' (count_distinct)", "HLL sketch (bytes)"]),
    ("hll-is-garbage-bytes", _with(7, b"not a sketch at all"), ["'approx_pages' (count_distinct)", "HLL"]),
    ("hll-is-short", _with(7, b"\x02\x01"), ["'approx_pages' (count_distinct)", "HLL"]),
    ("hll-other-precision", _with(7, _sketch(lg_k=10)), ["'approx_pages' (count_distinct)", "lg_k 10"]),
    ("one-accumulator-missing", _valid_accs()[:-1], ["7 accumulators", "8 aggregations"]),
    ("one-accumulator-too-many", _valid_accs() + [1], ["9 accumulators", "8 aggregations"]),
    ("no-accumulators", [], ["0 accumulators"]),
]


@pytest.mark.parametrize("accs,fragments", [pytest.param(a, f, id=i) for i, a, f in SHAPES])
def test_restore_refuses_wrongly_shaped_state(setup, accs, fragments):
    setup.write()
    assert setup.restore().state.group_count == 3  # the valid state restores
    setup.set_accs(accs)
    with pytest.raises(CorruptState) as info:
        setup.restore()
    _assert_names_target(_terminal(info.value), setup, *fragments)


def test_restore_refuses_a_key_of_another_width(setup):
    setup.write()
    setup.set_key(("b", "extra"))
    with pytest.raises(CorruptState) as info:
        setup.restore()
    text = _terminal(info.value)
    assert repr(PIPELINE) in text and setup.store().description in text and TARGET_WINDOW in text
    assert "('b', 'extra')" in text and "group_by column ['k']" in text


def test_valid_state_restores_and_continues(setup):
    """The shapes the engine writes pass (sets for exact distinct, None, empty sketches) and still merge."""
    setup.write()
    engine = setup.restore()
    assert engine.state.groups[60 * S][("c",)][1:7] == [None] * 6
    assert engine.state.groups[0][("a",)][6] == {"home", "cart"}
    engine.process(BatchInput(batch_id=1, batch_time=2_000 * S, sources={"a": SourceStats(rows=1)},
                              starts=[60 * S], keys=[("b",)],
                              partials=[[1], [1], [(1.0, 1)], [(61 * S, "a")], [(61 * S, "z")], [1], [["p"]],
                                        [_sketch(values=5)]]))
    assert engine.state.groups[60 * S][("b",)][0] == 4


def test_a_truncated_sketch_fails_terminally_when_it_is_merged(setup):
    """The restore looks at sketch headers only (cheap); a sketch cut short fails when opened, naming its group."""
    setup.write()
    setup.set_accs(_with(7, _sketch(values=3)[:-2]))
    engine = setup.restore()
    with pytest.raises(CorruptState) as info:
        engine.process(BatchInput(batch_id=1, batch_time=2_000 * S, sources={"a": SourceStats(rows=1)},
                                  starts=[60 * S], keys=[("b",)],
                                  partials=[[1], [1], [(1.0, 1)], [(61 * S, "a")], [(61 * S, "z")], [1], [["p"]],
                                            [_sketch(values=5)]]))
    text = _terminal(info.value)
    assert "HLL sketch is corrupt" in text and "approx_pages" in text and "('b',)" in text and PIPELINE in text


# ---- 2. ematix-dagster check decodes and vets every blob ----------------------------------------

def _codes(spec: PipelineSpec) -> list[str]:
    return [p.code for p in check(spec).problems]


def _corrupt_state_problem(spec: PipelineSpec):
    report = check(spec)
    assert [p.code for p in report.problems] == ["corrupt_state"], [str(p) for p in report.problems]
    problem = report.problems[0]
    assert "backup" in problem.fix and "ematix-dagster reset PIPELINE.toml --yes" in problem.fix
    assert not report.healthy
    return problem


CHECKED = [  # (case id, how TARGET's row is damaged, fragments of the problem's message)
    ("count-is-text", lambda s: s.set_accs(_with(0, "3")), [TARGET_WINDOW, "('b',)", "'n' (count)"]),
    ("avg-triple", lambda s: s.set_accs(_with(2, (7.5, 3, 1))), ["('b',)", "'mean' (avg)"]),
    ("hll-garbage", lambda s: s.set_accs(_with(7, b"not a sketch at all")), ["('b',)", "approx_pages"]),
    ("hll-truncated", lambda s: s.set_accs(_with(7, _sketch(values=3)[:-2])),
     ["('b',)", "approx_pages", "not a DataSketches HLL sketch image"]),
    ("accumulator-missing", lambda s: s.set_accs(_valid_accs()[:-1]), ["('b',)", "7 accumulators"]),
    ("blob-does-not-decode", lambda s: s.set_blob(bytes([STATE_VERSION]) + b"\xc1\xc1"),
     ["window 60000000", "('b',)", "does not decode"]),
    ("blob-version-byte", lambda s: s.set_blob(b"\x00garbage"), ["window 60000000", "no valid version byte"]),
    ("counters-not-json", lambda s: s.set_column("counters", '["rows", 3]'), ["'counters'"]),
    ("key-does-not-decode", lambda s: s.set_key_bytes(b"\x01\xc1"),
     ["window 60000000", "group key is corrupt", "(01c1) does not decode (a byte that starts no msgpack value)"]),
    ("blob-extra-bytes", lambda s: s.set_blob(encode_state(_valid_accs()) + b"\x01\x02"),
     ["('b',)", "does not decode (2 bytes follow the value)"]),
]


@pytest.mark.parametrize("damage,fragments", [pytest.param(d, f, id=i) for i, d, f in CHECKED])
def test_check_reports_corrupt_state(setup, damage, fragments):
    setup.write()
    report = check(setup.spec)
    assert report.healthy, [str(p) for p in report.problems]
    damage(setup)
    problem = _corrupt_state_problem(setup.spec)
    assert PIPELINE in problem.message
    for fragment in fragments:
        assert fragment in problem.message, problem.message


@pytest.mark.parametrize("case,damage", [pytest.param(i, d, id=i) for i, d, _ in CHECKED])
def test_the_check_command_states_the_batch_and_every_reason(setup, case, damage, capsys):
    """The first line says where the state stands (batch 0 was written; its record unreadable when the
    pipelines row itself is damaged), never "no state yet" for state that is there but corrupt; each
    problem gives its reason (no empty parentheses)."""
    setup.write()
    damage(setup)
    toml = setup.tmp / "pipeline.toml"
    toml.write_text(_toml(setup.tmp, setup.state_store))
    assert main(["check", str(toml)]) == 1
    lines = capsys.readouterr().out.splitlines()
    where = "stored state unreadable" if case == "counters-not-json" else "batch 0"
    assert lines[0].startswith(f"pipeline {PIPELINE}: ") and f", {where}, lease free" in lines[0], lines[0]
    assert lines[1].startswith("problem corrupt_state: ") and "()" not in lines[1], lines[1]


def test_check_does_not_call_state_of_another_window_shape_corrupt(setup):
    """A changed spec is fingerprint_changed; its aggregations are not held against the stored blobs."""
    setup.write()
    changed = load_pipeline_str(_toml(setup.tmp, setup.state_store, hll_precision=14))
    assert _codes(changed) == ["fingerprint_changed"]  # the stored sketches have lg_k 12, not 14
    setup.set_accs(_with(0, "3"))
    assert _codes(setup.spec) == ["corrupt_state"]


# ---- 3. the pipelines row: JSON columns -----------------------------------------------------------

ROWS = [  # (case id, column, stored text, kinds, fragment)
    ("counters-invalid-json", "counters", "{not json", ["sqlite"], "not valid JSON"),
    ("counters-truncated", "counters", '{"rows": 3', ["sqlite"], "not valid JSON"),
    ("counters-array", "counters", "[1, 2]", KINDS, "JSON object"),
    ("counters-text-value", "counters", '{"rows_consumed:a": "many"}', KINDS, "not an integer"),
    ("counters-string", "counters", '"rows"', KINDS, "counters"),
    ("sources-invalid-json", "sources", "[[", ["sqlite"], "not valid JSON"),
    ("sources-object", "sources", '{"a": 1}', KINDS, "JSON array"),
    ("sources-short-entry", "sources", '[["a", 1]]', KINDS, "source name"),
    ("sources-text-time", "sources", '[["a", "soon", null]]', KINDS, "source name"),
    ("fingerprint-doc-array", "fingerprint_doc", "[1]", KINDS, "JSON object"),
]


@pytest.mark.parametrize("kind_,column,text,fragment", [
    pytest.param(kind, column, text, fragment, id=f"{kind}-{case}")
    for case, column, text, kinds, fragment in ROWS for kind in kinds])
def test_pipelines_row_with_bad_json_is_corrupt_state(kind_, column, text, fragment, tmp_path, request):
    setup = Setup(kind_, tmp_path, request)
    try:
        setup.write()
        setup.set_column(column, text)
        with pytest.raises(CorruptState) as info:
            setup.store().load(PIPELINE, groups=False)
        message = _terminal(info.value)
        assert repr(PIPELINE) in message and setup.store().description in message, message
        assert f"column {column!r}" in message and fragment in message, message
        assert "reset PIPELINE.toml --yes" in message
    finally:
        setup.close()
