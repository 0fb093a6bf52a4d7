"""Lateness, watermarks, idleness and bad rows end to end: real Spark against the pandas oracle.

Every run writes one file per micro-batch (``max_files_per_trigger = 1``), reads the batch times
Spark recorded in ``offsets/N`` and the files each batch read from ``sources/<i>/N``, feeds both to
``tests/oracle.py`` and compares every emitted row (parquet ``batch_id=N/`` dirs with
``_emit_kind``), every dead letter, the watermark after each batch and the counters
(``RunSummary``, batch reports, Prometheus) with what the oracle says. A few hand-written
assertions per run make sure the data really exercises the rule the test is named after. The helpers live in tests/e2e/lateness_helpers.py; the SQL
analysis at start: test_sql_analysis.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ematix_dagster.errors import StateNotDurableError
from tests.e2e.lateness_helpers import (
    FAR_FUTURE,
    Feed,
    at,
    check_run,
    files_source,
    make_spec,
    metric,
    read_batch_dirs,
    row,
    run,
    us,
)

# -- 1, 2 (drop), 5 (parquet: null and future), 7, 8 (flush) ------------------------------------


def test_drop_out_of_order_invalid_future_sql_filter_and_flush(spark, tmp_path, batch_files):
    """Tumbling 1 min, lateness 10 s, drop, a filtering SQL, dead letters, end_of_input = flush."""
    files = batch_files("a")
    feed = Feed()
    feed.parquet("a", files, [
        row(1, "x", 1, at(0, 10), "p1"), row(2, "y", 2, at(0, 50), "p1"), row(3, "x", 3, at(0, 5), "p2"),
        row(4, "x", 4, at(1, 30), ""), row(5, "x", 5, None),  # invalid: null event time
        row(6, "x", 6, FAR_FUTURE),  # future: must not move W to 2099
    ])
    feed.parquet("a", files, [
        row(7, "x", 10, at(1, 15), None),  # behind the max seen (1:30) but its window is open: aggregated
        row(8, "y", 20, at(0, 40)),  # window [0:00, 1:00) emitted after batch 0: late, dropped
        row(9, "z", -5, at(3, 30)),  # filtered out by the SQL, still advances W to 3:20
        row(10, "z", 1, at(2, 10), "p9"),
    ])
    feed.parquet("a", files, [
        row(11, "x", 7, at(4, 10)), row(12, "x", 1, at(3, 55)),  # 3:55 > W=3:20's closed windows: open
        row(13, "y", 9, at(2, 59)),  # late
        row(14, None, 3, at(3, 50), "p1"),  # NULL group key is a group of its own
    ])
    spec = make_spec(tmp_path, "drop-run", [files_source("a", files.directory)], {
        "kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 10_000, "group_by": ["k"],
        "aggregations": [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "v_sum"},
                         {"agg": "count_distinct", "column": "page", "as": "pages", "mode": "exact",
                          "max_distinct_values_per_group": 100}],
    }, sql="SELECT id, k, v, page, _event_ts, _source FROM source WHERE v >= 0", dead_letter=True,
        end_of_input="flush")
    summary, registry = run(spec, spark)
    expected = check_run(spec, feed, summary, registry, sql_filter=lambda df: df["v"] >= 0)

    c = expected.counters
    assert summary.batches == 4 and summary.last_batch_id == 2, "3 batches + the end-of-input flush (beside batch 2)"
    assert (c["late_rows"], c["invalid_event_time:a"], c["future:a"]) == (2, 1, 1)
    # The filtered row (id 9, 3:30) moved W to 3:20 in batch 1: [1:00, 2:00) and [2:00, 3:00) closed there.
    assert expected.watermarks[1] == us(at(3, 20))
    out = read_batch_dirs(spec.target.path)
    assert {(r["window_start"], r["k"]) for r in out[1]} == {(us(at(1)), "x"), (us(at(2)), "z")}
    x1 = next(r for r in out[1] if r["k"] == "x")
    assert (x1["n"], x1["v_sum"], x1["pages"]) == (2, 14, 1), "out-of-order row 7 aggregated with row 4"
    assert {r["_emit_kind"] for rows in out.values() for r in rows} == {"final"}
    flushed = pq.read_table(Path(spec.target.path) / "batch_id=2" / "flush.parquet").to_pylist()
    assert [us(r["window_start"]) for r in flushed] == [us(at(4))], "flush emits the last open window"
    assert summary.windows_left_open == 0
    dlq = read_batch_dirs(spec.dead_letter.path)
    assert set(dlq) == {0}, "drop: late rows never reach the dead letters"
    assert {(r["id"], r["_reason"]) for r in dlq[0]} == {(5, "invalid_event_time"), (6, "future")}
    assert metric(registry, "late_rows_dropped_total", pipeline="drop-run", policy="drop") == 2


# -- 2 (reopen), 8 (keep) ---------------------------------------------------------------------------


def test_reopen_corrections_and_keep(spark, tmp_path, batch_files):
    """Tumbling 1 min, lateness 0, reopen with 2 min allowed lateness, end_of_input = keep."""
    files = batch_files("a")
    feed = Feed()
    feed.parquet("a", files, [row(1, "x", 1, at(0, 10)), row(2, "y", 2, at(0, 20)), row(3, "x", 3, at(1, 10))])
    feed.parquet("a", files, [
        row(4, "x", 10, at(0, 30)), row(5, "x", 20, at(0, 40)),  # two late rows, one correction row for x
        row(6, "x", 5, at(2, 30)),
    ])
    feed.parquet("a", files, [
        row(7, "z", 1, at(0, 15)),  # a new group in the retained window [0:00, 1:00): a correction
        row(8, "y", 4, at(1, 50)),  # retained window [1:00, 2:00)
        row(9, "x", 1, at(5, 10)),  # W = 5:10: evicts [0:00, 1:00) and [1:00, 2:00)
    ])
    feed.parquet("a", files, [
        row(10, "x", 1, at(1, 0)),  # [1:00, 2:00): end + 2 min <= W: beyond allowance, dropped
        row(11, "x", 1, at(4, 30)),  # [4:00, 5:00) was never seen but is closed and retained: a correction
        row(12, "x", 1, at(5, 20)),  # [5:00, 6:00) stays open (keep)
    ])
    spec = make_spec(tmp_path, "reopen-run", [files_source("a", files.directory)], {
        "kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 0, "group_by": ["k"], "late_data": "reopen",
        "allowed_lateness_ms": 120_000,
        "aggregations": [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "v_sum"}],
    })
    summary, registry = run(spec, spark)
    expected = check_run(spec, feed, summary, registry)

    out = read_batch_dirs(spec.target.path)
    corrections = [(b, r["window_start"], r["k"], r["n"], r["v_sum"])
                   for b, rows in sorted(out.items()) for r in rows if r["_emit_kind"] == "correction"]
    assert (1, us(at(0)), "x", 3, 31) in corrections, "one correction per batch for the touched group"
    assert (2, us(at(0)), "z", 1, 1) in corrections and (2, us(at(1)), "y", 1, 4) in corrections
    assert len([c for c in corrections if c[0] == 1]) == 1
    c = expected.counters
    assert c["late_rows"] == 1 and c["reopened_rows"] >= 4
    assert metric(registry, "late_rows_dropped_total", pipeline="reopen-run", policy="reopen") == 1
    assert summary.windows_left_open > 0, "keep leaves the open window [5:00, 6:00)"


# -- 2 (dlq), 3 (hopping), 4 (idleness, never-seen source) ------------------------------------------


def test_hopping_dlq_and_idle_sources(spark, tmp_path, batch_files):
    """Hopping 1 min / 20 s, dlq, three sources: a (4 batches), b (batch 0 only), c (never any row).

    ``source_idleness_ms = 1``: c holds W back in batch 0 (every source counts as just arrived at
    the first batch); from batch 1 on, b and c are idle (batches are more than 1 ms apart) and W
    follows a alone.
    """
    a, b, c = batch_files("a"), batch_files("b"), batch_files("c")
    feed = Feed()
    def with_v10(rows):
        return [{**r, "v10": None if r["v"] is None else r["v"] * 10} for r in rows]

    feed.parquet("a", a, [row(1, "x", 1, at(0, 5)), row(2, "y", 2, at(1, 0))])
    feed.parquet("b", b, [row(3, "x", 3, at(0, 50))])
    feed.parquet("a", a, [row(4, "x", 4, at(2, 0))])
    feed.parquet("a", a, [
        row(5, "x", 5, at(1, 50)),  # [1:00, 2:00) closed at W = 2:00; open in [1:20, 2:20) and [1:40, 2:40)
        row(6, "y", 6, at(0, 30)),  # all three windows closed: late, to the dead letters
        row(7, "y", 7, at(2, 10)),
    ])
    feed.parquet("a", a, [row(8, "x", 8, at(3, 0)), row(9, "x", 9, None)])
    for key in list(feed.rows):  # the SQL's computed column, as the oracle sees it
        feed.rows[key] = with_v10(feed.rows[key])
    spec = make_spec(tmp_path, "hop-run", [files_source(s, f.directory) for s, f in (("a", a), ("b", b), ("c", c))], {
        "kind": "hopping", "duration_ms": 60_000, "hop_ms": 20_000, "lateness_ms": 0, "source_idleness_ms": 1,
        "group_by": ["k"], "late_data": "dlq",
        "aggregations": [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v10", "as": "s10"}],
    }, sql="SELECT id, k, v, v * 10 AS v10, _event_ts, _source FROM source", dead_letter=True, end_of_input="flush")
    summary, registry = run(spec, spark)
    expected = check_run(spec, feed, summary, registry)

    assert expected.watermarks[0] is None, "c, never seen and not yet idle, holds W back in batch 0"
    assert expected.watermarks[1] == us(at(2, 0)), "b and c idle: W follows a"
    assert summary.reports[0].watermark is None and summary.reports[0].counts.windows_emitted == 0
    assert set(summary.reports[1].idle_sources) == {"b", "c"}
    cnt = expected.counters
    assert cnt["late_rows"] == 1 and cnt["late_assignments"] == 1
    assert metric(registry, "late_assignments_dropped_total", pipeline="hop-run") == 1
    assert metric(registry, "late_rows_dropped_total", pipeline="hop-run", policy="dlq") == 1
    out = read_batch_dirs(spec.target.path)
    x_from_5 = [r for rows in out.values() for r in rows if r["k"] == "x" and r["window_start"] in (us(at(1, 20)), us(at(1, 40)))]
    assert x_from_5 and all(r["s10"] >= 50 for r in x_from_5), "row 5 contributes to its open windows"
    dlq = read_batch_dirs(spec.dead_letter.path)
    late = [r for rows in dlq.values() for r in rows if r["_reason"] == "late"]
    assert len(late) == 1 and late[0]["id"] == 6 and late[0]["v10"] == 60 and late[0]["_batch_id"] == 2
    assert late[0]["_source"] == "a" and late[0]["_event_ts"] == us(at(0, 30))
    assert "page" not in late[0], "late rows are post-SQL rows: the SQL did not select page"
    assert any(r["_reason"] == "invalid_event_time" and r["id"] == 9 for rows in dlq.values() for r in rows)


# -- lateness decided on the driver (tumbling, event time, no SQL): dlq, future rows, two sources ----


@pytest.mark.parametrize("policy", ["dlq", "reopen"])
def test_tumbling_lateness_on_the_driver_with_future_rows_and_two_sources(spark, tmp_path, batch_files, monkeypatch,
                                                                           policy):
    """The plan without batch values: late windows are classed on the driver, and a batch whose
    newest event time may be in the future runs the exact way (batch 2 here)."""
    from ematix_dagster.spark.batch import window_call as batch_module

    calls = {"driver": 0, "exact": 0}

    def spy(name, real):
        def wrapper(*args, **kwargs):
            result = real(*args, **kwargs)
            calls[name] += 1 if (name == "driver" or result) else 0
            return result
        return wrapper

    monkeypatch.setattr(batch_module, "late_windows", spy("driver", batch_module.late_windows))
    monkeypatch.setattr(batch_module, "may_hold_future_rows", spy("exact", batch_module.may_hold_future_rows))
    a, b = batch_files("a"), batch_files("b")
    feed = Feed()
    feed.parquet("a", a, [row(1, "x", 1, at(0, 10)), row(2, "y", 2, at(0, 20)), row(3, "x", 3, at(1, 10))])
    feed.parquet("b", b, [row(4, "x", 4, at(1, 40)), row(5, None, 5, at(0, 50)), row(6, "y", 6, None)])
    # a batch reads each source's next file: W after each is 1:10, 3:00 (a's 3:00 against b's 3:45), 3:45
    feed.parquet("a", a, [
        row(7, "x", 10, at(0, 30)),  # [0:00, 1:00) closed at W = 1:10: late
        row(8, "y", 20, at(1, 5)), row(9, "x", 1, at(3, 0)),
    ])
    feed.parquet("b", b, [
        row(10, "x", 7, FAR_FUTURE),  # future: this batch runs the exact way
        row(11, "y", 1, at(1, 15)),  # [1:00, 2:00) still open at W = 1:10
        row(12, "z", 2, at(3, 45)),
    ])
    feed.parquet("a", a, [
        row(13, "z", 3, at(2, 30)),  # [2:00, 3:00) ends at W = 3:00: emitted, so late (reopen: reopened)
        row(15, "x", 5, at(0, 1)),  # late
        row(16, "x", 6, at(3, 10)),  # [3:00, 4:00) starts at W: open
        row(14, "x", 4, at(4, 20)),
    ])
    window: dict[str, Any] = {
        "kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 0, "source_idleness_ms": 3_600_000,
        "group_by": ["k"], "late_data": policy,
        "aggregations": [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "v_sum"}],
    }
    if policy == "reopen":
        window["allowed_lateness_ms"] = 120_000
    spec = make_spec(tmp_path, f"driver-late-{policy}", [files_source(s, f.directory) for s, f in (("a", a), ("b", b))],
                     window, dead_letter=True, end_of_input="flush")
    summary, registry = run(spec, spark)
    expected = check_run(spec, feed, summary, registry)

    c = expected.counters
    assert c["future:b"] == 1 and c["invalid_event_time:b"] == 1
    assert summary.last_batch_id == 2 and calls["exact"] == 1 and calls["driver"] == 2, \
        "every batch but the future one classed on the driver"
    if policy == "dlq":
        assert c["late_rows"] == 3 and c["dead_letter:late"] == 3
    else:
        assert c["reopened_rows"] >= 2 and c["corrections"] >= 2


# -- 5 (string / epoch event times), 6 (malformed json / csv), 4 (never-seen source), 10 ----------


def test_json_csv_bad_rows_never_seen_source_and_in_memory_refusal(spark, tmp_path, batch_files):
    """json (STRING event time) + csv (epoch ms) + an empty parquet source with 10 min idleness.

    The empty source holds W back for the whole run, so nothing is emitted until the flush; the
    flush shows that every good row was aggregated. A second run refuses the checkpoint.
    """
    j, c, p = batch_files("j", "json"), batch_files("c", "csv"), batch_files("p")
    feed = Feed()

    def good(id_, k, v, ts):
        return {"id": id_, "k": k, "v": v, "_event_ts": us(ts)}

    def bad(id_, k, v):  # an invalid event time
        return {"id": id_, "k": k, "v": v, "_event_ts": None}

    def malformed(line):
        return {"id": None, "k": None, "v": None, "_event_ts": None, "_malformed": True, "_corrupt_record": line}

    truncated = '{"id": 5, "k": "x", "v": 5, "ts": "2024-01-01 00:00'
    mistyped = '{"id": "seven", "k": "x", "v": 7, "ts": "2024-01-01 00:02:20"}'
    feed.text("j", j, "\n".join([
        '{"id": 1, "k": "x", "v": 1, "ts": "2024-01-01 00:00:10"}',
        '{"id": 2, "k": "y", "v": 2, "ts": "2024-01-01 00:01:10"}',
        '{"id": 3, "k": "x", "v": 3, "ts": "not a time"}',
        '{"id": 4, "k": "x", "v": 4}',
        truncated,
    ]) + "\n", [good(1, "x", 1, at(0, 10)), good(2, "y", 2, at(1, 10)), bad(3, "x", 3), bad(4, "x", 4),
                malformed(truncated)])
    feed.text("j", j, "\n".join([
        '{"id": 6, "k": "x", "v": 6, "ts": "2024-01-01 00:02:10"}',
        '{"id": 8, "k": "x", "v": 8, "ts": "2024-13-01 00:00:00"}',
        mistyped,
    ]) + "\n", [good(6, "x", 6, at(2, 10)), bad(8, "x", 8), malformed(mistyped)])
    ms = lambda d: us(d) // 1000  # noqa: E731
    feed.text("c", c, "\n".join([
        "id,k,v,ems",
        f"10,x,10,{ms(at(0, 15))}",
        "11,z,11,9000000000000000000",  # a BIGINT, but far outside the timestamp range: invalid
        "12,z,12,",  # null
        f"13,y,abc,{ms(at(0, 20))}",  # v is not a number: malformed
    ]) + "\n", [good(10, "x", 10, at(0, 15)), bad(11, "z", 11), bad(12, "z", 12),
                malformed(f"13,y,abc,{ms(at(0, 20))}")])
    feed.text("c", c, "\n".join([
        "id,k,v,ems",
        f"14,z,14,{ms(at(2, 10))}",
        "15,z,15,-9000000000000000",
    ]) + "\n", [good(14, "z", 14, at(2, 10)), bad(15, "z", 15)])

    sources = [
        files_source("j", j.directory, "json", "id BIGINT, k STRING, v BIGINT, ts STRING"),
        files_source("c", c.directory, "csv", "id BIGINT, k STRING, v BIGINT, ems BIGINT", "ems", event_time_unit="ms"),
        # no "ts" here: a TIMESTAMP ts would meet j's STRING ts (refused, see the test below)
        files_source("p", p.directory, schema="id BIGINT, k STRING, v BIGINT, pts TIMESTAMP", column="pts"),
    ]
    spec = make_spec(tmp_path, "bad-rows-run", sources, {
        "kind": "tumbling", "duration_ms": 60_000, "source_idleness_ms": 600_000, "group_by": ["k"],
        "aggregations": [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "v_sum"},
                         {"agg": "count_distinct", "column": "id", "as": "ids", "mode": "exact",
                          "max_distinct_values_per_group": 100}],
    }, dead_letter=True, end_of_input="flush")
    summary, registry = run(spec, spark)
    expected = check_run(spec, feed, summary, registry)

    cnt = expected.counters
    assert (cnt["malformed:j"], cnt["malformed:c"]) == (2, 1)
    assert (cnt["invalid_event_time:j"], cnt["invalid_event_time:c"]) == (3, 3)
    assert all(r.watermark is None for r in summary.reports[:-1]), "p, never seen, holds W back"
    assert summary.reports[-1].counts.windows_emitted == 4, "the flush emits every good row's window"
    dlq = [r for rows in read_batch_dirs(spec.dead_letter.path).values() for r in rows]
    raw = {r["_corrupt_record"] for r in dlq if r["_reason"] == "malformed"}
    assert raw == {truncated, mistyped, f"13,y,abc,{ms(at(0, 20))}"}
    assert all(r["_reason"] != "malformed" or r["_source"] in ("j", "c") for r in dlq)

    # 10: in-memory state cannot resume; the checkpoint now holds progress.
    with pytest.raises(StateNotDurableError, match="in memory") as err:
        run(spec, spark)
    assert spec.run.checkpoint_location in str(err.value)
