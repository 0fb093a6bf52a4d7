"""Row pipelines' spec (docs/contract/row-pipelines.md): a pipeline without ``[transform.window]`` writes
its SQL's rows; its watermark keys and ``max_buffered_rows`` live in ``[transform]``; ``WATERMARK_TS()`` is read at
load time; ``[target] key`` upserts on postgres. Each refusal names its key and says why and how to fix it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ematix_dagster import streaming_pipeline
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import (
    RowTransform,
    Run,
    Source,
    StateStoreConfig,
    Target,
    dump_pipeline,
    load_pipeline_str,
)
from tests.spec.toml_samples import (
    DELETE,
    FULL_TOML,
    PG_TARGET,
    ROW_TOML,
    assert_names,
    load_error,
    mutated_toml,
    python_spec,
)

T = "transform"
NO_CAP = {f"{T}.max_buffered_rows": DELETE}  # a SQL without WATERMARK_TS() takes no cap
PLAIN_SQL = "SELECT user_id, amount, page, _event_ts FROM source WHERE amount >= 0"


def _row(changes: dict[str, Any]) -> str:
    return mutated_toml(changes, ROW_TOML)


def _where(predicate: str, select: str = "user_id, page, _event_ts") -> dict[str, Any]:
    return {f"{T}.sql": f"SELECT {select} FROM source WHERE {predicate}"}


# ---------------------------------------------------------------------------------------------
# Loading, round trips, the facade


def test_the_row_sample_loads_with_every_value() -> None:
    spec = load_pipeline_str(ROW_TOML)
    assert spec.is_row_pipeline and spec.window_spec is None
    assert spec.rows == RowTransform(lateness_ms=10_000, source_idleness_ms=30_000, max_buffered_rows=100_000)
    assert spec.target.key == ("user_id", "page")
    assert spec.run.end_of_input == "flush" and spec.dead_letter is not None
    assert spec.watermark is spec.rows and spec.watermark_table == "transform"
    assert "WATERMARK_TS()" in (spec.transform_sql or "")


def test_a_row_pipeline_has_no_window() -> None:
    spec = load_pipeline_str(ROW_TOML)
    with pytest.raises(PipelineConfigError) as info:
        spec.window  # noqa: B018 - the property raises
    assert_names(info.value, "transform.window", "delayed-clicks is a row pipeline", "no window")


def test_a_windowed_pipeline_keeps_its_window() -> None:
    spec = load_pipeline_str(FULL_TOML)
    assert not spec.is_row_pipeline and spec.rows is None
    assert spec.window is spec.window_spec and spec.watermark is spec.window
    assert spec.watermark_table == "transform.window"


@pytest.mark.parametrize("text", [
    pytest.param(ROW_TOML, id="every-key"),
    pytest.param(_row({f"{T}.sql": PLAIN_SQL, **NO_CAP, "target.key": DELETE}), id="plain"),
    pytest.param(_row({f"{T}.time_mode": "processing", f"{T}.event_time_column": "ts", f"{T}.event_time_unit": "s"}),
                 id="processing-time-payload-column"),
])
def test_row_pipelines_round_trip(text: str) -> None:
    spec = load_pipeline_str(text)
    assert load_pipeline_str(dump_pipeline(spec)) == spec


def test_defaults_are_left_out_of_the_dump() -> None:
    spec = load_pipeline_str(_row({f"{T}.sql": PLAIN_SQL, **NO_CAP, f"{T}.lateness_ms": 0,
                                   f"{T}.source_idleness_ms": 60_000}))
    assert spec.rows == RowTransform()
    dumped = dump_pipeline(spec)
    assert "[transform]\nsql = " in dumped and "lateness_ms" not in dumped and "[transform.window]" not in dumped


def test_the_facade_builds_the_same_row_pipeline() -> None:
    spec = load_pipeline_str(ROW_TOML)

    @streaming_pipeline(name=spec.pipeline_name, sources=spec.sources, rows=spec.rows,
                        transform_sql=spec.transform_sql, target=spec.target, run=spec.run,
                        dead_letter=spec.dead_letter, state_store=spec.state_store)
    def delayed_clicks() -> None:
        "Checkout clicks 15 minutes late."

    assert delayed_clicks.spec == spec
    assert load_pipeline_str(delayed_clicks.to_toml()) == spec


def test_the_facade_without_window_or_rows_is_a_row_pipeline_with_default_keys() -> None:
    @streaming_pipeline(name="passthrough", sources=[Source(name="ticks", kind="rate")],
                        transform_sql="SELECT value, _event_ts FROM source", target=Target(kind="console"),
                        run=Run(checkpoint_location="/tmp/ckpt"))
    def passthrough() -> None:
        "Every tick."

    assert passthrough.spec.rows == RowTransform() and passthrough.spec.is_row_pipeline


def test_the_facade_refuses_a_window_and_rows() -> None:
    windowed = python_spec()
    with pytest.raises(PipelineConfigError) as info:
        streaming_pipeline(name="both", sources=windowed.sources, window=windowed.window, rows=RowTransform(),
                           transform_sql="SELECT * FROM source", target=windowed.target, run=windowed.run)
    assert_names(info.value, "transform", "both a window and a row pipeline's keys", "not both")


@pytest.mark.parametrize("changes", [
    pytest.param({"state_store": {"kind": "in_memory"}, f"{T}.sql": PLAIN_SQL, **NO_CAP},
                 id="in-memory-store-without-watermark-ts"),
    pytest.param({"target": {"kind": "parquet", "path": "out"}}, id="parquet-target"),
    pytest.param({"target": {"kind": "console"}, "dead_letter": DELETE}, id="console-target-no-dead-letters"),
    pytest.param({"run.end_of_input": "keep"}, id="end-of-input-keep"),
    pytest.param(_where("_event_ts < WATERMARK_TS()"), id="strict-bound"),
    pytest.param(_where("WATERMARK_TS() >= _event_ts + INTERVAL 1 HOUR"), id="mirrored-bound"),
    pytest.param({**_where("page = 'a' OR page = 'b'"), **NO_CAP}, id="static-where"),
])
def test_accepted_variants_load(changes: dict[str, Any]) -> None:
    load_pipeline_str(_row(changes))


# ---------------------------------------------------------------------------------------------
# Refusals: a mutation of ROW_TOML (or of the windowed reference TOML) -> key, words in the message

LOWER_BOUND = _where("WATERMARK_TS() <= _event_ts + INTERVAL 1 MINUTE")
TWO_BOUNDS = _where("_event_ts <= WATERMARK_TS() AND ts + INTERVAL 1 MINUTE <= WATERMARK_TS()")
SUBQUERY = _where("user_id IN (SELECT user_id FROM source WHERE _event_ts <= WATERMARK_TS())")
PROJECTION = {f"{T}.sql": "SELECT WATERMARK_TS() AS w, user_id FROM source WHERE _event_ts <= WATERMARK_TS()"}
JOIN = {f"{T}.sql": "SELECT s.user_id FROM source s JOIN source t "
                    "ON s.user_id = t.user_id AND t._event_ts <= WATERMARK_TS()"}

ROW_REFUSALS: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    # --- [transform] sql
    ("sql-missing", {f"{T}.sql": DELETE}, f"{T}.sql", ("required for a row pipeline", "SELECT list", "[transform.window]")),
    ("sql-empty", {f"{T}.sql": "  "}, f"{T}.sql", ("is empty",)),
    ("sql-does-not-parse", {f"{T}.sql": "SELECT user_id FROM source WHERE user_id ="}, f"{T}.sql", ("does not parse",)),
    # --- WATERMARK_TS() (docs/contract/row-pipelines.md: each a load-time error)
    ("lower-bound", LOWER_BOUND, f"{T}.sql", ("branch 1", "lower bound", "expr <= WATERMARK_TS()")),
    ("two-time-varying-conditions", TWO_BOUNDS, f"{T}.sql", ("branch 1", "2 time-varying conditions")),
    ("in-a-subquery", SUBQUERY, f"{T}.sql", ("in a subquery",)),
    ("in-the-projection", PROJECTION, f"{T}.sql", ("in the SELECT list",)),
    ("in-a-join", JOIN, f"{T}.sql", ("in a JOIN condition",)),
    ("in-memory-store", {"state_store": {"kind": "in_memory"}}, "state_store.kind",
     ('"in_memory"', "restart would lose them", '"sqlite" or "postgres"')),
    # --- max_buffered_rows
    ("cap-missing", NO_CAP, f"{T}.max_buffered_rows", ("mandatory with WATERMARK_TS()", "max_buffered_rows = ")),
    ("cap-zero", {f"{T}.max_buffered_rows": 0}, f"{T}.max_buffered_rows", ("0 must be a positive integer",)),
    ("cap-without-watermark-ts", {f"{T}.sql": PLAIN_SQL}, f"{T}.max_buffered_rows",
     ("100000", "does not call WATERMARK_TS()", "remove it")),
    ("cap-a-string", {f"{T}.max_buffered_rows": "1000"}, f"{T}.max_buffered_rows", ("'1000'", "not an integer")),
    ("cap-too-large", {f"{T}.max_buffered_rows": 2**63}, f"{T}.max_buffered_rows", ("64-bit",)),
    # --- the watermark keys: the window's rules, named in [transform]
    ("lateness-negative", {f"{T}.lateness_ms": -1}, f"{T}.lateness_ms", ("-1", ">= 0")),
    ("lateness-a-string", {f"{T}.lateness_ms": "10s"}, f"{T}.lateness_ms", ("'10s'", "not an integer")),
    ("idleness-zero", {f"{T}.source_idleness_ms": 0}, f"{T}.source_idleness_ms", ("0 must be a positive",)),
    ("time-mode-unknown", {f"{T}.time_mode": "wall"}, f"{T}.time_mode", ("'wall'", '"event" or "processing"')),
    ("unit-unknown", {f"{T}.event_time_unit": "ns"}, f"{T}.event_time_unit", ("'ns'", '"ms", "us" or "s"')),
    ("event-time-column-not-a-name", {f"{T}.event_time_column": "event time"}, f"{T}.event_time_column",
     ("'event time'", "payload column")),
    ("event-time-column-a-number", {f"{T}.event_time_column": 5}, f"{T}.event_time_column", ("5", "not a string")),
    ("time-mode-a-number", {f"{T}.time_mode": 1}, f"{T}.time_mode", ("1 is an integer, not a string",)),
    # --- keys of [transform]
    ("window-key", {f"{T}.late_data": "drop"}, f"{T}.late_data",
     ("[transform.window] key", "no [transform.window]", "move late_data there")),
    ("aggregations", {f"{T}.group_by": ["user_id"]}, f"{T}.group_by", ("[transform.window] key",)),
    ("unknown-key", {f"{T}.udfs": ["f"]}, f"{T}.udfs",
     ("unknown key", "without [transform.window]", "max_buffered_rows, source_idleness_ms, sql")),
    # --- [target]
    ("key-on-parquet", {"target": {"kind": "parquet", "path": "out", "key": ["user_id"]}}, "target.key",
     ("only a postgres target upserts", "parquet target appends")),
    ("key-on-console", {"target": {"kind": "console", "key": ["user_id"]}}, "target.key", ("console target",)),
    ("key-twice", {"target.key": ["user_id", "USER_ID"]}, "target.key[1]", ("'USER_ID' appears twice",)),
    ("key-batch-id", {"target.key": ["_batch_id"]}, "target.key[0]", ("'_batch_id' is reserved",)),
    ("key-not-a-name", {"target.key": ["user id"]}, "target.key[0]", ("'user id' is not a column name",)),
    ("key-a-string", {"target.key": "user_id"}, "target.key", ("'user_id' is a string, not a list",)),
    ("key-item-a-number", {"target.key": ["user_id", 3]}, "target.key[1]", ("3 is an integer, not a string",)),
    ("retractions", {"target": {"kind": "parquet", "path": "out", "retractions": True}}, "target.retractions",
     ("writes each row once", "windowed pipelines")),
]

WINDOWED_REFUSALS: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    ("watermark-key-beside-the-window", {f"{T}.lateness_ms": 5_000}, f"{T}.lateness_ms",
     ("belongs in [transform.window]",)),
    ("cap-beside-the-window", {f"{T}.max_buffered_rows": 10}, f"{T}.max_buffered_rows", ("row pipelines only",)),
    ("unknown-key-beside-the-window", {f"{T}.udfs": ["f"]}, f"{T}.udfs", ("with [transform.window]: sql, window",)),
    ("watermark-ts-in-windowed-sql", {f"{T}.sql": "SELECT * FROM source WHERE _event_ts <= WATERMARK_TS()"},
     f"{T}.sql", ("windowed pipeline", "row pipeline's [transform] sql")),
    ("key-on-windowed", {"target": {**PG_TARGET, "key": ["user_id"]}}, "target.key",
     ("window start and group_by",)),
]


@pytest.mark.parametrize(("changes", "key", "words"),
                         [pytest.param(c, k, w, id=i) for i, c, k, w in ROW_REFUSALS])
def test_row_pipeline_refusals(changes: dict[str, Any], key: str, words: tuple[str, ...]) -> None:
    assert_names(load_error(_row(changes)), key, *words)


@pytest.mark.parametrize(("changes", "key", "words"),
                         [pytest.param(c, k, w, id=i) for i, c, k, w in WINDOWED_REFUSALS])
def test_windowed_pipeline_refusals(changes: dict[str, Any], key: str, words: tuple[str, ...]) -> None:
    assert_names(load_error(mutated_toml(changes)), key, *words)


def test_refusal_ids_are_unique() -> None:
    ids = [c[0] for c in ROW_REFUSALS + WINDOWED_REFUSALS]
    assert len(set(ids)) == len(ids)


def test_python_built_row_pipelines_are_validated_too() -> None:
    spec = load_pipeline_str(ROW_TOML)
    with pytest.raises(PipelineConfigError) as info:
        replace(spec, shape=replace(spec.shape, max_buffered_rows=None)).validate()
    assert_names(info.value, f"{T}.max_buffered_rows", "mandatory")
    with pytest.raises(PipelineConfigError) as info:
        replace(spec, state_store=StateStoreConfig(kind="in_memory")).validate()
    assert_names(info.value, "state_store.kind", "in_memory")
    windowed = python_spec()
    assert replace(windowed, shape=spec.shape, transform_sql=spec.transform_sql,
                   target=spec.target).validate().is_row_pipeline
