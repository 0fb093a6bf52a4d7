"""Spec loading, validation and round-tripping (docs/contract/toml-reference.md, seed 000 "SQL surface", "Memory caps",
"Output schema").

Error cases are one table: a mutation of the reference TOML (docs/contract/toml-reference.md with a parquet target and
no ``${ENV}`` placeholders) -> the key the error must name and substrings its message must hold
(the bad value where there is one, and the fix).
"""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import replace
from typing import Any

import pytest
import tomli_w

from ematix_dagster.errors import EmatixError, PipelineConfigError
from ematix_dagster.spec import (
    Aggregation,
    DeadLetter,
    PipelineSpec,
    Run,
    Source,
    StateStoreConfig,
    Target,
    Window,
    dump_pipeline,
    load_pipeline,
    load_pipeline_str,
    resolve_env,
    spec_from_dict,
    spec_to_dict,
    with_overrides,
)
from ematix_dagster.streaming.state_size import estimate_state
from ematix_dagster.streaming.windows import SessionWindows

# docs/contract/toml-reference.md, with a parquet target (no env vars) and three aggregations so that alias clashes
# between aggregations can be expressed as one-key mutations.
FULL_TOML = '''
pipeline_name = "user-clicks-per-minute"
metrics_port = 9108

[[sources]]
name = "clicks"
kind = "files"
format = "parquet"
path = "data/clicks"
schema = "user_id BIGINT, amount DOUBLE, page STRING, ts TIMESTAMP"
event_time_column = "ts"
max_files_per_trigger = 1
max_future_skew_ms = 3_600_000

[transform]
sql = "SELECT user_id, amount, page, _event_ts, _source FROM source WHERE amount >= 0"

[transform.window]
kind = "tumbling"
duration_ms = 60_000
event_time_column = "_event_ts"
time_mode = "event"
lateness_ms = 10_000
source_idleness_ms = 60_000
group_by = ["user_id"]
late_data = "drop"
max_groups_per_window = 1_000_000
hll_precision = 14
crash_recovery = "at_least_once"
on_state_cap = "fail"
window_start_column = "window_start"
window_end_column = "window_end"

[[transform.window.aggregations]]
agg = "count_distinct"
column = "page"
as = "unique_pages"
mode = "approximate"

[[transform.window.aggregations]]
agg = "count"
as = "clicks"

[[transform.window.aggregations]]
agg = "sum"
column = "amount"
as = "amount_sum"

[target]
kind = "parquet"
path = "data/out/user-clicks-per-minute"

[dead_letter]
kind = "parquet"
path = "data/dlq/user-clicks-per-minute"

[state_store]
kind = "sqlite"
path = ".ematix/state.db"

[run]
trigger = "available_now"
trigger_interval_ms = 1_000
checkpoint_location = ".ematix/checkpoints/user-clicks-per-minute"
end_of_input = "keep"
'''

MINIMAL_TOML = '''
pipeline_name = "minimal"

[[sources]]
name = "ticks"
kind = "rate"

[transform.window]
kind = "tumbling"
duration_ms = 1_000
max_groups_per_window = 10

[[transform.window.aggregations]]
agg = "count"
as = "n"

[target]
kind = "console"

[run]
checkpoint_location = "/tmp/ckpt"
'''

W = "transform.window"
A0, A1, A2 = (f"{W}.aggregations[{i}]" for i in range(3))
DELETE = object()

# The base doc's sources[0], reused to build a second source with the same name.
CLICKS = tomllib.loads(FULL_TOML)["sources"][0]
PG_TARGET = {"kind": "postgres", "url": "postgresql://ematix@127.0.0.1:5432/ematix", "table": "public.out"}


