"""A day of windows rewritten from archived input after a fix (docs/contract/backfill.md), against pandas.

One pipeline (hourly tumbling windows per ``k``, count and sum of ``v``, PostgreSQL target and
dead-letter table in one database, ``late_data = "dlq"``, SQLite store) streams three files:
2024-01-01, then 2024-01-02 with a row of 01-01 that arrives late (a dead letter), then 2024-01-03
01:00, which moves the watermark past 01-02, with a late row of 01-02. The archive holds every row
plus a file that never streamed. Then the SQL is "fixed" (``v * 10``, which overflows on one row
of 01-01, ``k = 'c'`` left out) and 2024-01-01 is backfilled from the archive:

* refused first, with nothing written: 2024-01-03 (the streaming state still holds its windows),
  a range before ``[backfill] start``, and a second backfill while the lock is held;
* ``SIGKILL`` inside the backfill's transaction (``ematix-dagster backfill`` in its own process
  group, fault point ``backfill_commit:range``): the table is exactly as before;
* then the backfill itself: the day's rows equal pandas over the archive's rows of that day
  under the new SQL (the late row and the unstreamed file included: nothing is late in a
  backfill), every other row is byte-equal to before; the day's dead letters are replaced in the
  same transaction (its late row gone, the overflow a ``sql_error``), 01-02's late row stays;
  the backfill asset's ``rewritten_range`` check, reading the day back from the table, passes.
"""

from __future__ import annotations

import datetime as dt
import signal
import tomllib
from pathlib import Path

import dagster as dg
import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomli_w

from ematix_dagster.backfill import run_backfill
from ematix_dagster.backfill.lock import lock_name
from ematix_dagster.dagster.checks import evaluate_rewritten_range
from ematix_dagster.errors import BackfillBusy, BackfillRefused
from ematix_dagster.spec import load_pipeline_str
from tests.conftest import BatchFiles
from tests.e2e.lateness_helpers import SCHEMA, row, run
from tests.e2e.test_crash_recovery import finish, start_run, wait_group_gone
from tests.pipeline_toml import postgres_dead_letter, postgres_target, windowed_pipeline_toml

UTC = dt.timezone.utc
STREAMED_SQL = "SELECT k, v, _event_ts, _source FROM source"
OVERFLOW = 500  # the row whose v * 10 leaves BIGINT: a sql_error of the fixed SQL only
FIXED_SQL = "SELECT k, v * 10 AS v, _event_ts, _source FROM source WHERE k <> 'c'"


def at(day: int, hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2024, 1, day, hour, minute, tzinfo=UTC)


def day_rows(day: int, first_id: int) -> list[dict]:
    """Rows over the day's hours for keys a, b, c (one NULL v), deterministic."""
    rows = []
    for i in range(36):
        hour, minute = (i * 7) % 24, (i * 13) % 60
        rows.append(row(first_id + i, "abc"[i % 3], None if i == 5 else i, at(day, hour, minute)))
    return rows


def pipeline(root: Path, pg_dsn: str, schema: str, sql: str) -> str:
    """The pipeline's TOML text with ``sql`` (also written to ``root/backfilled.toml`` for the CLI)."""
    doc = tomllib.loads(windowed_pipeline_toml(
        "backfilled", root, duration_ms=3_600_000, lateness_ms=600_000, distinct_mode=None, late_data="dlq",
        aggregations=[{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "s"}],
        target=postgres_target(pg_dsn, f"{schema}.hourly"), trigger="available_now",
        extra={"backfill": {"partition": "daily", "start": "2024-01-01",
                            "sources": [{"name": "a", "path": str(root / "archive")}]},
               "dead_letter": postgres_dead_letter(pg_dsn, f"{schema}.dead")}))
    doc["transform"]["sql"] = sql
    text = tomli_w.dumps(doc)
    (root / "backfilled.toml").write_text(text)
    return text


def table_text(pg_dsn: str, schema: str) -> list[tuple]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(f"SELECT window_start, k, t::text FROM {schema}.hourly AS t "
                            "ORDER BY window_start, k").fetchall()


def dead_letters(pg_dsn: str, schema: str) -> list[tuple]:
    """(event time, reason, batch id) of every dead letter (the event times here are unique)."""
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(f"SELECT _event_ts, _reason, _batch_id FROM {schema}.dead ORDER BY 1").fetchall()


def expected_day(archive: list[dict], day: int) -> list[tuple]:
    """pandas: the fixed SQL over the archive's rows of the day, hourly windows per k."""
    df = pd.DataFrame(archive)
    df = df[(df.ts >= at(day, 0)) & (df.ts < at(day + 1, 0)) & (df.k != "c") & (df.id != OVERFLOW)].copy()
    df["v"] = df.v * 10
    df["start"] = df.ts.dt.floor("h")
    out = df.groupby(["start", "k"]).agg(n=("id", "size"), s=("v", lambda s: None if s.isna().all() else int(s.sum())))
    return [(start.to_pydatetime(), k, int(r.n), r.s) for (start, k), r in out.iterrows()]


