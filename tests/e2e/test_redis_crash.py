"""A redis_stream pipeline killed (SIGKILL, driver and JVM) mid-run and restarted loses and
duplicates nothing: the final PostgreSQL target equals the pandas oracle fed with the batches
Spark formed (rebuilt from its offsets; tests/e2e/redis_helpers.py)."""

from __future__ import annotations

import pandas as pd
import psycopg
import pytest
import redis

from ematix_dagster.spec import load_pipeline
from tests import oracle
from tests.e2e.lateness_helpers import at, oracle_params, row
from tests.e2e.redis_helpers import RedisFeed, redis_source
from tests.e2e.test_crash_recovery import run_until_done
from tests.pipeline_toml import postgres_store, postgres_target, windowed_pipeline_toml
from tests.redis_server import stream_name

KILLS = "store_commit:2"


@pytest.mark.slow
def test_sigkill_and_restart_exact(redis_url, pg_dsn, pg_schema, tmp_path):
    feed = RedisFeed(redis.Redis.from_url(redis_url, decode_responses=True))
    stream = stream_name("crash")
    for i in range(30):
        feed.json_row("a", stream, row(i, f"k{i % 3}", i, at(0, 7 * i)))
        if i in (14, 24):
            feed.json_row("a", stream, row(100 + i, "k1", 5, at(0, 10)))  # late by then
    source = redis_source("a", redis_url, [stream], event_time_column="ts", max_entries_per_trigger=6)
    text = windowed_pipeline_toml(
        "redis_crash", tmp_path, lateness_ms=5_000, distinct_mode=None,
        aggregations=[{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"}],
        target=postgres_target(pg_dsn, f"{pg_schema}.crash"), state_store=postgres_store(pg_dsn, pg_schema),
        trigger="available_now", end_of_input="flush", extra={"sources": [source]})
    toml = tmp_path / "p.toml"
    toml.write_text(text)
    assert run_until_done(toml, tmp_path / "faults", KILLS) == 1

    spec = load_pipeline(toml)
    result = oracle.run(feed.batches(spec.run.checkpoint_location, ["a"]), oracle_params(spec))
    assert result.counters["late_rows"] == 2
    expected = {}
    for batch_id in sorted(result.emitted):
        for r in result.emitted[batch_id]:
            expected[(r["window_start"], r["k"])] = (r["n"], r["total"])
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT window_start, k, n, total FROM {pg_schema}.crash").fetchall()
    assert {(int(pd.Timestamp(ws).value // 1000), k): (n, total) for ws, k, n, total in rows} == expected

