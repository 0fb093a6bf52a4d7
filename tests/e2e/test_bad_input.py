"""Hostile input: one running pipeline fed one file of each hostile kind, nothing stops it.

A hopping pipeline (1 min every 30 s) with a ``[transform] sql`` that casts, a PostgreSQL target,
PostgreSQL dead letters and ``on_unreadable_file = "skip"`` reads, one file per batch:

1. ordinary rows (microsecond timestamps), one in the first seconds of year 1 (its windows start
   in 1 BC);
2. rows written by ``pandas.to_parquet`` (TIMESTAMP(NANOS));
3. a 3,000-byte group key, an event time in year 10000, one in 5000 BC and a page the SQL's
   ``CAST`` fails on;
4. a truncated parquet file; 5. a parquet file whose ``v`` is a STRING;
6. a row of a window the watermark closed (late, dropped) and one the SQL's ``WHERE`` leaves out.

A second source, json, adds in the first batch a row to aggregate, a malformed line, a row the
``CAST`` fails on and a row the ``WHERE`` leaves out.

The run ends normally, and every row read is either aggregated (each in two windows) or
dead-lettered with its reason; each unreadable file is one dead letter. The counters balance
(docs/contract/operations.md#metrics): rows consumed = rows aggregated + late + invalid + future + malformed + rejected
(``sql_error`` among them) + filtered, each row counted once.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tomllib
from pathlib import Path

import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import tomli_w

from ematix_dagster.spark.batch.rejects import MAX_KEY_BYTES
from ematix_dagster.spec import load_pipeline_str
from tests.e2e.lateness_helpers import files_source, metric, run
from tests.e2e.test_rejected_rows import hopping_into_postgres

US = 1_000_000
NOW_US = int(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp()) * US
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.int64()), ("page", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC"))])
SQL = "SELECT id, k, v, CAST(page AS BIGINT) AS page_no, _event_ts, _source FROM source WHERE k <> 'filtered'"
JSON_DDL = "id BIGINT, k STRING, v BIGINT, page STRING, ts TIMESTAMP"


def place(directory: Path, n: int, write) -> None:
    """File ``n`` of the input, written aside and moved in, ordered by modification time."""
    final = directory / f"part-{n:05d}.parquet"
    tmp = directory / f".part-{n:05d}.tmp"
    write(tmp)
    os.replace(tmp, final)
    os.utime(final, (1_700_000_000 + n,) * 2)


def test_hostile_input_is_aggregated_or_dead_lettered_with_its_reason(spark, tmp_path, pg_dsn, pg_schema):
    inp = tmp_path / "in"
    inp.mkdir()
    ordinary = [{"id": i, "k": "ab"[i % 2], "v": i, "page": str(i), "ts": NOW_US + i * 10 * US} for i in range(1, 7)]
    # in the first batch (nothing is late yet): year 1, its windows starting in 1 BC and 0001-01-01
    ordinary.append({"id": 23, "k": "c", "v": 23, "page": "23", "ts": -62_135_596_800 * US + 10 * US})
    place(inp, 0, lambda p: pq.write_table(pa.Table.from_pylist(ordinary, schema=SCHEMA), p))
    nanos = pd.DataFrame({"id": [11, 12], "k": ["a", "b"], "v": [11, 12], "page": ["11", "12"],
                          "ts": pd.to_datetime([NOW_US * 1000 + 70 * US * 1000 + 999, NOW_US * 1000 + 80 * US * 1000 + 1],
                                               utc=True)})
    place(inp, 1, lambda p: nanos.to_parquet(p))  # pandas' default: TIMESTAMP(NANOS)
    hostile = [
        {"id": 21, "k": "x" * (MAX_KEY_BYTES + 1_000), "v": 21, "page": "21", "ts": NOW_US + 90 * US},  # key_too_large
        {"id": 22, "k": "a", "v": 22, "page": "22", "ts": 253_402_300_800 * US},  # year 10000: future
        {"id": 24, "k": "a", "v": 24, "page": "24", "ts": -219_922_905_600 * US},  # 5000 BC: out_of_range
        {"id": 25, "k": "b", "v": 25, "page": "abc", "ts": NOW_US + 95 * US},  # CAST fails: sql_error
    ]
    place(inp, 2, lambda p: pq.write_table(pa.Table.from_pylist(hostile, schema=SCHEMA), p))

    def truncated(p: Path) -> None:
        pq.write_table(pa.Table.from_pylist(ordinary, schema=SCHEMA), p)
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])

    place(inp, 3, truncated)
    drifted = pa.schema([f if f.name != "v" else pa.field("v", pa.string()) for f in SCHEMA])
    place(inp, 4, lambda p: pq.write_table(pa.Table.from_pylist(
        [{**r, "v": str(r["v"]), "id": 30 + r["id"]} for r in ordinary[:3]], schema=drifted), p))

    late = [{"id": 40, "k": "a", "v": 40, "page": "40", "ts": NOW_US + 10 * US},  # its windows closed in batch 2
            {"id": 41, "k": "filtered", "v": 41, "page": "41", "ts": NOW_US + 10 * US}]  # left out before it is late
    place(inp, 5, lambda p: pq.write_table(pa.Table.from_pylist(late, schema=SCHEMA), p))
    js = tmp_path / "js"
    js.mkdir()
    lines = ['{"id": 50, "k": "b", "v": 50, "page": "50", "ts": "2026-01-01T00:01:40Z"}',
             '{"id": 51, "k": "b", "v": 51, "page": "xyz", "ts": "2026-01-01T00:00:20Z"}',  # sql_error
             '{"id": 52, "k": "filtered", "v": 52, "page": "52", "ts": "2026-01-01T00:00:30Z"}',
             '{"id": 53, "k": "b", "v": 53, "page": "53", "ts": "2026-01-01T00:00']  # malformed
    (js / "part-00000.json").write_text("\n".join(lines) + "\n")

    table, dead = f"{pg_schema}.out", f"{pg_schema}.dead"
    doc = tomllib.loads(hopping_into_postgres("hostile", tmp_path, pg_dsn, table, dead))
    doc["transform"]["sql"] = SQL
    doc["sources"][0]["on_unreadable_file"] = "skip"
    doc["sources"].append(files_source("j", js, "json", JSON_DDL))
    spec = load_pipeline_str(tomli_w.dumps(doc))
    summary, registry = run(spec, spark)  # no exception: the run ends normally

    with psycopg.connect(pg_dsn) as conn:
        windows = conn.execute(f"SELECT n, total FROM {table}").fetchall()
        letters = conn.execute(f"SELECT _reason, payload FROM {dead}").fetchall()
    reasons: dict[str, list] = {}
    for reason, payload in letters:
        reasons.setdefault(reason, []).append(payload)
    assert {r: len(p) for r, p in reasons.items()} == {"key_too_large": 1, "future": 1, "out_of_range": 1,
                                                      "sql_error": 2, "unreadable_file": 2, "malformed": 1}
    assert sorted((int(p["id"]), p["_sql_error"], json.loads(p["_source_row"])["page"])
                  for p in reasons["sql_error"]) == [(25, "CAST(page AS BIGINT)", "abc"),
                                                     (51, "CAST(page AS BIGINT)", "xyz")]
    assert sorted(int(p["id"]) for r in ("key_too_large", "future", "out_of_range", "sql_error")
                  for p in reasons[r]) == [21, 22, 24, 25, 51]
    aggregated = sum(n for n, _ in windows) // 2  # each row is in two hopping windows
    readable = [*ordinary, *nanos.to_dict("records"), *hostile, *late]  # the rows of the readable files
    assert summary.rows_in == len(readable) + len(lines)
    assert aggregated == len(ordinary) + len(nanos) + 1  # and id 50 of the json source
    assert sum(t for _, t in windows) == 2 * (sum(r["v"] for r in ordinary) + 11 + 12 + 50)
    assert metric(registry, "unreadable_files_total", pipeline="hostile", source="a") == 2

    # every row consumed is counted once, in one place
    def total(name: str, **labels: str) -> int:
        return int(sum(metric(registry, name, pipeline="hostile", **labels, source=s) for s in ("a", "j")))

    consumed = total("rows_consumed_total")
    late_rows = metric(registry, "late_rows_dropped_total", pipeline="hostile", policy="drop")
    filtered = metric(registry, "rows_filtered_total", pipeline="hostile", reason="where")
    rejected = {r: metric(registry, "rejected_rows_total", pipeline="hostile", reason=r)
                for r in ("sql_error", "key_too_large", "out_of_range")}
    assert (late_rows, filtered, rejected) == (1, 2, {"sql_error": 2, "key_too_large": 1, "out_of_range": 1})
    assert consumed == aggregated + late_rows + total("invalid_event_time_rows_total") + total("future_rows_total") \
        + total("malformed_rows_total") + sum(rejected.values()) + filtered
    assert [r.filtered_rows for r in summary.reports if r.filtered_rows] == [1, 1], "id 52 in batch 0, 41 in the last"
