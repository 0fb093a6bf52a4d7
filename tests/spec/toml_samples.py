"""The pipeline specs the tests of tests/spec load and mutate: the reference TOML (docs/contract/toml-reference.md
with a parquet target and no ``${ENV}`` placeholders), a minimal TOML, a spec built in Python and a row pipeline's
TOML, with the helpers that mutate a TOML and check that an error names its key, its bad value and the fix.
"""

from __future__ import annotations

import copy
import re
import tomllib
from typing import Any

import pytest
import tomli_w

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import (
    Aggregation,
    DeadLetter,
    PipelineSpec,
    Run,
    Source,
    StateStoreConfig,
    Target,
    Window,
    load_pipeline_str,
)

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


def mutated_toml(changes: dict[str, Any], base: str | None = None) -> str:
    """``base`` (the reference TOML when None) with ``changes`` applied."""
    doc = tomllib.loads(FULL_TOML if base is None else base)
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
        shape=Window(
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


# A row pipeline (docs/contract/row-pipelines.md): no [transform.window]; checkout clicks are held back 15 minutes of
# event time, the others leave at once. Every [transform] key is written, defaults included.
ROW_TOML = '''
pipeline_name = "delayed-clicks"

[[sources]]
name = "clicks"
kind = "files"
format = "parquet"
path = "data/clicks"
schema = "user_id BIGINT, amount DOUBLE, page STRING, ts TIMESTAMP"
event_time_column = "ts"

[transform]
sql = """SELECT user_id, amount, page, _event_ts FROM source
WHERE (page = 'checkout' AND _event_ts + INTERVAL 15 MINUTES <= WATERMARK_TS()) OR page <> 'checkout'"""
lateness_ms = 10_000
source_idleness_ms = 30_000
time_mode = "event"
event_time_column = "_event_ts"
event_time_unit = "ms"
max_buffered_rows = 100_000

[target]
kind = "postgres"
url = "postgresql://ematix@127.0.0.1:5432/ematix"
table = "public.clicks_delayed"
create_table = true
key = ["user_id", "page"]

[dead_letter]
kind = "parquet"
path = "data/dlq/delayed-clicks"

[state_store]
kind = "sqlite"
path = ".ematix/state.db"

[run]
checkpoint_location = ".ematix/checkpoints/delayed-clicks"
end_of_input = "flush"
'''

