"""Spec validation errors (docs/contract/toml-reference.md; session windows:
docs/contract/windows.md; emission triggers and retractions: docs/contract/emission.md).

Error cases are one table: a mutation of the reference TOML (docs/contract/toml-reference.md with a parquet target and
no ``${ENV}`` placeholders, tests/spec/toml_samples.py) -> the key the error must name and substrings its message must
hold (the bad value where there is one, and the fix).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import Aggregation, load_pipeline_str
from ematix_dagster.spec.window import SessionSpec
from tests.spec.toml_samples import (
    A0,
    A1,
    A2,
    CLICKS,
    DELETE,
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
# Error table: mutation of FULL_TOML -> key, substrings of the message (bad value and fix)

ET = f"{W}.emit_trigger"

ERROR_CASES: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    # --- window shape
    ("hopping-without-hop", {f"{W}.kind": "hopping"}, f"{W}.hop_ms", ("required", "hopping", "<= duration_ms")),
    ("hop-larger-than-duration", {f"{W}.kind": "hopping", f"{W}.hop_ms": 90_000}, f"{W}.hop_ms",
     ("90000", "duration_ms=60000", "hop_ms <= duration_ms")),
    ("hop-on-tumbling", {f"{W}.hop_ms": 30_000}, f"{W}.hop_ms", ("30000", "'tumbling'", 'kind = "hopping"')),
    ("hop-zero", {f"{W}.kind": "hopping", f"{W}.hop_ms": 0}, f"{W}.hop_ms", ("0 must be a positive", "> 0")),
    ("duration-zero", {f"{W}.duration_ms": 0}, f"{W}.duration_ms", ("0 must be a positive integer", "> 0")),
    ("duration-negative", {f"{W}.duration_ms": -60_000}, f"{W}.duration_ms", ("-60000", "> 0")),
    ("duration-not-int", {f"{W}.duration_ms": "60s"}, f"{W}.duration_ms", ("'60s'", "not an integer")),
    ("lateness-negative", {f"{W}.lateness_ms": -1}, f"{W}.lateness_ms", ("-1", ">= 0")),
    ("idleness-zero", {f"{W}.source_idleness_ms": 0}, f"{W}.source_idleness_ms", ("0", "> 0")),
    ("unknown-window-kind", {f"{W}.kind": "rolling"}, f"{W}.kind", ("'rolling'", "tumbling")),
    ("session-with-duration", {f"{W}.kind": "session"}, f"{W}.duration_ms", ("does not apply to session windows",)),
    # --- sliding windows (docs/contract/windows.md)
    ("sliding-without-event-cap", {f"{W}.kind": "sliding"}, f"{W}.max_events_per_group",
     ("required for sliding windows", "distinct event times")),
    ("sliding-event-cap-zero", {f"{W}.kind": "sliding", f"{W}.max_events_per_group": 0}, f"{W}.max_events_per_group",
     ("0 must be a positive integer",)),
    ("sliding-with-hop", {f"{W}.kind": "sliding", f"{W}.max_events_per_group": 10, f"{W}.hop_ms": 1_000},
     f"{W}.hop_ms", ("does not apply to sliding windows", "one window per distinct event time")),
    ("sliding-duration-zero", {f"{W}.kind": "sliding", f"{W}.max_events_per_group": 10, f"{W}.duration_ms": 0},
     f"{W}.duration_ms", ("0 must be a positive integer",)),
    ("sliding-with-gap", {f"{W}.kind": "sliding", f"{W}.max_events_per_group": 10, f"{W}.gap_ms": 5},
     f"{W}.gap_ms", ("only applies to session windows", "'sliding'")),
    ("event-cap-on-tumbling", {f"{W}.max_events_per_group": 10}, f"{W}.max_events_per_group",
     ("only applies to sliding windows", "'tumbling'", 'kind = "sliding"')),
    # --- emission triggers (docs/contract/emission.md): the forms, N > 0, sliding windows take none
    ("emit-trigger-unknown-string", {ET: "early"}, ET, ("unknown trigger 'early'", '"every_batch"', "{ count = N }")),
    ("emit-trigger-kind-as-string", {ET: "count"}, ET, ("unknown trigger 'count'", "{ count = N }")),
    ("emit-trigger-number", {ET: 5}, ET, ("5 is not a trigger", '"watermark"', "{ interval_ms = N }")),
    ("emit-trigger-array", {ET: ["every_batch"]}, ET, ("['every_batch'] is not a trigger", '"every_batch"')),
    ("emit-trigger-other-table-key", {ET: {"every_ms": 5}}, ET, ("{'every_ms': 5}", "one key", "{ interval_ms = N }")),
    ("emit-trigger-two-table-keys", {ET: {"count": 5, "interval_ms": 1_000}}, ET, ("'count': 5", "one key")),
    ("emit-trigger-empty-table", {ET: {}}, ET, ("unknown trigger {}", "{ count = N }")),
    ("emit-trigger-count-zero", {ET: {"count": 0}}, f"{ET}.count", ("0 must be a positive integer", "> 0")),
    ("emit-trigger-count-negative", {ET: {"count": -5}}, f"{ET}.count", ("-5 must be a positive integer",)),
    ("emit-trigger-interval-zero", {ET: {"interval_ms": 0}}, f"{ET}.interval_ms", ("0 must be a positive integer",)),
    ("emit-trigger-interval-negative", {ET: {"interval_ms": -1}}, f"{ET}.interval_ms", ("-1 must be a positive",)),
    ("emit-trigger-count-string", {ET: {"count": "5"}}, f"{ET}.count", ("'5'", "not an integer", "without quotes")),
    ("emit-trigger-count-bool", {ET: {"count": True}}, f"{ET}.count", ("True is a boolean", "not an integer")),
    ("emit-trigger-interval-float", {ET: {"interval_ms": 1.5}}, f"{ET}.interval_ms", ("1.5 is a float",)),
    *[(f"emit-trigger-{name}-on-sliding", {f"{W}.kind": "sliding", f"{W}.max_events_per_group": 10, ET: trigger}, ET,
       (repr(trigger), "sliding windows", "watermark only", 'the default is "watermark"'))
      for name, trigger in (("every-batch", "every_batch"), ("count", {"count": 3}),
                            ("interval", {"interval_ms": 1_000}))],
    ("bad-time-mode", {f"{W}.time_mode": "wall"}, f"{W}.time_mode", ("'wall'", '"event" or "processing"')),
    ("bad-event-time-unit", {f"{W}.event_time_unit": "ns"}, f"{W}.event_time_unit", ("'ns'", '"ms"')),
    # --- output columns (docs/contract/emission.md#output-columns)
    ("alias-is-group-column", {f"{A0}.as": "user_id"}, f"{A0}.as", ("'user_id'", "group_by column", "unique alias")),
    ("alias-is-group-column-other-case", {f"{A0}.as": "User_ID"}, f"{A0}.as", ("'User_ID'", "group_by column")),
    ("alias-is-another-alias", {f"{A2}.as": "unique_pages"}, f"{A2}.as",
     ("'unique_pages'", "alias of another aggregation", "unique alias")),
    ("alias-is-window-start", {f"{A1}.as": "window_start"}, f"{A1}.as", ("'window_start'", "window_start_column")),
    ("alias-is-window-end", {f"{A1}.as": "window_end"}, f"{A1}.as", ("'window_end'", "window_end_column")),
    ("alias-is-renamed-window-start", {f"{W}.window_start_column": "ws", f"{A0}.as": "ws"}, f"{A0}.as",
     ("'ws'", "window_start_column", "unique alias")),
    ("alias-is-renamed-window-end", {f"{W}.window_end_column": "we", f"{A2}.as": "we"}, f"{A2}.as",
     ("'we'", "window_end_column")),
    ("group-is-renamed-window-start", {f"{W}.window_start_column": "user_id"}, f"{W}.window_start_column",
     ("'user_id'", "group_by column", "rename")),
    ("group-is-window-end", {f"{W}.group_by": ["user_id", "window_end"]}, f"{W}.window_end_column",
     ("'window_end'", "group_by column", "rename")),
    ("window-columns-equal", {f"{W}.window_end_column": "window_start"}, f"{W}.window_end_column",
     ("window_start_column", "different names")),
    ("window-column-reserved", {f"{W}.window_end_column": "_emit_kind"}, f"{W}.window_end_column",
     ("'_emit_kind'", "reserved", "another")),
    ("window-column-invalid", {f"{W}.window_start_column": "window start"}, f"{W}.window_start_column",
     ("'window start'", "letters, digits and _")),
    ("group-twice", {f"{W}.group_by": ["user_id", "user_id"]}, f"{W}.group_by[1]", ("'user_id'", "twice", "once")),
    ("group-not-a-list", {f"{W}.group_by": "user_id"}, f"{W}.group_by", ("list", '["user_id"]')),
    ("alias-reserved-event-ts", {f"{A0}.as": "_event_ts"}, f"{A0}.as", ("'_event_ts'", "reserved", "another alias")),
    ("alias-reserved-source", {f"{A1}.as": "_source"}, f"{A1}.as", ("'_source'", "reserved")),
    ("group-reserved-event-ts", {f"{W}.group_by": ["_event_ts"]}, f"{W}.group_by[0]",
     ("'_event_ts'", "reserved", "payload column")),
    ("group-reserved-source", {f"{W}.group_by": ["user_id", "_source"]}, f"{W}.group_by[1]", ("'_source'", "reserved")),
    ("alias-invalid", {f"{A0}.as": "unique pages"}, f"{A0}.as", ("'unique pages'", "letters, digits and _")),
    # --- memory caps (docs/contract/failure-modes.md#caps-fail-loud)
    ("missing-max-groups", {f"{W}.max_groups_per_window": DELETE}, f"{W}.max_groups_per_window",
     ("mandatory", "1_000_000")),
    ("max-groups-zero", {f"{W}.max_groups_per_window": 0}, f"{W}.max_groups_per_window", ("0", "> 0")),
    ("exact-without-max-distinct", {f"{A0}.mode": "exact"}, f"{A0}.max_distinct_values_per_group",
     ('mode = "exact"', "100_000")),
    ("exact-max-distinct-zero", {f"{A0}.mode": "exact", f"{A0}.max_distinct_values_per_group": 0},
     f"{A0}.max_distinct_values_per_group", ("0", "> 0")),
    ("max-distinct-on-approximate", {f"{A0}.max_distinct_values_per_group": 10}, f"{A0}.max_distinct_values_per_group",
     ('"exact"', "remove")),
    ("on-state-cap-drop-new-groups", {f"{W}.on_state_cap": "drop_new_groups"}, f"{W}.on_state_cap",
     ("'drop_new_groups'", "reserved", '"fail"')),
    ("on-state-cap-backpressure", {f"{W}.on_state_cap": "backpressure"}, f"{W}.on_state_cap",
     ("'backpressure'", "reserved", '"fail"')),
    ("on-state-cap-unknown", {f"{W}.on_state_cap": "ignore"}, f"{W}.on_state_cap", ("'ignore'", '"fail"')),
    ("hll-precision-3", {f"{W}.hll_precision": 3}, f"{W}.hll_precision", ("3 is outside 4..21", "14")),
    ("hll-precision-22", {f"{W}.hll_precision": 22}, f"{W}.hll_precision", ("22 is outside 4..21", "14")),
    # --- crash recovery
    ("crash-recovery-kafka-eos", {f"{W}.crash_recovery": "kafka_eos"}, f"{W}.crash_recovery",
     ("kafka_eos", "reserved", "at_least_once")),
    ("crash-recovery-unknown", {f"{W}.crash_recovery": "exactly_once"}, f"{W}.crash_recovery",
     ("'exactly_once'", "persisted")),
    ("persisted-in-memory-store", {f"{W}.crash_recovery": "persisted", "state_store": {"kind": "in_memory"}},
     f"{W}.crash_recovery", ("persisted", "durable")),
    # --- other engines' spellings name the canonical key
    ("foreign-kind", {f"{A1}.agg": DELETE, f"{A1}.kind": "count"}, f"{A1}.kind",
     ("not this engine's spelling", "'count'", "'agg'")),
    ("foreign-input-column", {f"{A2}.column": DELETE, f"{A2}.input_column": "amount"}, f"{A2}.input_column",
     ("not this engine's spelling", "'amount'", "'column'")),
    ("foreign-output-name", {f"{A2}.as": DELETE, f"{A2}.output_name": "amount_sum"}, f"{A2}.output_name",
     ("not this engine's spelling", "'amount_sum'", "'as'")),
    ("foreign-width-ms", {f"{W}.duration_ms": DELETE, f"{W}.width_ms": 60_000}, f"{W}.width_ms",
     ("not this engine's spelling", "60000", "'duration_ms'")),
    # --- unknown keys anywhere
    ("unknown-top-level", {"owner": "me"}, "owner", ("unknown top-level key", "pipeline_name")),
    ("unknown-in-source", {"sources[0].compression": "snappy"}, "sources[0].compression",
     ("unknown key", "known keys", "schema")),
    ("unknown-in-window", {f"{W}.size_ms": 1}, f"{W}.size_ms", ("unknown key", "duration_ms")),
    ("unknown-in-aggregation", {f"{A0}.alias": "x"}, f"{A0}.alias", ("unknown key", "as, column")),
    ("as_-is-not-toml", {f"{A0}.as_": "x"}, f"{A0}.as_", ("unknown key",)),
    ("unknown-in-target", {"target.compression": "zstd"}, "target.compression", ("unknown key", "path")),
    ("unknown-in-run", {"run.retries": 3}, "run.retries", ("unknown key", "checkpoint_location")),
    ("unknown-in-transform", {"transform.udfs": ["f"]}, "transform.udfs", ("unknown key", "sql, window")),
    ("unknown-in-dead-letter", {"dead_letter.topic": "t"}, "dead_letter.topic", ("unknown key",)),
    ("unknown-in-state-store", {"state_store.wal": True}, "state_store.wal", ("unknown key",)),
    # --- late data
    ("reopen-without-allowed-lateness", {f"{W}.late_data": "reopen"}, f"{W}.allowed_lateness_ms",
     ('late_data = "reopen"', "required")),
    ("reopen-allowed-lateness-zero", {f"{W}.late_data": "reopen", f"{W}.allowed_lateness_ms": 0},
     f"{W}.allowed_lateness_ms", ("0", "> 0")),
    ("allowed-lateness-without-reopen", {f"{W}.allowed_lateness_ms": 120_000}, f"{W}.allowed_lateness_ms",
     ("120000", "'drop'", "reopen")),
    ("unknown-late-policy", {f"{W}.late_data": "ignore"}, f"{W}.late_data", ("'ignore'", '"dlq"')),
    ("dlq-without-dead-letter", {f"{W}.late_data": "dlq", "dead_letter": DELETE}, "dead_letter",
     ('late_data = "dlq"', "[dead_letter]")),
    # --- sources
    ("files-without-schema", {"sources[0].schema": DELETE}, "sources[0].schema",
     ("required", "files", "DDL schema")),
    ("files-without-event-time-column", {"sources[0].event_time_column": DELETE}, "sources[0].event_time_column",
     ("required", "files", "event time")),
    ("files-without-path", {"sources[0].path": DELETE}, "sources[0].path", ("required", "files", "directory")),
    ("files-bad-format", {"sources[0].format": "avro"}, "sources[0].format", ("'avro'", '"parquet"')),
    ("duplicate-source-names", {"sources[1]": CLICKS}, "sources[1].name", ("'clicks'", "twice", "unique name")),
    ("source-name-invalid", {"sources[0].name": "Clicks"}, "sources[0].name", ("'Clicks'", "[a-z0-9_-]")),
    ("source-name-heartbeat", {"sources[0].name": "_heartbeat"}, "sources[0].name", ("_heartbeat", "reserved")),
    ("source-unknown-kind", {"sources[0].kind": "kinesis"}, "sources[0].kind", ("'kinesis'", '"kafka"')),
    ("source-option-of-other-kind", {"sources[0].topic": "t"}, "sources[0].topic", ("files", "remove")),
    ("kafka-without-topic", {"sources[0]": {"name": "k", "kind": "kafka", "bootstrap_servers": "127.0.0.1:9092"}},
     "sources[0].topic", ("required", "kafka", "topic")),
    ("no-sources", {"sources": []}, "sources", ("at least one", "[[sources]]")),
    ("negative-future-skew", {"sources[0].max_future_skew_ms": -1}, "sources[0].max_future_skew_ms", ("-1", ">= 0")),
    # --- top level
    ("pipeline-name-invalid", {"pipeline_name": "User Clicks!"}, "pipeline_name", ("'User Clicks!'", "[a-z0-9_-]")),
    ("pipeline-name-missing", {"pipeline_name": DELETE}, "pipeline_name", ("required",)),
    ("metrics-port-out-of-range", {"metrics_port": 70_000}, "metrics_port", ("70000", "1..65535")),
    ("metrics-port-bool", {"metrics_port": True}, "metrics_port", ("True", "not an integer")),
    ("run-missing", {"run": DELETE}, "run", ("required",)),
    # without [transform.window] the pipeline is a row pipeline (tests/spec/test_row_pipelines.py), which needs SQL
    ("window-and-sql-missing", {f"{W}": DELETE, "transform.sql": DELETE}, "transform.sql",
     ("required for a row pipeline", "[transform.window]")),
    ("window-not-a-table", {f"{W}": 5}, W, ("table", "[transform.window]")),
    ("aggregations-missing", {f"{W}.aggregations": DELETE}, f"{W}.aggregations", ("at least one", 'agg = "count"')),
    ("aggregations-not-an-array", {f"{W}.aggregations": {"agg": "count", "as": "n"}}, f"{W}.aggregations",
     ("array of tables", "[[transform.window.aggregations]]")),
    ("sql-empty", {"transform.sql": "  "}, "transform.sql", ("empty", "SELECT")),
    ("sql-not-a-string", {"transform.sql": 5}, "transform.sql", ("5", "not a string", "quotes")),
    # --- aggregations
    ("unknown-agg", {f"{A1}.agg": "median"}, f"{A1}.agg", ("'median'", "count_distinct")),
    ("count-with-column", {f"{A1}.column": "amount"}, f"{A1}.column", ("'amount'", "takes no column", "count_col")),
    ("sum-without-column", {f"{A2}.column": DELETE}, f"{A2}.column", ("sum needs a column", "column =")),
    ("count-col-without-column", {f"{A1}.agg": "count_col"}, f"{A1}.column", ("count_col needs a column",)),
    ("mode-on-sum", {f"{A2}.mode": "exact"}, f"{A2}.mode", ("'exact'", "only count_distinct", "remove mode")),
    ("unknown-distinct-mode", {f"{A0}.mode": "fuzzy"}, f"{A0}.mode", ("'fuzzy'", '"approximate" or "exact"')),
    ("agg-missing-as", {f"{A1}.as": DELETE}, f"{A1}.as", ("required", "as = ")),
    # --- run
    ("flush-with-processing-time", {"run.trigger": "processing_time", "run.end_of_input": "flush"},
     "run.end_of_input", ('"flush"', "available_now")),
    ("unknown-trigger", {"run.trigger": "once"}, "run.trigger", ("'once'", "available_now")),
    ("trigger-interval-zero", {"run.trigger_interval_ms": 0}, "run.trigger_interval_ms", ("0", "> 0")),
    ("checkpoint-remote", {"run.checkpoint_location": "s3://bucket/ckpt"}, "run.checkpoint_location",
     ("local path", "local directory")),
    ("checkpoint-missing", {"run.checkpoint_location": DELETE}, "run.checkpoint_location", ("required",)),
    # --- targets, dead letters, state stores
    ("same-transaction-without-postgres-store", {"target": {**PG_TARGET, "same_transaction": True}},
     "target.same_transaction", ("postgres [state_store]", 'kind = "postgres"')),
    ("same-transaction-on-parquet", {"target.same_transaction": True}, "target.same_transaction",
     ("only a postgres target", "remove")),
    ("checkpoint-interval-zero", {"state_store.checkpoint_interval_ms": 0}, "state_store.checkpoint_interval_ms",
     ("0", "positive")),
    ("postgres-store-without-url", {"state_store": {"kind": "postgres"}}, "state_store.url",
     ("postgres", "EMATIX_STATE_URL")),
    ("schema-on-sqlite-store", {"state_store.schema": "ematix"}, "state_store.schema", ("'ematix'", "sqlite", "remove")),
    ("unknown-state-store", {"state_store.kind": "redis"}, "state_store.kind", ("'redis'", '"sqlite"')),
    ("unknown-target-kind", {"target.kind": "kafka"}, "target.kind", ("'kafka'", '"parquet"')),
    ("parquet-target-without-path", {"target.path": DELETE}, "target.path", ("required", "parquet")),
    ("parquet-target-with-table", {"target.table": "t"}, "target.table", ("'t'", "parquet", "remove")),
    ("postgres-target-without-table", {"target": {"kind": "postgres", "url": PG_TARGET["url"]}}, "target.table",
     ("required", "public.user_clicks_1min")),
    ("postgres-target-bad-table", {"target": {**PG_TARGET, "table": "a.b.c"}}, "target.table",
     ("'a.b.c'", "schema.table")),
    ("console-with-path", {"target": {"kind": "console", "path": "x"}}, "target.kind", ("console", "remove")),
    ("retractions-on-postgres", {"target": {**PG_TARGET, "retractions": True}}, "target.retractions",
     ("postgres target keeps one row per key", "deletes the keys", "parquet and console")),
    ("retractions-string", {"target.retractions": "true"}, "target.retractions", ("'true'", "not a boolean")),
    ("retractions-on-sliding-reopen", {f"{W}.kind": "sliding", f"{W}.max_events_per_group": 10,
                                       f"{W}.late_data": "reopen", f"{W}.allowed_lateness_ms": 1_000,
                                       "target.retractions": True}, "target.retractions",
     ("sliding windows", "cannot retract", '"drop"')),
    ("unknown-dead-letter-kind", {"dead_letter.kind": "kafka"}, "dead_letter.kind", ("'kafka'", '"postgres"')),
    ("unknown-source-row-choice", {"dead_letter.include_source_row": "yes"}, "dead_letter.include_source_row",
     ("'yes'", "'sql_error'", "'all'", "'none'")),
]


@pytest.mark.parametrize(
    ("changes", "key", "substrings"),
    [pytest.param(changes, key, subs, id=name) for name, changes, key, subs in ERROR_CASES],
)
def test_config_error(changes: dict[str, Any], key: str, substrings: tuple[str, ...]) -> None:
    assert_names(load_error(mutated_toml(changes)), key, *substrings)


def test_error_table_ids_are_unique() -> None:
    names = [name for name, *_ in ERROR_CASES]
    assert len(names) == len(set(names))


def test_invalid_toml_syntax() -> None:
    exc = load_error(FULL_TOML.replace('kind = "tumbling"', 'kind = "tumbling'))
    assert_names(exc, "toml", "not valid TOML", "line", "fix the syntax")


def test_python_built_specs_are_validated_too() -> None:
    base = python_spec()
    bad = replace(base, shape=replace(base.window, hop_ms=None))
    with pytest.raises(PipelineConfigError) as info:
        bad.validate()
    assert_names(info.value, f"{W}.hop_ms", "required")
    bad_agg = replace(base.window, aggregations=(Aggregation("count", "sku"),))
    with pytest.raises(PipelineConfigError) as info:
        replace(base, shape=bad_agg).validate()
    assert_names(info.value, f"{W}.aggregations[0].as", "'sku'", "group_by column")
    with pytest.raises(PipelineConfigError) as info:
        replace(base, shape=replace(base.window, aggregations=())).validate()
    assert_names(info.value, f"{W}.aggregations", "at least one")
    with pytest.raises(PipelineConfigError) as info:
        replace(base, shape=replace(base.window, max_groups_per_window=None)).validate()
    assert_names(info.value, f"{W}.max_groups_per_window", "mandatory")


# ---- session windows (docs/contract/windows.md) ----------------------------------------------------------------

SESSION_RULES = [  # (changes, the key named, words in the message)
    ({"gap_ms": None}, "gap_ms", ("required",)),
    ({"gap_ms": 0}, "gap_ms", ("positive",)),
    ({"max_session_duration_ms": None}, "max_session_duration_ms", ("required",)),
    ({"max_session_duration_ms": 30_000}, "max_session_duration_ms", ("not larger than gap_ms=30000",)),
    ({"duration_ms": 60_000}, "duration_ms", ("does not apply to session windows",)),
    ({"hop_ms": 10_000}, "hop_ms", ("does not apply to session windows",)),
    ({"group_by": ()}, "group_by", ("required for session windows",)),
]


@pytest.mark.parametrize(("changes", "field", "words"), SESSION_RULES)
def test_session_rules_name_the_key(changes: dict[str, Any], field: str, words: tuple[str, ...]) -> None:
    base = load_pipeline_str(MINIMAL_TOML).window
    good = replace(base, kind="session", duration_ms=None, gap_ms=30_000, max_session_duration_ms=3_600_000,
                   group_by=("user_id",))
    SessionSpec.validate(good, "transform.window")  # the valid one passes
    with pytest.raises(PipelineConfigError) as exc:
        SessionSpec.validate(replace(good, **changes), "transform.window")
    assert exc.value.key == f"transform.window.{field}"
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_session_keys_are_refused_on_fixed_windows() -> None:
    base = load_pipeline_str(MINIMAL_TOML).window
    for field in ("gap_ms", "max_session_duration_ms"):
        with pytest.raises(PipelineConfigError) as exc:
            replace(base, **{field: 1_000}).validate()
        assert exc.value.key == f"transform.window.{field}" and "only applies to session windows" in str(exc.value)
