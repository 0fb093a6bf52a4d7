"""End-to-end windowed aggregations on real local Spark, checked row by row against pandas.

Every test writes parquet micro-batches with ``batch_files`` (file i = micro-batch i), runs a
pipeline built from a TOML string with :class:`PipelineRunner`, reads the target back and compares
EVERY emitted row with a ground truth computed independently of the engine (tests/e2e/windows_helpers.py): each
event is assigned to its windows with a plain loop (every multiple of the hop in ``(t - D, t]``), then a
pandas ``groupby`` over (window start, group columns) with ``dropna=False`` aggregates each group
with plain Python. Rows arrive in order (no row is late), so the expected output is exactly the
per-(window, group) aggregation of the windows the watermark passed (or of all windows, with
``end_of_input = "flush"``).

Spark runs in this file: 7 (each costs a few seconds); two run both ways a batch of few bytes may be read
(``reads``); caps and overflow: test_window_caps.py.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg import sql

from tests.e2e.windows_helpers import (
    T0_US,
    TS_TYPE,
    S,
    assert_rows_match,
    assert_source_log,
    at,
    ground_truth,
    parquet_target,
    pipeline,
    read_parquet_target,
    run,
    to_us,
)


@pytest.fixture(params=["one_task", "spark_split"])
def reads(request, spark):
    """How a batch of few bytes is read: in one task without a shuffle (the engine's way,
    ``spark/batch/batch_shuffle.py``), or as Spark splits files, with the partial aggregation's shuffle
    (any opening cost below the files' bytes)."""
    if request.param == "spark_split":
        spark.conf.set("spark.sql.files.openCostInBytes", "1")
    yield request.param
    spark.conf.unset("spark.sql.files.openCostInBytes")


# ---------------------------------------------------------------------------------------------
# 1. Tumbling windows, every aggregator, NULL keys, two group columns, renamed window columns

CLICK_SCHEMA = pa.schema([
    ("user_id", pa.int64()), ("page", pa.string()), ("qty", pa.int64()), ("amount", pa.float64()),
    ("tag", pa.string()), ("n_int", pa.int32()), ("n_str", pa.string()), ("ts", TS_TYPE),
])
CLICK_DDL = ("user_id BIGINT, page STRING, qty BIGINT, amount DOUBLE, tag STRING, n_int INT, "
             "n_str STRING, ts TIMESTAMP")

ALL_AGGS: list[dict[str, Any]] = [
    {"agg": "count", "as": "n"},
    {"agg": "sum", "column": "qty", "as": "qty_sum"},
    {"agg": "count_col", "column": "amount", "as": "amount_n"},
    {"agg": "sum", "column": "amount", "as": "amount_sum"},
    {"agg": "min", "column": "amount", "as": "amount_min"},
    {"agg": "max", "column": "qty", "as": "qty_max"},
    {"agg": "min", "column": "tag", "as": "tag_min"},
    {"agg": "avg", "column": "amount", "as": "amount_avg"},
    {"agg": "first", "column": "tag", "as": "tag_first"},
    {"agg": "last", "column": "tag", "as": "tag_last"},
    {"agg": "first", "column": "amount", "as": "amount_first"},
    {"agg": "last", "column": "qty", "as": "qty_last"},
    {"agg": "count_distinct", "column": "tag", "as": "tags_exact", "mode": "exact",
     "max_distinct_values_per_group": 100},
    {"agg": "count_distinct", "column": "tag", "as": "tags_approx", "mode": "approximate"},
    {"agg": "count_distinct", "column": "n_int", "as": "n_int_exact", "mode": "exact",
     "max_distinct_values_per_group": 100},
    {"agg": "count_distinct", "column": "n_str", "as": "n_str_exact", "mode": "exact",
     "max_distinct_values_per_group": 100},
    {"agg": "count_distinct", "column": "n_int", "as": "n_int_approx"},
    {"agg": "count_distinct", "column": "n_str", "as": "n_str_approx"},
]


def click(t: float, user_id=None, page=None, qty=None, amount=None, tag=None, n_int=None, n_str=None) -> dict:
    return {"user_id": user_id, "page": page, "qty": qty, "amount": amount, "tag": tag, "n_int": n_int,
            "n_str": n_str, "ts": at(t)}


def random_clicks(rng: random.Random, lo: int, hi: int, n: int) -> list[dict]:
    """Integer-second times in [lo, hi] (so event-time ties are common), every column nullable."""
    return [click(rng.randint(lo, hi),
                  user_id=rng.choice([1, 2, 3, None]),
                  page=rng.choice(["home", "cart", None]),
                  qty=rng.choice([None, -5, 0, 7, 1_000_000_000_000]),
                  amount=rng.choice([None, 0.5, 1.25, -2.0, 3.75, 10.0]),
                  tag=rng.choice(["a", "b", "c", "", None]),
                  n_int=rng.choice([None, 1, 2, 3]),
                  n_str=rng.choice([None, "1", "01", "1.0", "", " 1"]))
            for _ in range(n)]


def test_tumbling_every_aggregator_matches_pandas(spark, reads, batch_files, tmp_path):
    rng = random.Random(20240501)
    src = batch_files("clicks")
    batches = [
        random_clicks(rng, 0, 60, 30) + [
            # window [0, 60): rows on the window start and on its end (t = 60 -> next window only)
            click(0, user_id=1, page="home", qty=1, amount=1.0, tag="m", n_int=1, n_str="1"),
            click(60, user_id=1, page="home", qty=2, amount=2.0, tag="n", n_int=1, n_str="1"),
            # first/last ties on event time broken by value; NULLs skipped even when earlier/later
            click(5, user_id=7, page="ties", tag="b", amount=2.5), click(5, user_id=7, page="ties", tag="a", amount=9.0),
            click(4, user_id=7, page="ties", tag=None, amount=None, qty=None),
            click(50, user_id=7, page="ties", tag="x", qty=3), click(50, user_id=7, page="ties", tag="z", qty=8),
            click(55, user_id=7, page="ties", tag=None, qty=None),
            # a group whose values are all NULL
            click(10, user_id=9, page="void"), click(20, user_id=9, page="void"),
            # the empty string is a value; integer 1 and string "1" are different columns, each cast alone
            click(30, user_id=8, page="distinct", tag="", n_int=1, n_str="1"),
            click(31, user_id=8, page="distinct", tag="", n_int=1, n_str="01"),
            click(32, user_id=8, page="distinct", tag="1", n_int=2, n_str=""),
        ],
        random_clicks(rng, 60, 125, 30) + [click(120, user_id=None, page=None, qty=5, tag="e", n_str="")],
        random_clicks(rng, 125, 185, 30) + [click(180, user_id=1, page="home", qty=4, amount=0.25)],
    ]
    files = [src.write(b, CLICK_SCHEMA) for b in batches]
    out, cp = tmp_path / "out", tmp_path / "cp"
    window = """kind = "tumbling"
duration_ms = 60_000
lateness_ms = 0
group_by = ["page", "user_id"]
max_groups_per_window = 1000
window_start_column = "bucket_start"
window_end_column = "bucket_end"
"""
    summary = run(pipeline("clicks-all-aggs", src.directory, CLICK_DDL, cp, window, ALL_AGGS, parquet_target(out)),
                  spark)
    assert summary.batches == 4  # 3 micro-batches + the end-of-input flush

    group_by = ["page", "user_id"]
    events = [e for b in batches for e in b]
    truth = ground_truth(events, 60, 60, group_by, ALL_AGGS)
    actual = read_parquet_target(out, "bucket_start", "bucket_end", group_by)
    assert_rows_match(actual, truth, ALL_AGGS, "bucket_end")
    assert len(truth) > 20

    # spot checks that the generic truth really covers the edge cases
    w0, w1 = T0_US, T0_US + 60 * S
    assert truth[(w0, "home", 1)]["n"] >= 1 and actual[(w1, "home", 1)]["n"] >= 1
    ties = actual[(w0, "ties", 7)]
    assert (ties["tag_first"], ties["tag_last"], ties["amount_first"], ties["qty_last"]) == ("a", "z", 2.5, 8)
    void = actual[(w0, "void", 9)]
    assert void["n"] == 2 and void["amount_n"] == 0 and void["tags_exact"] == 0 and void["tags_approx"] == 0
    assert all(void[k] is None for k in ("qty_sum", "amount_sum", "amount_min", "qty_max", "tag_min", "amount_avg",
                                         "tag_first", "tag_last", "amount_first", "qty_last"))
    distinct = actual[(w0, "distinct", 8)]
    assert (distinct["tags_exact"], distinct["n_int_exact"], distinct["n_str_exact"]) == (2, 2, 3)
    assert (distinct["tags_approx"], distinct["n_int_approx"], distinct["n_str_approx"]) == (2, 2, 3)
    assert (w0 + 120 * S, None, None) in actual  # t = 120 s: window [120, 180) with NULL keys
    assert any(k[0] == w0 + 180 * S for k in actual)  # the flushed window

    # the output column order (docs/contract/emission.md) with renamed window columns; output types per
    # docs/contract/aggregators.md
    files_out = sorted(out.glob("batch_id=*/*.parquet"))
    assert [(p.parent.name, p.name) for p in files_out] == [
        ("batch_id=0", "part-0.parquet"), ("batch_id=1", "part-0.parquet"),
        ("batch_id=2", "flush.parquet"), ("batch_id=2", "part-0.parquet")], "3 batches, the flush beside the last"
    schema = pq.read_schema(files_out[0])
    assert schema.names == ["bucket_start", "bucket_end", *group_by, *(a["as"] for a in ALL_AGGS), "_emit_kind",
                            "_emit_seq"]
    # _emit_seq numbers a batch's rows; the flush beside the last batch continues its numbers
    seqs = {(p.parent.name, p.name): pq.read_table(p, columns=["_emit_seq"]).column(0).to_pylist() for p in files_out}
    flushed = seqs.pop(("batch_id=2", "flush.parquet"))
    assert all(seq == list(range(len(seq))) for seq in seqs.values()), seqs
    last = len(seqs[("batch_id=2", "part-0.parquet")])
    assert last and flushed == list(range(last, last + len(flushed))), (last, flushed)
    types = {f.name: f.type for f in schema}
    assert types["bucket_start"] == TS_TYPE and types["bucket_end"] == TS_TYPE
    assert types["qty_sum"] == pa.int64() and types["amount_sum"] == pa.float64()
    assert types["amount_avg"] == pa.float64() and types["n"] == pa.int64() and types["tags_exact"] == pa.int64()
    assert types["tag_first"] == pa.string() and types["qty_last"] == pa.int64()

    # micro-batch composition: batch N read exactly file N
    assert_source_log(cp, [[f] for f in files])


# ---------------------------------------------------------------------------------------------
# 2. Hopping windows whose duration is not a multiple of the hop, rows on the bounds


def test_hopping_non_multiple_duration_and_bounds(spark, batch_files, tmp_path):
    rng = random.Random(50_20)
    schema = pa.schema([("page", pa.string()), ("qty", pa.int64()), ("amount", pa.float64()), ("ts", TS_TYPE)])

    def row(t, page, qty=None, amount=None):
        return {"page": page, "qty": qty, "amount": amount, "ts": at(t)}

    def rand(lo, hi, n):
        return [row(rng.randint(lo * 2, hi * 2) / 2, rng.choice(["a", "b", None]), rng.choice([None, 1, 2, 30]),
                    rng.choice([None, 1.5, -0.5, 4.0])) for _ in range(n)]

    # D = 50 s, hop = 20 s: t = k*hop starts a window; t = start + 50 s belongs to the next ones only
    batches = [
        rand(0, 45, 20) + [row(0, "edge", 1), row(20, "edge", 2), row(40, "edge", 4)],
        rand(45, 100, 20) + [row(50, "edge", 8), row(60, "edge", 16), row(70, "edge", 32), row(90, "edge", 64)],
        rand(100, 149, 20) + [row(100, "edge", 128), row(110, "edge", 256), row(150, "edge", 512)],
    ]
    src = batch_files("hop")
    files = [src.write(b, schema) for b in batches]
    out, cp = tmp_path / "out", tmp_path / "cp"
    aggs = [
        {"agg": "count", "as": "n"},
        {"agg": "sum", "column": "qty", "as": "qty_sum"},
        {"agg": "min", "column": "amount", "as": "amount_min"},
        {"agg": "max", "column": "amount", "as": "amount_max"},
        {"agg": "avg", "column": "amount", "as": "amount_avg"},
    ]
    window = """kind = "hopping"
duration_ms = 50_000
hop_ms = 20_000
lateness_ms = 0
group_by = ["page"]
max_groups_per_window = 100
"""
    summary = run(pipeline("clicks-hop-50-20", files[0].parent, "page STRING, qty BIGINT, amount DOUBLE, ts TIMESTAMP",
                           cp, window, aggs, parquet_target(out), end_of_input="keep"), spark)

    # end_of_input = keep: exactly the windows the watermark (max event time, lateness 0) passed
    events = [e for b in batches for e in b]
    max_t = max(to_us(e["ts"]) for e in events)
    assert max_t == T0_US + 150 * S
    truth = ground_truth(events, 50, 20, ["page"], aggs, emitted_up_to_us=max_t)
    actual = read_parquet_target(out, "window_start", "window_end", ["page"])
    assert_rows_match(actual, truth, aggs, "window_end")
    all_windows = ground_truth(events, 50, 20, ["page"], aggs)
    assert summary.windows_left_open == len({k[0] for k in all_windows if all_windows[k]["end"] > max_t})

    # the edge rows, by hand: qty bit k marks the row at the k-th edge time
    edge = {k[0] - T0_US: v["qty_sum"] for k, v in actual.items() if k[1] == "edge"}
    assert edge == {
        -40 * S: 1,                 # [-40, 10): t=0
        -20 * S: 1 + 2,             # [-20, 30): t=0, 20
        0: 1 + 2 + 4,               # [0, 50): t=0, 20, 40 (not t=50)
        20 * S: 2 + 4 + 8 + 16,     # [20, 70): t=20, 40, 50, 60 (not t=70)
        40 * S: 4 + 8 + 16 + 32,    # [40, 90)
        60 * S: 16 + 32 + 64 + 128,  # [60, 110): t=60, 70, 90, 100
        80 * S: 64 + 128 + 256,     # [80, 130): t=90, 100, 110
        100 * S: 128 + 256,         # [100, 150): not t=150
    }
    assert_source_log(cp, [[f] for f in files])


# ---------------------------------------------------------------------------------------------
# 3. Approximate count_distinct accuracy over sketches merged across batches


def test_approximate_count_distinct_within_two_percent(spark, batch_files, tmp_path):
    schema = pa.schema([("g", pa.string()), ("id", pa.int64()), ("sid", pa.string()), ("ts", TS_TYPE)])
    src = batch_files("ids")
    events_by_batch = []
    for b in range(3):
        rows = []
        for w in range(2):  # windows [0, 60) and [60, 120), both in every batch
            for i in range(10_000):
                if (i + b + w) % 3 == 0:  # each id is in 2 of the 3 batches of each window
                    continue
                t = at(w * 60 + i % 60)
                rows.append({"g": "a", "id": i, "sid": f"user-{i}", "ts": t})
                if i < 3_000:
                    rows.append({"g": "b", "id": i, "sid": f"user-{i}", "ts": t})
        events_by_batch.append(rows)
        src.write(rows, schema)
    out, cp = tmp_path / "out", tmp_path / "cp"
    aggs = [
        {"agg": "count", "as": "n"},
        {"agg": "count_distinct", "column": "id", "as": "ids_approx", "mode": "approximate"},
        {"agg": "count_distinct", "column": "sid", "as": "sids_approx", "mode": "approximate"},
        {"agg": "count_distinct", "column": "id", "as": "ids_exact", "mode": "exact",
         "max_distinct_values_per_group": 20_000},
    ]
    window = """kind = "tumbling"
duration_ms = 60_000
lateness_ms = 3_600_000
group_by = ["g"]
max_groups_per_window = 10
"""
    run(pipeline("ids-approx", src.directory, "g STRING, id BIGINT, sid STRING, ts TIMESTAMP", cp, window, aggs,
                 parquet_target(out)), spark)
    events = [e for b in events_by_batch for e in b]
    truth = ground_truth(events, 60, 60, ["g"], aggs)
    assert {k: v["ids_exact"] for k, v in truth.items()} == {
        (T0_US, "a"): 10_000, (T0_US, "b"): 3_000, (T0_US + 60 * S, "a"): 10_000, (T0_US + 60 * S, "b"): 3_000}
    actual = read_parquet_target(out, "window_start", "window_end", ["g"])
    assert_rows_match(actual, truth, aggs, "window_end", approx_distinct=0.02)


# ---------------------------------------------------------------------------------------------
# 4. Postgres upsert target


def test_postgres_target_equals_ground_truth(spark, batch_files, tmp_path, pg_dsn, pg_schema):
    rng = random.Random(6)
    schema = pa.schema([("user_id", pa.int64()), ("page", pa.string()), ("amount", pa.float64()), ("ts", TS_TYPE)])

    def rand(lo, hi, n):
        return [{"user_id": rng.choice([1, 2, None]), "page": rng.choice(["home", "cart", "", None]),
                 "amount": rng.choice([None, 0.5, 2.0, 7.25]), "ts": at(rng.randint(lo, hi))} for _ in range(n)]

    spans = [(0, 70), (70, 130), (130, 200)]
    batches = [rand(lo, hi, 25) + [{"user_id": None, "page": "null-user", "amount": 1.0, "ts": at(lo + 1)}]
               for lo, hi in spans]
    src = batch_files("pg")
    for b in batches:
        src.write(b, schema)
    aggs = [
        {"agg": "count", "as": "clicks"},
        {"agg": "sum", "column": "amount", "as": "amount_sum"},
        {"agg": "avg", "column": "amount", "as": "amount_avg"},
        {"agg": "max", "column": "page", "as": "page_max"},
        {"agg": "last", "column": "page", "as": "page_last"},
        {"agg": "count_distinct", "column": "page", "as": "pages", "mode": "exact",
         "max_distinct_values_per_group": 10},
    ]
    window = """kind = "tumbling"
duration_ms = 60_000
lateness_ms = 5_000
group_by = ["user_id"]
max_groups_per_window = 10
"""
    target = f'kind = "postgres"\nurl = "{pg_dsn}"\ntable = "{pg_schema}.clicks"\ncreate_table = true'
    run(pipeline("clicks-pg", src.directory, "user_id BIGINT, page STRING, amount DOUBLE, ts TIMESTAMP",
                 tmp_path / "cp", window, aggs, target), spark)

    with psycopg.connect(pg_dsn) as conn:
        cur = conn.execute(sql.SQL("SELECT * FROM {}.clicks").format(sql.Identifier(pg_schema)))
        names = [d.name for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
    assert names == ["window_start", "window_end", "user_id", *(a["as"] for a in aggs)]
    actual: dict[tuple, dict] = {}
    for r in rows:
        r["window_start"], r["window_end"] = to_us(r["window_start"]), to_us(r["window_end"])
        key = (r["window_start"], r["user_id"])
        assert key not in actual, f"duplicate row for {key}"
        actual[key] = r
    truth = ground_truth([e for b in batches for e in b], 60, 60, ["user_id"], aggs)
    assert_rows_match(actual, truth, aggs, "window_end")
    null_keys = [k for k in actual if k[1] is None]
    assert len(null_keys) == len({k[0] for k in truth if k[1] is None}) >= 3  # one NULL-user row per window


# ---------------------------------------------------------------------------------------------
# 5. Two files per micro-batch


def test_two_files_per_batch_hopping(spark, reads, batch_files, tmp_path):
    rng = random.Random(2)
    schema = pa.schema([("user_id", pa.int64()), ("qty", pa.int64()), ("ts", TS_TYPE)])
    # files 0+1 are batch 0 and 2+3 batch 1: in-order across batches, any order inside one
    spans = [(0, 40), (10, 50), (50, 100), (60, 130)]
    batches = [[{"user_id": rng.choice([1, 2, None]), "qty": rng.choice([None, 1, 10, 100]),
                 "ts": at(rng.randint(lo, hi))} for _ in range(15)] for lo, hi in spans]
    src = batch_files("two")
    files = [src.write(b, schema) for b in batches]
    out, cp = tmp_path / "out", tmp_path / "cp"
    aggs = [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "qty", "as": "qty_sum"},
            {"agg": "first", "column": "qty", "as": "qty_first"}, {"agg": "last", "column": "qty", "as": "qty_last"}]
    window = """kind = "hopping"
duration_ms = 60_000
hop_ms = 30_000
lateness_ms = 0
group_by = ["user_id"]
max_groups_per_window = 10
"""
    summary = run(pipeline("clicks-two-files", src.directory, "user_id BIGINT, qty BIGINT, ts TIMESTAMP", cp, window,
                           aggs, parquet_target(out), max_files=2), spark)
    assert summary.batches == 3  # two micro-batches and the flush
    truth = ground_truth([e for b in batches for e in b], 60, 30, ["user_id"], aggs)
    actual = read_parquet_target(out, "window_start", "window_end", ["user_id"])
    assert_rows_match(actual, truth, aggs, "window_end")
    assert_source_log(cp, [files[0:2], files[2:4]])
