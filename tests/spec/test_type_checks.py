"""Config values are type-checked at load, and integers stay inside bounds that cannot overflow later.

One row per case: where in the TOML the bad value goes, the value, and the key the error must name.
Every error is a PipelineConfigError naming the key, showing the bad value and giving a fix.
"""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
import tomli_w

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import JAVA_INT_MAX, MAX_DURATION_MS, load_pipeline_str

BASE = '''
pipeline_name = "typed"

[[sources]]
name = "clicks"
kind = "files"
format = "csv"
path = "data/clicks"
schema = "user_id BIGINT, amount BIGINT, page STRING, ts TIMESTAMP"
event_time_column = "ts"
max_files_per_trigger = 1
header = true

[transform]
sql = "SELECT * FROM source"

[transform.window]
kind = "tumbling"
duration_ms = 60_000
lateness_ms = 0
group_by = ["user_id"]
max_groups_per_window = 1_000

[[transform.window.aggregations]]
agg = "count_distinct"
column = "page"
as = "pages"
mode = "exact"
max_distinct_values_per_group = 100

[[transform.window.aggregations]]
agg = "sum"
column = "amount"
as = "total"

[target]
kind = "postgres"
url = "postgresql://ematix@127.0.0.1:5432/ematix"
table = "public.out"
create_table = false

[dead_letter]
kind = "parquet"
path = "data/dlq"

[state_store]
kind = "sqlite"
path = ".ematix/state.db"
checkpoint_interval_ms = 1_000

[run]
trigger = "processing_time"
trigger_interval_ms = 1_000
checkpoint_location = ".ematix/checkpoints/typed"
'''

