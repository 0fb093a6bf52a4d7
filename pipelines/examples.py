"""The example pipelines in Python: the facade gives the same specs as the TOML files next to it.

``load_pipeline("pipelines/clicks_per_minute.toml") == clicks_per_minute.spec`` (and likewise for
the others; a test keeps them in step). ``${EMATIX_PG_URL}`` stays a placeholder, resolved when
the target connects, so no secret ever lands in a spec, a dump or a code version.
"""

from __future__ import annotations

import os

from ematix_dagster import (
    Aggregation,
    Backfill,
    DeadLetter,
    EmitRelease,
    RowTransform,
    Run,
    Source,
    StateStoreConfig,
    Target,
    Window,
    streaming_pipeline,
)

#: Safe local defaults (override them in the environment).
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
os.environ.setdefault("EMATIX_PG_URL", DEFAULT_PG_URL)

CLICKS_SCHEMA = "user_id BIGINT, amount DOUBLE, page STRING, ts TIMESTAMP"
#: the same files, read with the customer's tier (older files have none: NULL, embargoed)
TIERED_CLICKS_SCHEMA = "user_id BIGINT, amount DOUBLE, page STRING, tier STRING, ts TIMESTAMP"
ORDERS_SCHEMA = "order_id BIGINT, user_id BIGINT, amount DOUBLE, ts TIMESTAMP"
PAYMENTS_SCHEMA = "payment_id BIGINT, card_id BIGINT, amount DOUBLE, merchant STRING, ts TIMESTAMP"
LOCAL_STATE = StateStoreConfig(kind="sqlite", path=".ematix/state.db")


@streaming_pipeline(
    name="clicks-per-minute",
    sources=[Source(name="clicks", kind="files", format="parquet", path=".ematix/data/clicks", schema=CLICKS_SCHEMA,
                    event_time_column="ts", max_files_per_trigger=1)],
    transform_sql="SELECT user_id, amount, page, _event_ts, _source FROM source WHERE amount >= 0",
    window=Window(kind="tumbling", duration_ms=60_000, lateness_ms=10_000, source_idleness_ms=60_000,
                  group_by=("user_id",), late_data="drop", max_groups_per_window=100_000,
                  aggregations=(Aggregation(agg="count", as_="clicks"),
                                Aggregation(agg="sum", column="amount", as_="amount_sum"),
                                Aggregation(agg="count_distinct", column="page", as_="unique_pages"))),
    target=Target(kind="postgres", url="${EMATIX_PG_URL}", table="public.user_clicks_1min", create_table=True),
    state_store=LOCAL_STATE,
    run=Run(trigger="processing_time", trigger_interval_ms=1_000,
            checkpoint_location=".ematix/checkpoints/clicks-per-minute"),
    backfill=Backfill(partition="daily", start="2025-01-01"),
)
def clicks_per_minute():
    """Clicks per user per minute, upserted into PostgreSQL (tumbling 1-minute windows).
    Long-running (processing_time): keep it alive with the clicks_per_minute_keep_alive sensor."""


@streaming_pipeline(
    name="clicks-hopping-5min",
    sources=[Source(name="clicks", kind="files", format="parquet", path=".ematix/data/clicks", schema=CLICKS_SCHEMA,
                    event_time_column="ts", max_files_per_trigger=4)],
    window=Window(kind="hopping", duration_ms=300_000, hop_ms=60_000, lateness_ms=10_000, group_by=("page",),
                  max_groups_per_window=10_000,
                  aggregations=(Aggregation(agg="count", as_="clicks"),
                                Aggregation(agg="count_distinct", column="user_id", as_="unique_users"),
                                Aggregation(agg="avg", column="amount", as_="amount_avg"))),
    target=Target(kind="parquet", path=".ematix/output/clicks-hopping-5min"),
    state_store=LOCAL_STATE,
    run=Run(trigger="available_now", checkpoint_location=".ematix/checkpoints/clicks-hopping-5min", end_of_input="keep"),
)
def clicks_hopping_5min():
    """Clicks per page in 5-minute windows every minute (hopping), written to Parquet batch directories.
    Batch-style (available_now): each run processes what arrived since the last; scheduled."""