@pytest.mark.slow
def test_a_fixed_day_is_rewritten_from_the_archive_and_nothing_else_moves(spark, tmp_path, pg_dsn, pg_schema):
    day1 = [*day_rows(1, 0), row(OVERFLOW, "b", 2**61, at(1, 6, 6))]
    day2, day3 = day_rows(2, 100), [row(200, "a", 1, at(3, 1)), row(201, "b", 2, at(2, 5))]  # 201: late, of 01-02
    late = row(300, "a", 1000, at(1, 3, 30))  # streams with day 2: the watermark is past its window
    never_streamed = [row(400, "b", 5, at(1, 4, 10)), row(401, "c", 6, at(1, 4, 20)), row(402, "d", 7, at(1, 23, 59))]
    stream = BatchFiles(tmp_path / "in")
    for rows in (day1, [*day2, late], day3):
        stream.write(rows, schema=SCHEMA)
    archive = [*day1, *day2, late, *day3, *never_streamed]
    (tmp_path / "archive").mkdir()
    pq.write_table(pa.Table.from_pylist(archive[:50], schema=SCHEMA), tmp_path / "archive" / "a.parquet")
    pq.write_table(pa.Table.from_pylist(archive[50:], schema=SCHEMA), tmp_path / "archive" / "b.parquet")

    streamed = load_pipeline_str(pipeline(tmp_path, pg_dsn, pg_schema, STREAMED_SQL))
    summary, _ = run(streamed, spark)
    assert summary.late_rows == 2, "the late rows of 01-01 and 01-02 were dead-lettered by the stream"
    before, letters_before = table_text(pg_dsn, pg_schema), dead_letters(pg_dsn, pg_schema)
    assert letters_before == [(at(1, 3, 30), "late", 1), (at(2, 5), "late", 2)]
    toml = tmp_path / "backfilled.toml"
    fixed = load_pipeline_str(pipeline(tmp_path, pg_dsn, pg_schema, FIXED_SQL))

    # refusals, before any work
    with pytest.raises(BackfillRefused, match="still holds windows of the range .*2024-01-03T00:00:00Z"):
        run_backfill(fixed, "2024-01-03", "2024-01-04", spark=spark)
    with pytest.raises(BackfillRefused, match=r"before \[backfill\] start = 2024-01-01T00:00:00Z"):
        run_backfill(fixed, "2023-12-31", "2024-01-02", spark=spark)
    with psycopg.connect(pg_dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (lock_name("backfilled"),))
        with pytest.raises(BackfillBusy, match="another backfill of it is running") as busy:
            run_backfill(fixed, "2024-01-01", "2024-01-02", spark=spark)
        assert not busy.value.terminal
    assert table_text(pg_dsn, pg_schema) == before and dead_letters(pg_dsn, pg_schema) == letters_before

    # killed inside its transaction: nothing of it is visible
    proc = start_run(toml, "--from", "2024-01-01", "--to", "2024-01-02", command="backfill",
                     EMATIX_FAULT_POINTS="backfill_commit:range", EMATIX_FAULT_DIR=str(tmp_path / "faults"))
    err = finish(proc)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    assert wait_group_gone(proc.pid) == []
    assert table_text(pg_dsn, pg_schema) == before and dead_letters(pg_dsn, pg_schema) == letters_before

    lines: list[str] = []
    result = run_backfill(fixed, "2024-01-01", "2024-01-02", spark=spark, progress=lines.append)
    # its log speaks of the backfill: no streaming guarantee, no bound of a state that outlives no run
    assert lines[0] == ("[backfilled] backfill [2024-01-01T00:00:00Z, 2024-01-02T00:00:00Z): recomputing its windows "
                        "in one run over the archived input; the target's rows of the range are replaced in one "
                        "transaction at the end"), lines
    assert not [line for line in lines if "guarantee:" in line or "warning:" in line], lines
    after = table_text(pg_dsn, pg_schema)
    jan_2 = at(2, 0)
    assert [r for r in after if r[0] >= jan_2] == [r for r in before if r[0] >= jan_2], "rows outside the day moved"
    with psycopg.connect(pg_dsn) as conn:
        got = conn.execute(f"SELECT window_start, k, n, s FROM {pg_schema}.hourly WHERE window_start < %s "
                           "ORDER BY window_start, k", (jan_2,)).fetchall()
    expected = expected_day(archive, 1)
    assert got == expected
    assert any(k == "a" and start == at(1, 3) and s is not None and s >= 10_000 for start, k, _, s in got), \
        "the late row counts in the backfill"
    assert result.rows_written == len(expected) and result.windows == len({start for start, *_ in expected})
    assert result.rows_deleted == sum(1 for r in before if r[0] < jan_2)
    assert {"window_start", "k", "n", "s"} <= set(result.schema.names)  # the backfill asset's column schema
    # the backfill asset's check reads the range back from the table
    check = evaluate_rewritten_range(dg.AssetKey("backfilled-backfill"), fixed, at(1, 0), jan_2, str(result.span),
                                     result.rows_written)
    assert check.passed, check.description
    assert check.description == (f"the target holds {len(expected)} rows of {result.span}; "
                                 f"the backfill wrote {len(expected)}")
    # the day's dead letters replaced in the same transaction: its late row counted now, the fixed SQL's
    # overflow dead-lettered (as a backfill's, _batch_id -1); 01-02's late row untouched
    assert dead_letters(pg_dsn, pg_schema) == [(at(1, 6, 6), "sql_error", -1), (at(2, 5), "late", 2)]
    with psycopg.connect(pg_dsn) as conn:
        (source_row,) = conn.execute(f"SELECT payload->>'_source_row' FROM {pg_schema}.dead WHERE _batch_id = -1").fetchone()
    assert f'"id": {OVERFLOW}' in source_row.replace('":', '": ') or f'"id":{OVERFLOW}' in source_row, source_row
    assert result.dead_letters == 1
