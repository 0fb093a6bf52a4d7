"""Rows a PostgreSQL target cannot hold are dead-lettered with a reason, never fail a batch forever.

One batch into a PostgreSQL target and PostgreSQL dead letters holds, besides ordinary rows: a row
whose group key is 3,000 bytes (a btree entry holds 2,704: ``key_too_large``), a row in 5000 BC
(its window starts before PostgreSQL's 4713 BC: ``out_of_range``), a row in year 10000 (beyond
the future skew: ``future``, written although Python's datetime stops at 9999) and a row in the
first minute of year 1 (its hopping windows start in 1 BC, which PostgreSQL holds: aggregated).
The run must finish, and rows in = rows aggregated + rows dead-lettered, each with its reason.
"""

from __future__ import annotations

import datetime as dt

import psycopg
import pyarrow as pa
import pytest

from ematix_dagster.spark.rejects import MAX_KEY_BYTES
from ematix_dagster.spec import load_pipeline_str
from tests.pipeline_toml import postgres_target, sqlite_store, windowed_pipeline_toml
from tests.test_lateness_e2e import metric, run

US = 1_000_000
NOW_US = int(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp()) * US
YEAR_1_US = -62_135_596_800 * US  # 0001-01-01T00:00:00Z
BC_5000_US = -219_922_905_600 * US  # about 5000 BC
YEAR_10000_US = 253_402_300_800 * US  # 10000-01-01T00:00:00Z
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.int64()), ("page", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC"))])


def test_rows_the_target_cannot_hold_are_dead_lettered(spark, tmp_path, batch_files, pg_dsn, pg_schema):
    big_key = "x" * (MAX_KEY_BYTES + 1_000)
    rows = [
        (1, "a", 1, NOW_US), (2, "a", 2, NOW_US + 10 * US), (3, "b", 3, NOW_US + 20 * US),
        (4, big_key, 4, NOW_US + 30 * US),  # key_too_large
        (5, "a", 5, BC_5000_US),  # out_of_range: a window before 4713 BC
        (6, "a", 6, YEAR_10000_US),  # future (beyond max_future_skew_ms)
        (7, "c", 7, YEAR_1_US + 10 * US),  # aggregated: windows from 1 BC
    ]
    files = batch_files("in")
    files.write(pa.Table.from_pylist([{"id": i, "k": k, "v": v, "page": "p", "ts": ts} for i, k, v, ts in rows],
                                     schema=SCHEMA))
    table, dead = f"{pg_schema}.out", f"{pg_schema}.dead"
    toml = windowed_pipeline_toml(
        "rejects", tmp_path, window_kind="hopping", duration_ms=60_000, hop_ms=30_000,
        aggregations=[{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"}],
        target=postgres_target(pg_dsn, table), state_store=sqlite_store(tmp_path / "state.db"),
        trigger="available_now", end_of_input="flush",
        extra={"dead_letter": {"kind": "postgres", "url": pg_dsn, "table": dead, "create_table": True}})
    spec = load_pipeline_str(toml)
    summary, registry = run(spec, spark)
    assert summary.rows_in == len(rows)

    with psycopg.connect(pg_dsn) as conn:
        got = conn.execute(f"SELECT to_char(window_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS BC'), k, n, total "
                           f"FROM {table} ORDER BY window_start, k").fetchall()
        conn.execute("SET TIME ZONE 'UTC'")
        letters = conn.execute(f"SELECT _reason, _event_ts::text, payload FROM {dead} ORDER BY payload->>'id'").fetchall()
    # each accepted row is in two hopping windows (1 min every 30 s)
    aggregated = {r[0] for r in rows} - {4, 5, 6}
    assert sum(n for _, _, n, _ in got) == 2 * len(aggregated)
    assert ("0001-12-31 23:59:30 BC", "c", 1, 7) in got and ("0001-01-01 00:00:00 AD", "c", 1, 7) in got
    reasons = {int(payload["id"]): reason for reason, _, payload in letters}
    assert reasons == {4: "key_too_large", 5: "out_of_range", 6: "future"}
    assert len(aggregated) + len(reasons) == len(rows), "rows in = rows aggregated + rows dead-lettered"
    by_id = {int(payload["id"]): (ts, payload) for _, ts, payload in letters}
    assert by_id[6][0] == "10000-01-01 00:00:00+00", "year 10000 is stored (psycopg cannot read it as a datetime)"
    assert by_id[5][0] is None and by_id[5][1]["_event_ts"].endswith(" BC"), "5000 BC is kept in the payload"
    assert metric(registry, "rejected_rows_total", pipeline="rejects", reason="key_too_large") == 1
    assert metric(registry, "rejected_rows_total", pipeline="rejects", reason="out_of_range") == 1
    assert metric(registry, "dead_letter_rows_total", pipeline="rejects", reason="future") == 1


@pytest.mark.parametrize("micros, text", [
    (YEAR_10000_US, "10000-01-01 00:00:00.000000+00"),
    (YEAR_1_US - 30 * US, "0001-12-31 23:59:30.000000+00 BC"),
])
def test_instants_python_cannot_hold_are_written_as_postgres_text(pg_dsn, micros, text):
    from ematix_dagster.targets.pg_types import postgres_timestamp_text, python_values

    assert postgres_timestamp_text(micros) == text
    [value] = python_values(pa.chunked_array([pa.array([micros], pa.timestamp("us", tz="UTC"))]))
    with psycopg.connect(pg_dsn) as conn:  # PostgreSQL reads the text back as the same instant
        back = conn.execute("SELECT (extract(epoch FROM %s::timestamptz) * 1000000)::bigint", (value,)).fetchone()[0]
    assert back == micros
