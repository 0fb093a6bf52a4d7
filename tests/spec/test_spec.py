"""Spec loading and round-tripping (docs/contract/toml-reference.md; output columns: docs/contract/emission.md) and
``${ENV}`` placeholders. The sample specs live in tests/spec/toml_samples.py.
"""

from __future__ import annotations

import tomllib

import pytest

from ematix_dagster.errors import EmatixError, PipelineConfigError
from ematix_dagster.spec import (
    Aggregation,
    DeadLetter,
    PipelineSpec,
    Run,
    StateStoreConfig,
    Target,
    dump_pipeline,
    load_pipeline,
    load_pipeline_str,
    resolve_env,
    spec_from_dict,
    spec_to_dict,
    with_overrides,
)
from tests.spec.toml_samples import (
    FULL_TOML,
    MINIMAL_TOML,
    PG_TARGET,
    W,
    assert_names,
    load_error,
    mutated_toml,
    python_spec,
)

# ---------------------------------------------------------------------------------------------
# Valid specs and round trips


@pytest.fixture
def full() -> PipelineSpec:
    return load_pipeline_str(FULL_TOML)


def test_full_spec_loads_with_every_value(full: PipelineSpec) -> None:
    assert full.pipeline_name == "user-clicks-per-minute"
    assert full.metrics_port == 9108
    assert full.source_names == ("clicks",)
    src = full.sources[0]
    assert (src.kind, src.format, src.path, src.event_time_column) == ("files", "parquet", "data/clicks", "ts")
    assert src.max_files_per_trigger == 1 and src.max_future_skew_ms == 3_600_000
    assert full.transform_sql.startswith("SELECT user_id")
    w = full.window
    assert (w.kind, w.duration_ms, w.hop_ms, w.hop) == ("tumbling", 60_000, None, 60_000)
    assert w.group_by == ("user_id",)
    assert (w.lateness_ms, w.source_idleness_ms, w.late_data, w.retention_ms) == (10_000, 60_000, "drop", 0)
    assert (w.max_groups_per_window, w.hll_precision) == (1_000_000, 14)
    assert [a.as_ for a in w.aggregations] == ["unique_pages", "clicks", "amount_sum"]
    assert w.aggregations[0] == Aggregation(agg="count_distinct", column="page", as_="unique_pages", mode="approximate")
    assert w.aggregations[0].distinct_mode == "approximate"
    assert full.target == Target(kind="parquet", path="data/out/user-clicks-per-minute")
    assert full.dead_letter == DeadLetter(kind="parquet", path="data/dlq/user-clicks-per-minute")
    assert full.state_store == StateStoreConfig(kind="sqlite", path=".ematix/state.db")
    assert full.state_store.durable
    assert full.run == Run(checkpoint_location=".ematix/checkpoints/user-clicks-per-minute")


def test_full_spec_round_trips(full: PipelineSpec) -> None:
    text = dump_pipeline(full)
    assert load_pipeline_str(text) == full
    # Dumping is stable: a second round produces the same text.
    assert dump_pipeline(load_pipeline_str(text)) == text


def test_minimal_spec_gets_defaults_and_round_trips() -> None:
    spec = load_pipeline_str(MINIMAL_TOML)
    w = spec.window
    assert w.group_by == () and w.hop_ms is None and w.event_time_column == "_event_ts"
    assert (w.time_mode, w.event_time_unit, w.lateness_ms, w.source_idleness_ms) == ("event", "ms", 0, 60_000)
    assert (w.late_data, w.allowed_lateness_ms, w.hll_precision) == ("drop", None, 14)
    assert (w.crash_recovery, w.on_state_cap) == ("at_least_once", "fail")
    assert (w.window_start_column, w.window_end_column) == ("window_start", "window_end")
    assert spec.transform_sql is None and spec.dead_letter is None and spec.metrics_port is None
    assert spec.state_store == StateStoreConfig() and spec.state_store.kind == "sqlite" and spec.state_store.durable
    assert spec.run == Run(checkpoint_location="/tmp/ckpt", trigger="available_now",
                           trigger_interval_ms=1_000, end_of_input="keep")
    assert spec.target == Target(kind="console")
    text = dump_pipeline(spec)
    assert load_pipeline_str(text) == spec
    doc = tomllib.loads(text)
    assert "state_store" not in doc and "dead_letter" not in doc and "metrics_port" not in doc
    assert "sql" not in doc["transform"]


