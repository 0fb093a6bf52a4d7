"""``[transform.window] emit_trigger`` and ``[target] retractions`` in the spec (docs/contract/emission.md): every
spelling loads, round-trips and is built by the facade alike; a trigger built by hand is checked as a parsed one.
The refusals of TOML values are rows of tests/spec/test_config_errors.py and tests/spec/test_type_checks.py.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from typing import Any

import pytest

import ematix_dagster
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import EmitTrigger, Target, Window, dump_pipeline, load_pipeline_str
from tests.spec.toml_samples import DELETE, W, assert_names, mutated_toml, python_spec

ET = f"{W}.emit_trigger"
SESSION = {f"{W}.kind": "session", f"{W}.duration_ms": DELETE, f"{W}.gap_ms": 30_000,
           f"{W}.max_session_duration_ms": 3_600_000}
HOPPING = {f"{W}.kind": "hopping", f"{W}.hop_ms": 30_000}

# TOML value -> the trigger it names
SPELLINGS: list[tuple[Any, EmitTrigger]] = [
    ("watermark", EmitTrigger()),
    ("every_batch", EmitTrigger(kind="every_batch")),
    ({"interval_ms": 5_000}, EmitTrigger(kind="interval", interval_ms=5_000)),
    ({"count": 100}, EmitTrigger(kind="count", count=100)),
]


@pytest.mark.parametrize("kind", [{}, HOPPING, SESSION], ids=["tumbling", "hopping", "session"])
@pytest.mark.parametrize(("value", "trigger"), SPELLINGS, ids=[t.kind for _, t in SPELLINGS])
def test_every_spelling_loads_and_round_trips(kind: dict[str, Any], value: Any, trigger: EmitTrigger) -> None:
    spec = load_pipeline_str(mutated_toml({**kind, ET: value}))
    assert spec.window.emit_trigger == trigger
    text = dump_pipeline(spec)
    assert load_pipeline_str(text) == spec
    window = tomllib.loads(text)["transform"]["window"]
    if trigger.fires_early:
        assert window["emit_trigger"] == value
    else:  # the default is left out of dumps
        assert "emit_trigger" not in window


def test_sliding_windows_take_the_watermark_trigger() -> None:
    sliding = {f"{W}.kind": "sliding", f"{W}.max_events_per_group": 10}
    assert load_pipeline_str(mutated_toml({**sliding, ET: "watermark"})).window.emit_trigger == EmitTrigger()


@pytest.mark.parametrize(("value", "trigger"), SPELLINGS, ids=[t.kind for _, t in SPELLINGS])
def test_the_facade_takes_every_spelling_and_the_trigger_itself(value: Any, trigger: EmitTrigger) -> None:
    base = python_spec()
    for given in (value, trigger):
        window = replace(base.window, emit_trigger=given)  # Window(..., emit_trigger=given)
        assert window.emit_trigger == trigger
        spec = replace(base, shape=window).validate()
        assert load_pipeline_str(dump_pipeline(spec)) == spec


def test_emit_trigger_is_exported_beside_window() -> None:
    assert ematix_dagster.EmitTrigger is EmitTrigger
    assert "EmitTrigger" in ematix_dagster.__all__ and "EmitTrigger" in ematix_dagster.spec.__all__


def test_the_facade_refuses_an_unknown_spelling_when_the_window_is_built() -> None:
    with pytest.raises(PipelineConfigError) as info:
        Window(kind="tumbling", duration_ms=1_000, max_groups_per_window=10, aggregations=(), emit_trigger="often")
    assert_names(info.value, ET, "'often'", '"every_batch"')


HAND_BUILT = [  # (trigger, the key named, words in the message)
    (EmitTrigger(kind="early"), ET, ("unknown trigger kind 'early'", "{ count = N }")),
    (EmitTrigger(kind="count"), f"{ET}.count", ("is required for the 'count' trigger",)),
    (EmitTrigger(kind="interval"), f"{ET}.interval_ms", ("is required for the 'interval' trigger",)),
    (EmitTrigger(kind="count", count=0), f"{ET}.count", ("0 must be a positive integer",)),
    (EmitTrigger(kind="every_batch", count=5), f"{ET}.count", ("count = 5 does not apply to the 'every_batch' trigger",)),
    (EmitTrigger(kind="count", count=5, interval_ms=10), f"{ET}.interval_ms", ("does not apply to the 'count' trigger",)),
    (EmitTrigger(kind="count", count="5"), f"{ET}.count", ("'5'", "not an integer")),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("trigger", "key", "words"), HAND_BUILT, ids=[repr(t) for t, *_ in HAND_BUILT])
def test_a_trigger_built_by_hand_is_checked(trigger: EmitTrigger, key: str, words: tuple[str, ...]) -> None:
    base = python_spec()
    with pytest.raises(PipelineConfigError) as info:
        replace(base, shape=replace(base.window, emit_trigger=trigger)).validate()
    assert_names(info.value, key, *words)


@pytest.mark.parametrize("target", [{"kind": "console"}, {"kind": "parquet", "path": "data/out"}])
def test_retractions_load_and_round_trip_on_append_targets(target: dict[str, Any]) -> None:
    spec = load_pipeline_str(mutated_toml({"target": {**target, "retractions": True}, ET: "every_batch"}))
    assert spec.target == Target(**target, retractions=True)
    assert tomllib.loads(dump_pipeline(spec))["target"]["retractions"] is True
    assert load_pipeline_str(dump_pipeline(spec)) == spec
    assert "retractions" not in tomllib.loads(dump_pipeline(replace(spec, target=Target(**target))))["target"]