@streaming_pipeline(
    name="user-sessions",
    sources=[Source(name="clicks", kind="files", format="parquet", path=".ematix/data/clicks", schema=CLICKS_SCHEMA,
                    event_time_column="ts", max_files_per_trigger=4)],
    window=Window(kind="session", gap_ms=30_000, max_session_duration_ms=3_600_000, lateness_ms=10_000,
                  group_by=("user_id",), late_data="dlq", max_groups_per_window=100_000,
                  aggregations=(Aggregation(agg="count", as_="clicks"),
                                Aggregation(agg="count_distinct", column="page", as_="pages", mode="exact",
                                            max_distinct_values_per_group=1_000),
                                Aggregation(agg="sum", column="amount", as_="amount_sum"))),
    target=Target(kind="parquet", path=".ematix/output/user-sessions"),
    dead_letter=DeadLetter(kind="parquet", path=".ematix/dead_letters/user-sessions"),
    state_store=LOCAL_STATE,
    run=Run(trigger="available_now", checkpoint_location=".ematix/checkpoints/user-sessions", end_of_input="keep"),
)
def user_sessions():
    """Browsing sessions per user: a session ends after 30 s without a click, and none runs across a
    full hour (docs/contract/windows.md). Batch-style (available_now), written to Parquet batch directories."""


@streaming_pipeline(
    name="card-payments",
    sources=[Source(name="payments", kind="files", format="parquet", path=".ematix/data/payments",
                    schema=PAYMENTS_SCHEMA, event_time_column="ts", max_files_per_trigger=4)],
    window=Window(kind="sliding", duration_ms=600_000, lateness_ms=10_000, group_by=("card_id",), late_data="dlq",
                  max_events_per_group=10_000, max_groups_per_window=100_000,
                  aggregations=(Aggregation(agg="count", as_="payments"),
                                Aggregation(agg="sum", column="amount", as_="amount_sum"),
                                Aggregation(agg="count_distinct", column="merchant", as_="merchants", mode="exact",
                                            max_distinct_values_per_group=1_000),
                                Aggregation(agg="max", column="amount", as_="amount_max"))),
    target=Target(kind="parquet", path=".ematix/output/card-payments"),
    dead_letter=DeadLetter(kind="parquet", path=".ematix/dead_letters/card-payments"),
    state_store=LOCAL_STATE,
    run=Run(trigger="available_now", checkpoint_location=".ematix/checkpoints/card-payments", end_of_input="keep"),
)
def card_payments():
    """Payments per card in the 10 minutes before each payment: one sliding window [t - 10 min, t] per
    distinct payment time t of a card (docs/contract/windows.md, KIP-450). Batch-style (available_now), written to
    Parquet batch directories."""


@streaming_pipeline(
    name="revenue-per-channel",
    sources=[Source(name="web", kind="files", format="parquet", path=".ematix/data/orders-web", schema=ORDERS_SCHEMA,
                    event_time_column="ts", max_files_per_trigger=1),
             Source(name="mobile", kind="files", format="parquet", path=".ematix/data/orders-mobile",
                    schema=ORDERS_SCHEMA, event_time_column="ts", max_files_per_trigger=1)],
    transform_sql="SELECT order_id, user_id, amount, _source AS channel, _event_ts, _source FROM source",
    window=Window(kind="tumbling", duration_ms=60_000, lateness_ms=5_000, source_idleness_ms=30_000,
                  group_by=("channel",), max_groups_per_window=100,
                  aggregations=(Aggregation(agg="count", as_="orders"),
                                Aggregation(agg="sum", column="amount", as_="revenue"),
                                Aggregation(agg="count_distinct", column="user_id", as_="buyers"))),
    target=Target(kind="parquet", path=".ematix/output/revenue-per-channel"),
    state_store=LOCAL_STATE,
    run=Run(trigger="processing_time", trigger_interval_ms=1_000,
            checkpoint_location=".ematix/checkpoints/revenue-per-channel"),
)
def revenue_per_channel():
    """Orders per sales channel per minute from two sources (web and mobile): the global watermark is
    the slower source's, and a source quiet for 30 s stops holding it back."""