W = "transform.window"
ET = f"{W}.emit_trigger"
RATE = {"name": "ticks", "kind": "rate", "rows_per_second": 10}
KAFKA = {"name": "events", "kind": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topic": "t"}
TOO_LONG = MAX_DURATION_MS + 1

# (case id, path of the bad value, the bad value, other changes it needs, key the error names)
CASES: list[tuple[str, str, Any, dict[str, Any], str]] = [
    # booleans are TOML booleans: a quoted "false" used to count as true
    ("create-table-string", "target.create_table", "false", {}, "target.create_table"),
    ("create-table-int", "target.create_table", 0, {}, "target.create_table"),
    ("same-transaction-string", "target.same_transaction", "true", {}, "target.same_transaction"),
    ("dead-letter-create-table", "dead_letter.create_table", "yes", {}, "dead_letter.create_table"),
    ("csv-header-string", "sources[0].header", "true", {}, "sources[0].header"),
    ("retractions-string", "target.retractions", "true", {}, "target.retractions"),
    ("retractions-int", "target.retractions", 1, {}, "target.retractions"),
    # integers: not bool, not float, not str
    ("duration-float", f"{W}.duration_ms", 60_000.0, {}, f"{W}.duration_ms"),
    ("duration-string", f"{W}.duration_ms", "60000", {}, f"{W}.duration_ms"),
    ("duration-bool", f"{W}.duration_ms", True, {}, f"{W}.duration_ms"),
    ("lateness-float", f"{W}.lateness_ms", 0.5, {}, f"{W}.lateness_ms"),
    ("max-groups-string", f"{W}.max_groups_per_window", "1000", {}, f"{W}.max_groups_per_window"),
    ("hll-precision-float", f"{W}.hll_precision", 14.0, {}, f"{W}.hll_precision"),
    ("max-files-bool", "sources[0].max_files_per_trigger", True, {}, "sources[0].max_files_per_trigger"),
    ("metrics-port-string", "metrics_port", "9108", {}, "metrics_port"),
    ("trigger-interval-float", "run.trigger_interval_ms", 1.5, {}, "run.trigger_interval_ms"),
    # emit_trigger's N, inside its inline table
    ("emit-count-string", f"{ET}.count", "5", {ET: {"count": 1}}, f"{ET}.count"),
    ("emit-count-bool", f"{ET}.count", True, {ET: {"count": 1}}, f"{ET}.count"),
    ("emit-interval-float", f"{ET}.interval_ms", 500.0, {ET: {"interval_ms": 1}}, f"{ET}.interval_ms"),
    # a trigger that is neither a string nor a table is named as a trigger, not as a type
    ("emit-trigger-number", ET, 5, {}, ET),
    ("emit-trigger-bool", ET, True, {}, ET),
    # strings are strings
    ("path-number", "sources[0].path", 5, {}, "sources[0].path"),
    ("schema-number", "sources[0].schema", 1, {}, "sources[0].schema"),
    ("pipeline-name-number", "pipeline_name", 7, {}, "pipeline_name"),
    ("sql-number", "transform.sql", 5, {}, "transform.sql"),
    ("alias-number", f"{W}.aggregations[1].as", 3, {}, f"{W}.aggregations[1].as"),
    ("table-bool", "target.table", False, {}, "target.table"),
    ("checkpoint-array", "run.checkpoint_location", ["a"], {}, "run.checkpoint_location"),
    ("state-path-number", "state_store.path", 1, {}, "state_store.path"),
    ("event-time-unit-number", "sources[0].event_time_unit", 1000, {}, "sources[0].event_time_unit"),
    # group_by is a list of strings
    ("group-by-string", f"{W}.group_by", "user_id", {}, f"{W}.group_by"),
    ("group-by-number-item", f"{W}.group_by", ["user_id", 5], {}, f"{W}.group_by[1]"),
    ("group-by-table", f"{W}.group_by", {"a": 1}, {}, f"{W}.group_by"),
    # *_ms durations stay below 1000 years, so microseconds plus event times fit 64 bits
    ("duration-too-long", f"{W}.duration_ms", TOO_LONG, {}, f"{W}.duration_ms"),
    ("hop-too-long", f"{W}.hop_ms", TOO_LONG, {f"{W}.kind": "hopping"}, f"{W}.hop_ms"),
    ("lateness-too-long", f"{W}.lateness_ms", TOO_LONG, {}, f"{W}.lateness_ms"),
    ("idleness-too-long", f"{W}.source_idleness_ms", TOO_LONG, {}, f"{W}.source_idleness_ms"),
    ("allowed-lateness-too-long", f"{W}.allowed_lateness_ms", TOO_LONG, {f"{W}.late_data": "reopen"},
     f"{W}.allowed_lateness_ms"),
    ("future-skew-too-long", "sources[0].max_future_skew_ms", TOO_LONG, {}, "sources[0].max_future_skew_ms"),
    ("trigger-interval-too-long", "run.trigger_interval_ms", TOO_LONG, {}, "run.trigger_interval_ms"),
    ("checkpoint-interval-too-long", "state_store.checkpoint_interval_ms", TOO_LONG, {},
     "state_store.checkpoint_interval_ms"),
    ("emit-interval-too-long", f"{ET}.interval_ms", TOO_LONG, {ET: {"interval_ms": 1}}, f"{ET}.interval_ms"),
    # counts and Spark options stay in the range the engine and Spark can hold
    ("max-groups-huge", f"{W}.max_groups_per_window", JAVA_INT_MAX + 1, {}, f"{W}.max_groups_per_window"),
    ("max-distinct-huge", f"{W}.aggregations[0].max_distinct_values_per_group", JAVA_INT_MAX + 1, {},
     f"{W}.aggregations[0].max_distinct_values_per_group"),
    ("max-files-huge", "sources[0].max_files_per_trigger", JAVA_INT_MAX + 1, {}, "sources[0].max_files_per_trigger"),
    ("rows-per-second-huge", "sources[0].rows_per_second", JAVA_INT_MAX + 1, {"sources[0]": RATE},
     "sources[0].rows_per_second"),
    ("max-offsets-huge", "sources[0].max_offsets_per_trigger", 2**63, {"sources[0]": KAFKA},
     "sources[0].max_offsets_per_trigger"),
    ("metrics-port-huge", "metrics_port", 2**40, {}, "metrics_port"),
    ("emit-count-huge", f"{ET}.count", 2**63, {ET: {"count": 1}}, f"{ET}.count"),
]


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    node: Any = doc
    *parents, last = path.split(".")
    for part in parents:
        name, _, index = part.partition("[")
        node = node[name] if not index else node[name][int(index.rstrip("]"))]
    name, _, index = last.partition("[")
    if index:
        node[name][int(index.rstrip("]"))] = value
    else:
        node[name] = value


def toml_with(changes: dict[str, Any]) -> str:
    doc = tomllib.loads(BASE)
    for path, value in changes.items():
        _set(doc, path, value)
    return tomli_w.dumps(doc)


def test_the_base_document_loads() -> None:
    spec = load_pipeline_str(BASE)
    assert spec.target.create_table is False and spec.sources[0].header is True


@pytest.mark.parametrize(("path", "value", "extra", "key"),
                         [pytest.param(p, v, e, k, id=name) for name, p, v, e, k in CASES])
def test_bad_value_is_a_config_error_naming_key_value_and_fix(path: str, value: Any, extra: dict[str, Any],
                                                              key: str) -> None:
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_str(toml_with({**extra, path: value}))
    exc, text = info.value, str(info.value)
    assert exc.key == key, text
    assert text.startswith(f"{key}: "), text
    assert exc.fix and f"(fix: {exc.fix})" in text, text
    shown = value[1] if isinstance(value, list) and len(value) == 2 else value  # group_by[1]: the item
    assert repr(shown) in text or str(shown) in text, text


def test_case_ids_are_unique() -> None:
    assert len({c[0] for c in CASES}) == len(CASES)


def test_a_duration_bound_is_named_with_its_reason() -> None:
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_str(toml_with({f"{W}.duration_ms": TOO_LONG}))
    assert f"{MAX_DURATION_MS:_}" in str(info.value) and "1000 years" in str(info.value)


@pytest.mark.parametrize(("path", "value"), [
    (f"{W}.duration_ms", MAX_DURATION_MS),
    ("run.trigger_interval_ms", MAX_DURATION_MS),
    (f"{W}.max_groups_per_window", JAVA_INT_MAX),
    ("sources[0].max_files_per_trigger", JAVA_INT_MAX),
    ("target.create_table", True),
    (ET, {"interval_ms": MAX_DURATION_MS}),
    (ET, {"count": 2**63 - 1}),
    ("sources[0].header", False),
])
def test_values_at_the_bounds_load(path: str, value: Any) -> None:
    load_pipeline_str(toml_with({path: value}))