def _apply(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set (or, with DELETE, remove) ``a.b[1].c`` in a parsed TOML doc; ``[len]`` appends."""
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        m = re.fullmatch(r"(\w+)(?:\[(\d+)\])?", part)
        assert m, part
        node = node.setdefault(m.group(1), {})
        if m.group(2) is not None:
            node = node[int(m.group(2))]
    m = re.fullmatch(r"(\w+)(?:\[(\d+)\])?", last)
    assert m, last
    name, index = m.group(1), m.group(2)
    if index is not None:
        seq, i = node[name], int(index)
        if value is DELETE:
            del seq[i]
        elif i == len(seq):
            seq.append(value)
        else:
            seq[i] = value
    elif value is DELETE:
        del node[name]
    else:
        node[name] = value


def mutated_toml(changes: dict[str, Any]) -> str:
    doc = tomllib.loads(FULL_TOML)
    for path, value in changes.items():
        _apply(doc, path, value if value is DELETE else copy.deepcopy(value))
    return tomli_w.dumps(doc)


def load_error(text: str) -> PipelineConfigError:
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_str(text)
    return info.value


def assert_names(exc: PipelineConfigError, key: str, *substrings: str) -> None:
    text = str(exc)
    assert exc.key == key, text
    assert text.startswith(f"{key}: "), text
    assert exc.fix, f"no fix in {text!r}"
    assert f"(fix: {exc.fix})" in text
    for s in substrings:
        assert s in text, f"{s!r} not in {text!r}"


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


def python_spec() -> PipelineSpec:
    """The facade's way: dataclasses, lists where tuples are stored, ``as_`` for ``as``."""
    return PipelineSpec(
        pipeline_name="orders-5m",
        sources=[
            Source(name="orders", kind="kafka", bootstrap_servers="127.0.0.1:9092", topic="orders",
                   max_offsets_per_trigger=10_000, starting_offsets="earliest"),
            Source(name="ticks", kind="rate", rows_per_second=5),
        ],
        transform_sql="SELECT * FROM source",
        window=Window(
            kind="hopping", duration_ms=300_000, hop_ms=60_000, group_by=["region", "sku"],
            max_groups_per_window=50_000, lateness_ms=5_000, time_mode="event", event_time_unit="us",
            late_data="reopen", allowed_lateness_ms=600_000, hll_precision=12,
            crash_recovery="persisted", window_start_column="ws", window_end_column="we",
            aggregations=[
                Aggregation("count", "n"),
                Aggregation("count_col", "n_price", column="price"),
                Aggregation("avg", "avg_price", column="price"),
                Aggregation("min", "min_price", column="price"),
                Aggregation("max", "max_price", column="price"),
                Aggregation("first", "first_sku", column="sku"),
                Aggregation("last", "last_sku", column="sku"),
                Aggregation("count_distinct", "buyers", column="buyer", mode="exact",
                            max_distinct_values_per_group=1_000),
                Aggregation("count_distinct", "buyers_approx", column="buyer"),
            ],
        ),
        target=Target(kind="postgres", url="postgresql://ematix@127.0.0.1:5432/ematix",
                      table="public.orders_5m", create_table=True, same_transaction=True),
        dead_letter=DeadLetter(kind="postgres", url="postgresql://ematix@127.0.0.1:5432/ematix",
                               table="dlq", create_table=True),
        state_store=StateStoreConfig(kind="postgres", url="postgresql://ematix@127.0.0.1:5432/ematix", schema="ematix"),
        run=Run(checkpoint_location="file:///tmp/ckpt", trigger="processing_time", trigger_interval_ms=500),
        metrics_port=9200,
    ).validate()


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


# ---------------------------------------------------------------------------------------------
# Error table: mutation of FULL_TOML -> key, substrings of the message (bad value and fix)

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
    ("bad-time-mode", {f"{W}.time_mode": "wall"}, f"{W}.time_mode", ("'wall'", '"event" or "processing"')),
    ("bad-event-time-unit", {f"{W}.event_time_unit": "ns"}, f"{W}.event_time_unit", ("'ns'", '"ms"')),
    # --- output columns (seed 000 "Output schema")
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
    # --- memory caps (seed 000 "Memory caps")
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
    # --- seed 001 spellings name the canonical key
    ("seed001-kind", {f"{A1}.agg": DELETE, f"{A1}.kind": "count"}, f"{A1}.kind", ("seed 001", "'count'", "'agg'")),
    ("seed001-input-column", {f"{A2}.column": DELETE, f"{A2}.input_column": "amount"}, f"{A2}.input_column",
     ("seed 001", "'amount'", "'column'")),
    ("seed001-output-name", {f"{A2}.as": DELETE, f"{A2}.output_name": "amount_sum"}, f"{A2}.output_name",
     ("seed 001", "'amount_sum'", "'as'")),
    ("seed001-width-ms", {f"{W}.duration_ms": DELETE, f"{W}.width_ms": 60_000}, f"{W}.width_ms",
     ("seed 001", "60000", "'duration_ms'")),
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
    ("window-missing", {f"{W}": DELETE}, W, ("required", "[transform.window]")),
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
    ("unknown-dead-letter-kind", {"dead_letter.kind": "kafka"}, "dead_letter.kind", ("'kafka'", '"postgres"')),
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
    bad = replace(base, window=replace(base.window, hop_ms=None))
    with pytest.raises(PipelineConfigError) as info:
        bad.validate()
    assert_names(info.value, f"{W}.hop_ms", "required")
    bad_agg = replace(base.window, aggregations=(Aggregation("count", "sku"),))
    with pytest.raises(PipelineConfigError) as info:
        replace(base, window=bad_agg).validate()
    assert_names(info.value, f"{W}.aggregations[0].as", "'sku'", "group_by column")
    with pytest.raises(PipelineConfigError) as info:
        replace(base, window=replace(base.window, aggregations=())).validate()
    assert_names(info.value, f"{W}.aggregations", "at least one")
    with pytest.raises(PipelineConfigError) as info:
        replace(base, window=replace(base.window, max_groups_per_window=None)).validate()
    assert_names(info.value, f"{W}.max_groups_per_window", "mandatory")


# ---------------------------------------------------------------------------------------------
# State sizing (seed 000 "Memory caps")


class _Expected:
    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec

    def state_bytes(self) -> int:
        return estimate_state(self.spec.window).total_bytes


def _window(**changes: Any) -> _Expected:
    base = load_pipeline_str(MINIMAL_TOML)
    return _Expected(replace(base, window=replace(base.window, **changes)).validate())


def test_state_upper_bound_tumbling_is_one_window() -> None:
    spec = _window(duration_ms=60_000, max_groups_per_window=1_000)
    assert spec.state_bytes() > 0
    bigger = _window(duration_ms=60_000, max_groups_per_window=2_000)
    assert bigger.state_bytes() == 2 * spec.state_bytes()
    # Window width alone does not change a tumbling bound.
    assert _window(duration_ms=3_600_000, max_groups_per_window=1_000).state_bytes() \
        == spec.state_bytes()


@pytest.mark.parametrize(("hop_ms", "active"), [(60_000, 1), (30_000, 2), (15_000, 4), (7_000, 9), (1_000, 60)])
def test_state_upper_bound_grows_with_hopping_overlap(hop_ms: int, active: int) -> None:
    one = _window(duration_ms=60_000).state_bytes()
    hopping = _window(kind="hopping", duration_ms=60_000, hop_ms=hop_ms).state_bytes()
    assert hopping == active * one  # ceil(duration / hop) windows hold each row


@pytest.mark.parametrize(
    ("kind", "hop_ms", "allowed", "active"),
    [("tumbling", None, 60_000, 2), ("tumbling", None, 120_000, 3), ("tumbling", None, 1, 2),
     ("hopping", 30_000, 120_000, 6), ("hopping", 20_000, 30_000, 5)],
)
def test_state_upper_bound_grows_with_reopen_retention(kind: str, hop_ms: int | None, allowed: int,
                                                       active: int) -> None:
    one = _window(duration_ms=60_000).state_bytes()
    drop = _window(kind=kind, duration_ms=60_000, hop_ms=hop_ms).state_bytes()
    reopen = _window(kind=kind, duration_ms=60_000, hop_ms=hop_ms, late_data="reopen",
                     allowed_lateness_ms=allowed).state_bytes()
    assert reopen == active * one  # ceil((duration + allowed_lateness) / hop)
    assert reopen > drop


def test_state_upper_bound_counts_windows_held_open_by_lateness() -> None:
    one = _window(duration_ms=60_000).state_bytes()
    # lateness_ms = 10 min keeps the last ~11 one-minute windows open before the watermark passes them.
    assert _window(duration_ms=60_000, lateness_ms=600_000).state_bytes() == 11 * one


def test_state_upper_bound_reflects_aggregation_state() -> None:
    count = _window(aggregations=(Aggregation("count", "n"),)).state_bytes()
    hll14 = _window(aggregations=(Aggregation("count_distinct", "d", column="x"),)).state_bytes()
    hll16 = _window(aggregations=(Aggregation("count_distinct", "d", column="x"),),
                    hll_precision=16).state_bytes()
    exact = _window(aggregations=(Aggregation("count_distinct", "d", column="x", mode="exact",
                                              max_distinct_values_per_group=10_000),)).state_bytes()
    assert count < hll14 < hll16
    assert hll14 >= 10 * (1 << 14)  # ~16 KB per group at p=14, 10 groups
    # an exact set is counted empty, its values as a rate: the spec cannot know how full sets get
    assert count < exact < hll14
    assert estimate_state(replace(load_pipeline_str(MINIMAL_TOML).window, max_groups_per_window=100_000,
                                  aggregations=(Aggregation("count_distinct", "d", column="x", mode="exact",
                                                            max_distinct_values_per_group=100_000),))
                          ).total_bytes < (1 << 30)  # once "894.1 GiB" (two caps multiplied)


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
    SessionWindows.validate(good, "transform.window")  # the valid one passes
    with pytest.raises(PipelineConfigError) as exc:
        SessionWindows.validate(replace(good, **changes), "transform.window")
    assert exc.value.key == f"transform.window.{field}"
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_session_keys_are_refused_on_fixed_windows() -> None:
    base = load_pipeline_str(MINIMAL_TOML).window
    for field in ("gap_ms", "max_session_duration_ms"):
        with pytest.raises(PipelineConfigError) as exc:
            replace(base, **{field: 1_000}).validate()
        assert exc.value.key == f"transform.window.{field}" and "only applies to session windows" in str(exc.value)