def test_python_built_spec_round_trips() -> None:
    spec = python_spec()
    assert spec.window.group_by == ("region", "sku") and isinstance(spec.sources, tuple)
    assert isinstance(spec.window.aggregations, tuple)
    text = dump_pipeline(spec)
    assert load_pipeline_str(text) == spec
    doc = tomllib.loads(text)
    aggs = doc["transform"]["window"]["aggregations"]
    assert aggs[0] == {"agg": "count", "as": "n"}  # "as", never "as_"; defaults omitted
    assert "as_" not in text
    assert spec_from_dict(spec_to_dict(spec)) == spec


def test_validate_returns_the_spec_and_with_overrides_revalidates(full: PipelineSpec) -> None:
    assert full.validate() is full
    moved = with_overrides(full, state_store=StateStoreConfig(kind="sqlite", path="/tmp/other.db"))
    assert moved.state_store.path == "/tmp/other.db"
    assert with_overrides(full, state_store=StateStoreConfig(kind="sqlite")).state_store.path is None  # default path
    with pytest.raises(PipelineConfigError) as info:
        with_overrides(full, state_store=StateStoreConfig(kind="postgres"))
    assert_names(info.value, "state_store.url", "postgres")


def test_load_pipeline_from_file(tmp_path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(FULL_TOML)
    assert load_pipeline(path) == load_pipeline_str(FULL_TOML)
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline(tmp_path / "missing.toml")
    assert_names(info.value, "path", "missing.toml", "pipeline TOML")


def test_config_errors_are_terminal_value_errors() -> None:
    exc = load_error(mutated_toml({f"{W}.duration_ms": 0}))
    assert isinstance(exc, EmatixError) and isinstance(exc, ValueError) and exc.terminal


def test_reopen_hopping_dlq_variants_load() -> None:
    spec = load_pipeline_str(mutated_toml({
        f"{W}.kind": "hopping", f"{W}.hop_ms": 45_000, f"{W}.late_data": "reopen",
        f"{W}.allowed_lateness_ms": 120_000, f"{W}.crash_recovery": "persisted",
    }))
    assert spec.window.hop == 45_000 and spec.window.retention_ms == 120_000
    spec = load_pipeline_str(mutated_toml({f"{W}.late_data": "dlq"}))
    assert spec.window.late_data == "dlq" and spec.dead_letter is not None
    assert load_pipeline_str(dump_pipeline(spec)) == spec
    # hop_ms == duration_ms is a (degenerate) hopping window, not an error.
    assert load_pipeline_str(mutated_toml({f"{W}.kind": "hopping", f"{W}.hop_ms": 60_000})).window.hop == 60_000


# ---------------------------------------------------------------------------------------------
# ${ENV} placeholders


def test_env_placeholder_kept_in_spec_and_resolved_on_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMATIX_TARGET_URL", "postgresql://u:secret@127.0.0.1:5432/db")
    text = mutated_toml({"target": {**PG_TARGET, "url": "${EMATIX_TARGET_URL}", "create_table": True}})
    spec = load_pipeline_str(text)
    assert spec.target.url == "${EMATIX_TARGET_URL}"
    assert resolve_env(spec.target.url) == "postgresql://u:secret@127.0.0.1:5432/db"
    assert resolve_env(None) is None
    assert resolve_env("plain") == "plain"
    dumped = dump_pipeline(spec)
    assert "${EMATIX_TARGET_URL}" in dumped and "secret" not in dumped
    assert load_pipeline_str(dumped) == spec


def test_missing_env_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMATIX_TARGET_URL", raising=False)
    exc = load_error(mutated_toml({"target": {**PG_TARGET, "url": "${EMATIX_TARGET_URL}"}}))
    assert_names(exc, "target.url", "${EMATIX_TARGET_URL}", "EMATIX_TARGET_URL is not set", "export EMATIX_TARGET_URL")


def test_missing_env_variable_key_uses_toml_spelling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMATIX_NO_SUCH_VAR", raising=False)
    exc = load_error(mutated_toml({"transform.sql": "SELECT * FROM ${EMATIX_NO_SUCH_VAR}"}))
    assert_names(exc, "transform.sql", "EMATIX_NO_SUCH_VAR")
    exc = load_error(mutated_toml({"sources[0].path": "${EMATIX_NO_SUCH_VAR}/clicks"}))
    assert_names(exc, "sources[0].path", "EMATIX_NO_SUCH_VAR")


def test_resolve_env_refuses_an_unset_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMATIX_NO_SUCH_VAR", raising=False)
    with pytest.raises(PipelineConfigError) as info:
        resolve_env("x-${EMATIX_NO_SUCH_VAR}")
    assert_names(info.value, "${EMATIX_NO_SUCH_VAR}", "not set", "export EMATIX_NO_SUCH_VAR")
