"""``[emit] sql``'s stage (spark/batch/emit_stage.py): the release times of emitted rows (the predicate's interval
arithmetic, a guard that is not TRUE (NULL group), a strict bound, the rows' order kept); a predicate Spark refuses
is a configuration error before any batch; an expression that fails on a row stops the run with a terminal error
naming it. Expected values are written out by hand."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ematix_dagster.errors import BatchDataError, PipelineConfigError
from ematix_dagster.spark.batch.emit_stage import EmitStage
from ematix_dagster.spec import load_pipeline_str
from state_store.sqlite import SqliteStateStore
from tests.spec.toml_samples import mutated_toml

UTC = pa.timestamp("us", tz="UTC")
HOUR = 3_600_000_000


def _stage(spark, tmp_path, predicate: str) -> EmitStage:
    spec = load_pipeline_str(mutated_toml({"emit": {"sql": f"SELECT * FROM windows WHERE {predicate}",
                                                    "max_buffered_rows": 10},
                                           "state_store.path": str(tmp_path / "state.db")}))
    store = SqliteStateStore(tmp_path / "state.db")
    store.open()
    try:
        stage = EmitStage.open(spec, store, _rows([]).schema, None)
    finally:
        store.close()
    assert stage is not None
    return stage


def _rows(users: list[int | None]) -> pa.Table:
    starts = [i * HOUR for i in range(len(users))]
    return pa.table({"window_start": pa.array(starts, UTC), "window_end": pa.array([s + HOUR for s in starts], UTC),
                     "user_id": pa.array(users, pa.int64()), "clicks": pa.array([1] * len(users), pa.int64()),
                     "_emit_kind": ["final"] * len(users)})


def test_release_times_follow_the_branches_in_row_order(spark, tmp_path) -> None:
    stage = _stage(spark, tmp_path, "(user_id = 1 AND window_end + INTERVAL 1 HOUR <= WATERMARK_TS()) "
                                    "OR (user_id > 1 AND window_start < WATERMARK_TS())")
    assert stage.view == "_emit_windows_user_clicks_per_minute" and stage.sql.endswith(f"FROM {stage.view}")
    got = stage.release_times(_rows([1, None, 2, 1, 3])).to_pylist()
    assert got == [2 * HOUR, None, 2 * HOUR + 1, 5 * HOUR, 4 * HOUR + 1]
    assert stage.release_times(_rows([])).to_pylist() == []


def test_a_predicate_spark_refuses_is_a_config_error_before_any_batch(spark, tmp_path) -> None:
    with pytest.raises(PipelineConfigError, match=r"^emit.sql: does not run over the emitted rows: .*DATATYPE"):
        _stage(spark, tmp_path, "user_id + INTERVAL 1 HOUR <= WATERMARK_TS()")


def test_a_predicate_that_fails_on_a_row_is_a_terminal_error_naming_it(spark, tmp_path) -> None:
    stage = _stage(spark, tmp_path, "10 / (user_id - 7) > 0 AND window_end <= WATERMARK_TS()")
    with pytest.raises(BatchDataError, match=r"\[emit\] sql failed on an emitted row \(10 / \(user_id - 7\): "
                                             r"division by zero\)") as info:
        stage.release_times(_rows([8, 9, 7, 6]))
    assert "'user_id': 7" in str(info.value) and info.value.terminal
    assert stage.release_times(_rows([8, None])).to_pylist() == [HOUR, None]