@streaming_pipeline(
    name="embargoed-clicks",
    sources=[Source(name="clicks", kind="files", format="parquet", path=".ematix/data/clicks",
                    schema=TIERED_CLICKS_SCHEMA, event_time_column="ts", max_files_per_trigger=1)],
    transform_sql="""SELECT user_id, page, amount, tier, _event_ts FROM source
WHERE tier = 'realtime' OR _event_ts + INTERVAL 15 MINUTES <= WATERMARK_TS()""",
    rows=RowTransform(lateness_ms=10_000, max_buffered_rows=100_000),
    target=Target(kind="parquet", path=".ematix/output/embargoed-clicks"),
    dead_letter=DeadLetter(kind="parquet", path=".ematix/dead_letters/embargoed-clicks"),
    state_store=LOCAL_STATE,
    run=Run(trigger="available_now", checkpoint_location=".ematix/checkpoints/embargoed-clicks", end_of_input="keep"),
)
def embargoed_clicks():
    """The embargo: each click is published 15 minutes (of event time) after it happened, unless the customer is
    realtime (published at once). A row pipeline: held-back clicks wait in the state store until the watermark
    reaches them (docs/contract/row-pipelines.md). Batch-style (available_now), written to Parquet batch
    directories."""


@streaming_pipeline(
    name="clicks-hourly-delayed",
    sources=[Source(name="clicks", kind="files", format="parquet", path=".ematix/data/clicks",
                    schema=TIERED_CLICKS_SCHEMA, event_time_column="ts", max_files_per_trigger=1)],
    window=Window(kind="tumbling", duration_ms=3_600_000, lateness_ms=60_000, late_data="reopen",
                  allowed_lateness_ms=3_600_000, group_by=("user_id",), max_groups_per_window=100_000,
                  aggregations=(Aggregation(agg="count", as_="clicks"),
                                Aggregation(agg="sum", column="amount", as_="spend"))),
    target=Target(kind="parquet", path=".ematix/output/clicks-hourly-delayed"),
    state_store=LOCAL_STATE,
    run=Run(trigger="available_now", checkpoint_location=".ematix/checkpoints/clicks-hourly-delayed",
            end_of_input="keep"),
    emit=EmitRelease(sql="SELECT * FROM windows WHERE window_end + INTERVAL 1 HOUR <= WATERMARK_TS()",
                     max_buffered_rows=1_000_000),
)
def clicks_hourly_delayed():
    """The delayed tier: clicks and spend per user and hour, each hourly window published one hour (of event
    time) after it closes. Its rows wait in the state store until the watermark reaches window_end + 1 hour
    (docs/contract/delayed-windows.md). Batch-style (available_now), written to Parquet batch directories."""


@streaming_pipeline(
    name="clicks-redis",
    sources=[Source(name="clicks", kind="redis_stream", url="redis://127.0.0.1:6379/0", streams=("ematix:clicks",),
                    start="earliest", max_entries_per_trigger=50_000, format="json", json_field="data",
                    schema=CLICKS_SCHEMA, event_time_column="ts")],
    window=Window(kind="tumbling", duration_ms=60_000, lateness_ms=10_000, group_by=("page",),
                  max_groups_per_window=10_000,
                  aggregations=(Aggregation(agg="count", as_="clicks"),
                                Aggregation(agg="count_distinct", column="user_id", as_="unique_users"),
                                Aggregation(agg="sum", column="amount", as_="amount_sum"))),
    target=Target(kind="parquet", path=".ematix/output/clicks-redis"),
    dead_letter=DeadLetter(kind="parquet", path=".ematix/dead-letters/clicks-redis"),
    state_store=LOCAL_STATE,
    run=Run(trigger="available_now", checkpoint_location=".ematix/checkpoints/clicks-redis"),
)
def clicks_redis():
    """Clicks per page per minute from the Redis stream ``ematix:clicks`` (JSON events, fed by
    ``python -m pipelines.redis_producer``), written to Parquet batch directories. Batch-style (available_now)."""


PIPELINES = {p.spec.pipeline_name: p for p in (clicks_per_minute, clicks_hopping_5min, user_sessions,
                                                card_payments, revenue_per_channel, embargoed_clicks,
                                                clicks_hourly_delayed, clicks_redis)}
