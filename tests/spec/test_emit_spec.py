"""``[emit] sql`` (docs/contract/delayed-windows.md): exactly ``SELECT * FROM windows WHERE
<predicate>``, the predicate naming only window bounds, session_id and group columns, read at load time by
the row pipelines' release plan; each refusal names its key and says why and how to fix it."""

from __future__ import annotations

from typing import Any

import pytest

from ematix_dagster.cli import main
from ematix_dagster.fingerprint import describe_changes, fingerprint_doc
from ematix_dagster.spec import EmitRelease, dump_pipeline, load_pipeline_str
from tests.spec.toml_samples import DELETE, FULL_TOML, ROW_TOML, assert_names, load_error, mutated_toml

DELAY = "SELECT * FROM windows WHERE window_end + INTERVAL 1 HOUR <= WATERMARK_TS()"
EMIT = {"emit": {"sql": DELAY, "max_buffered_rows": 1000}}


def _emit(sql: str | None = None, **changes: Any) -> str:
    emit = {"sql": sql or DELAY, "max_buffered_rows": 1000}
    return mutated_toml({"emit": emit, **changes})


def test_emit_loads_round_trips_and_enters_the_fingerprint() -> None:
    spec = load_pipeline_str(_emit())
    assert spec.emit == EmitRelease(DELAY, 1000)
    assert load_pipeline_str(dump_pipeline(spec)) == spec
    plain = load_pipeline_str(FULL_TOML)
    assert "emit.sql" not in fingerprint_doc(plain)  # a pipeline without [emit] keeps its fingerprint
    assert describe_changes(fingerprint_doc(plain), fingerprint_doc(spec)) == [f"emit.sql: None -> {DELAY!r}"]


@pytest.mark.parametrize("predicate", [
    "window_end + INTERVAL 1 HOUR <= WATERMARK_TS()",
    "(user_id = 1 AND window_start <= WATERMARK_TS()) OR user_id <> 1",
    "WATERMARK_TS() > windows.window_end",
    "(user_id IN (1, 2) OR coalesce(user_id, 0) BETWEEN -3 AND 3) AND window_end + INTERVAL 90 SECONDS <= WATERMARK_TS()",
    "CASE WHEN hour(window_start) < 6 THEN TRUE ELSE user_id % 2 = 0 END "
    "AND window_start >= TIMESTAMP '2024-01-01 00:00:00' AND window_end <= WATERMARK_TS()",
])
def test_predicates_on_bounds_and_group_columns_load(predicate: str) -> None:
    assert load_pipeline_str(_emit(f"SELECT * FROM windows WHERE {predicate}")).emit is not None


def test_session_id_is_a_predicate_column_of_session_windows_only() -> None:
    sql = "SELECT * FROM windows WHERE session_id > 0 AND window_end <= WATERMARK_TS()"
    session = {"transform.window.kind": "session", "transform.window.gap_ms": 60_000,
               "transform.window.duration_ms": DELETE, "transform.window.max_session_duration_ms": 3_600_000,
               "transform.window.aggregations[0]": DELETE}
    assert load_pipeline_str(_emit(sql, **session)).emit is not None
    assert_names(load_error(_emit(sql)), "emit.sql", "names session_id")


@pytest.mark.parametrize(("sql", "words"), [
    ("SELECT * FROM windows WHERE clicks > 3 AND window_end <= WATERMARK_TS()", ("names clicks", "aggregate", )),
    ("SELECT * FROM windows WHERE amount_sum + window_end <= WATERMARK_TS()", ("names amount_sum",)),
    ("SELECT window_start FROM windows WHERE window_end <= WATERMARK_TS()", ("selects window_start",)),
    ("SELECT * FROM source WHERE window_end <= WATERMARK_TS()", ("reads FROM source",)),
    ("SELECT * FROM windows WHERE window_end <= WATERMARK_TS() ORDER BY window_end", ("ORDER",)),
    ("SELECT * FROM windows", ("has no WHERE",)),
    ("SELECT * FROM windows WHERE user_id > 0", ("does not call WATERMARK_TS()",)),
    ("SELECT * FROM windows WHERE WATERMARK_TS() <= window_end", ("lower bound",)),
    ("SELECT * FROM windows WHERE window_end <= WATERMARK_TS() UNION ALL SELECT * FROM windows",
     ("not a single SELECT",)),
    # the grammar (sql/grammar.py): what depends on other rows, or changes from call to call
    ("SELECT * FROM windows WHERE EXISTS (SELECT 1 FROM windows WHERE user_id = 1) AND window_end <= WATERMARK_TS()",
     ("uses EXISTS(", "outside the predicate's grammar")),
    ("SELECT * FROM windows WHERE user_id IN (SELECT user_id FROM windows) AND window_end <= WATERMARK_TS()",
     ("uses user_id IN (SELECT", "a subquery")),
    ("SELECT * FROM windows WHERE rand() < 0.5 AND window_end <= WATERMARK_TS()", ("uses RAND()", "function")),
    ("SELECT * FROM windows WHERE CAST(user_id AS STRING) = '1' AND window_end <= WATERMARK_TS()", ("a cast",)),
    ("SELECT * FROM windows WHERE window_end + INTERVAL 1 MONTH <= WATERMARK_TS()", ("day-time interval",)),
    ("SELECT * FROM windows WHERE window_start > TIMESTAMP 'yesterday' AND window_end <= WATERMARK_TS()",
     ("not an ISO 8601",)),
    ("SELECT * FROM windows WHERE user_id IN (1, -user_id) AND window_end <= WATERMARK_TS()",
     ("IN takes a list of literals",)),
    ("SELECT * FROM windows WHERE abs(user_id, 2) > 0 AND window_end <= WATERMARK_TS()", ("with 2 arguments",)),
])
def test_other_shapes_and_columns_are_refused(sql: str, words: tuple[str, ...]) -> None:
    assert_names(load_error(_emit(sql)), "emit.sql", *words)


def test_the_cap_is_mandatory_and_the_store_durable() -> None:
    assert_names(load_error(mutated_toml({"emit": {"sql": DELAY}})), "emit.max_buffered_rows", "mandatory")
    assert_names(load_error(_emit(**{"emit.max_buffered_rows": 0})), "emit.max_buffered_rows", "positive")
    assert_names(load_error(_emit(state_store={"kind": "in_memory"})), "state_store.kind", "in_memory")


def test_a_row_pipeline_takes_no_emit_table() -> None:
    assert_names(load_error(mutated_toml(EMIT, ROW_TOML)), "emit", "windowed pipelines")


def test_validate_refuses_an_aggregate_column_in_the_predicate_exit_2(tmp_path, capsys) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text(_emit("SELECT * FROM windows WHERE clicks >= 10 AND window_end <= WATERMARK_TS()"))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "emit.sql: the predicate names clicks" in err and "fix:" in err and "Traceback" not in err, err
