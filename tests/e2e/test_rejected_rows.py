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
import json
import tomllib
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
import tomli_w

from ematix_dagster.spark.batch.rejects import MAX_KEY_BYTES
from ematix_dagster.spec import load_pipeline_str
from tests.e2e.lateness_helpers import metric, run
from tests.pipeline_toml import postgres_dead_letter, postgres_target, sqlite_store, windowed_pipeline_toml

US = 1_000_000
NOW_US = int(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp()) * US
YEAR_1_US = -62_135_596_800 * US  # 0001-01-01T00:00:00Z
BC_5000_US = -219_922_905_600 * US  # about 5000 BC
YEAR_10000_US = 253_402_300_800 * US  # 10000-01-01T00:00:00Z
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.int64()), ("page", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC"))])


def hopping_into_postgres(name: str, root: Path, pg_dsn: str, table: str, dead: str) -> str:
    """Count + sum(v) per k in 1-minute windows every 30 s into PostgreSQL ``table``, dead letters
    into PostgreSQL ``dead``, SQLite state under ``root``; the run ends with the input, flushed."""
    return windowed_pipeline_toml(
        name, root, window_kind="hopping", duration_ms=60_000, hop_ms=30_000,
        aggregations=[{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"}],
        target=postgres_target(pg_dsn, table), state_store=sqlite_store(root / "state.db"),
        trigger="available_now", end_of_input="flush", extra={"dead_letter": postgres_dead_letter(pg_dsn, dead)})


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
    spec = load_pipeline_str(hopping_into_postgres("rejects", tmp_path, pg_dsn, table, dead))
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


def test_a_failing_sql_expression_dead_letters_its_row_with_the_expression(spark, tmp_path, batch_files, pg_dsn,
                                                                            pg_schema):
    """``CAST(page AS BIGINT)`` on 'abc' (ANSI: CAST_INVALID_INPUT) and ``v DIV 0`` inside the WHERE:
    each bad row goes to the dead letters as ``sql_error`` naming its expression; the others are
    aggregated; an unaliased guarded column keeps the name the SQL gives it."""
    files = batch_files("in")
    rows = [{"id": 1, "k": "a", "v": 1, "page": "10", "ts": NOW_US}, {"id": 2, "k": "a", "v": 2, "page": "abc", "ts": NOW_US},
            {"id": 3, "k": "b", "v": 0, "page": "30", "ts": NOW_US}, {"id": 4, "k": "b", "v": 4, "page": "40", "ts": NOW_US}]
    files.write(pa.Table.from_pylist(rows, schema=SCHEMA))
    sql = ("SELECT k, CAST(page AS BIGINT) AS p, v + 1, v * 2 AS v2, _event_ts, _source FROM source "
           "WHERE 100 DIV v > 0 OR k = 'a'")
    toml = windowed_pipeline_toml(
        "sql-errors", tmp_path, aggregations=[{"agg": "count", "as": "n"}, {"agg": "sum", "column": "p", "as": "ps"},
                                              {"agg": "sum", "column": "v2", "as": "vs"}],
        target=postgres_target(pg_dsn, f"{pg_schema}.out"), state_store=sqlite_store(tmp_path / "state.db"),
        trigger="available_now", end_of_input="flush",
        extra={"dead_letter": postgres_dead_letter(pg_dsn, f"{pg_schema}.dead")})
    doc = tomllib.loads(toml)
    doc["transform"]["sql"] = sql
    toml = tomli_w.dumps(doc)
    spec = load_pipeline_str(toml)
    summary, registry = run(spec, spark)
    with psycopg.connect(pg_dsn) as conn:
        got = conn.execute(f"SELECT k, n, ps, vs FROM {pg_schema}.out ORDER BY k").fetchall()
        letters = conn.execute(f"SELECT _reason, payload FROM {pg_schema}.dead").fetchall()
    assert got == [("a", 1, 10, 2), ("b", 1, 40, 8)]
    assert sorted((reason, payload["_sql_error"]) for reason, payload in letters) == [
        ("sql_error", "100 DIV v"), ("sql_error", "CAST(page AS BIGINT)")]
    assert all("(v + 1)" in payload for _, payload in letters), "columns keep the names the SQL as written gives"
    as_read = {payload["_sql_error"]: json.loads(payload["_source_row"]) for _, payload in letters}
    assert (as_read["CAST(page AS BIGINT)"]["page"], as_read["CAST(page AS BIGINT)"]["id"]) == ("abc", 2), \
        "the value that failed, which the post-SQL row holds as NULL"
    assert (as_read["100 DIV v"]["v"], as_read["100 DIV v"]["_source"]) == (0, "a")
    assert summary.rows_in == len(rows) == sum(n for _, n, _, _ in got) + len(letters)
    assert metric(registry, "rejected_rows_total", pipeline="sql-errors", reason="sql_error") == 2


@pytest.mark.parametrize("pipeline", ["windowed", "rows"])
def test_a_data_error_the_guard_cannot_catch_is_terminal_and_names_the_input(spark, tmp_path, batch_files, pipeline):
    """``-v`` at BIGINT's minimum overflows (ANSI, SQLSTATE 22003) and has no try_ form: the run stops
    with a terminal BatchDataError naming the batch's file, instead of a transient Spark failure
    retried forever; in a windowed pipeline and in a row pipeline (no ``[transform.window]``)."""
    from ematix_dagster.errors import BatchDataError

    files = batch_files("in")
    path = files.write(pa.Table.from_pylist([{"id": 1, "k": "a", "v": -2**63, "page": "p", "ts": NOW_US}],
                                            schema=SCHEMA))
    doc = tomllib.loads(windowed_pipeline_toml("data-error", tmp_path, aggregations=[
        {"agg": "sum", "column": "nv", "as": "s"}], trigger="available_now"))
    doc["transform"]["sql"] = "SELECT k, -v AS nv, _event_ts, _source FROM source"
    if pipeline == "rows":
        doc["transform"] = {"sql": "SELECT k, -v AS nv FROM source", "lateness_ms": 0}
    with pytest.raises(BatchDataError) as failed:
        run(load_pipeline_str(tomli_w.dumps(doc)), spark)
    assert failed.value.terminal and path.name in str(failed.value) and "batch 0" in str(failed.value)
    assert "ARITHMETIC_OVERFLOW" in str(failed.value)


def test_a_tumbling_batch_without_batch_values_rejects_by_the_same_rules(spark, tmp_path, batch_files, pg_dsn,
                                                                         pg_schema, monkeypatch):
    """A tumbling pipeline without SQL runs the plan whose lateness the driver decides
    (``spark.plans.windows.driver_late``), which writes the rejection rules straight into its grouping
    slot: the rejected rows are counted and dead-lettered as the exact plan would, and the newest
    of them, whose event time is valid, moves the watermark (lateness 0: to that event time)."""
    from ematix_dagster.spark.batch import window_call as batch_module

    driver_classed = []
    real = batch_module.late_windows
    monkeypatch.setattr(batch_module, "late_windows", lambda *a: driver_classed.append(1) or real(*a))
    big_key = "x" * (MAX_KEY_BYTES + 1_000)
    rows = [
        (1, "a", 1, NOW_US), (2, "a", 2, NOW_US + 10 * US), (3, "b", 3, NOW_US + 20 * US),
        (4, big_key, 4, NOW_US + 300 * US),  # key_too_large, and the newest event time
        (5, "a", 5, BC_5000_US),  # out_of_range
    ]
    files = batch_files("in")
    files.write(pa.Table.from_pylist([{"id": i, "k": k, "v": v, "page": "p", "ts": ts} for i, k, v, ts in rows],
                                     schema=SCHEMA))
    table, dead = f"{pg_schema}.out", f"{pg_schema}.dead"
    spec = load_pipeline_str(windowed_pipeline_toml(
        "tumbling-rejects", tmp_path, lateness_ms=0,
        aggregations=[{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"}],
        target=postgres_target(pg_dsn, table), state_store=sqlite_store(tmp_path / "state.db"),
        trigger="available_now", extra={"dead_letter": postgres_dead_letter(pg_dsn, dead)}))
    summary, registry = run(spec, spark)

    assert driver_classed == [1], "the batch ran the plan without batch values"
    assert [r.watermark for r in summary.reports] == [NOW_US + 300 * US]
    with psycopg.connect(pg_dsn) as conn:
        got = conn.execute(f"SELECT k, n, total FROM {table} ORDER BY k").fetchall()
        letters = conn.execute(f"SELECT _reason, payload FROM {dead}").fetchall()
    assert got == [("a", 2, 3), ("b", 1, 3)], "the window [NOW, NOW + 1 min) closed at W = NOW + 5 min"
    assert {int(payload["id"]): reason for reason, payload in letters} == {4: "key_too_large", 5: "out_of_range"}
    assert metric(registry, "rejected_rows_total", pipeline="tumbling-rejects", reason="key_too_large") == 1
    assert metric(registry, "rejected_rows_total", pipeline="tumbling-rejects", reason="out_of_range") == 1
