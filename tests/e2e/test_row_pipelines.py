"""Row pipelines end to end (docs/contract/row-pipelines.md), against the pandas oracle
``tests/e2e/row_oracle.py`` fed the batches Spark formed (one parquet or json file per micro-batch).

* ``WATERMARK_TS()`` (``tests/e2e/row_helpers.py``'s four branches): every row leaves exactly in the batch whose
  watermark reaches its release time, in §11's order, none twice and none lost, over two runs; the
  end-of-input flush releases nothing; ``state`` shows the pending rows without their values; a changed SQL
  refuses to start over them; ``reset`` says how many it discards.
* Without ``WATERMARK_TS()``: a plain filter into parquet, into PostgreSQL without a key (``_batch_id``) and
  with one (upsert, the largest (_event_ts, values) winning within a batch); malformed rows, invalid and
  future event times and a failing cast dead-lettered; ``rows_filtered_total`` by reason.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import tomllib
from collections import Counter

import pytest
import tomli_w

from ematix_dagster.cli import main as cli
from ematix_dagster.errors import FingerprintChanged
from ematix_dagster.spec import load_pipeline
from tests.e2e import row_oracle as ro
from tests.e2e.lateness_helpers import SCHEMA, Feed, at, files_source, metric, read_batch_dirs, row, run, us
from tests.e2e.row_helpers import (
    DELAYED_QUERY,
    DELAYED_RUN_1,
    DELAYED_RUN_2,
    DELAYED_SQL,
    by_batch,
    cast_bigint,
    dead_letters,
    eq,
    expected_batches,
    expected_dead_letters,
    ge,
    oracle_run,
    parquet_batches,
    postgres_rows,
    row_toml,
    write_batches,
)
from tests.pipeline_toml import parquet_target, postgres_target


def ids(rows: list[ro.Held]) -> list[int]:
    return [h.row["id"] for h in rows]


def check_the_data(outs: list[ro.BatchOut]) -> None:
    """What the delayed input exercises, as the oracle reads it (so a changed oracle cannot weaken the test)."""
    assert [ids(o.released) for o in outs[:4]] == [
        [1, 8, 2, 3],  # rt (now, first), then 2 (W reached in the arrival batch) and 3 (release == W: `<=`)
        # 28 now; 4 (strict: release == W0 held it); 29 (arrived now, earlier release) before the held 7 and 13
        # (7: two timed branches, the page's time the earlier); 5 before 20, 21 (a tie: arrival, then values)
        [28, 4, 29, 7, 13, 5, 20, 21],
        [30, 23, 31],
        [32],
    ]
    assert [sorted(r["id"] for r in o.not_released) for o in outs[:4]] == [[6, 9, 12], [], [], [33]]
    assert [sorted((reason, r["id"]) for reason, r in o.dead) for o in outs[:4]] == [
        [("invalid_event_time", 11), ("sql_error", 10)], [("future", 25)], [], []]
    assert sorted(ids(outs[3].held)) == [22, 22, 24, 26, 27], "rows still pending when the first run ends"
    if len(outs) > 4:
        assert ids(outs[4].released) == [41, 22, 22, 26, 27, 24] and ids(outs[4].held) == [40]


def account(rows_in: list[list[tuple]], outs: list[ro.BatchOut], written: dict[int, list[tuple]]) -> None:
    """Every input row is written once, pending, never released or dead-lettered: none twice, none lost."""
    written_ids = Counter(r[0] for rows in written.values() for r in rows)
    others = Counter(ids(outs[-1].held))
    for o in outs:
        others.update([r["id"] for r in o.not_released] + [r["id"] for _, r in o.dead])
    assert written_ids + others == Counter(r[0] for rows in rows_in for r in rows)
    assert not set(written_ids) & set(ids(outs[-1].held))


def test_delayed_rows_leave_in_the_batch_whose_watermark_reaches_them(spark, tmp_path, batch_files, capsys):
    files, feed = batch_files("in"), Feed()
    write_batches(feed, files, DELAYED_RUN_1)
    toml = row_toml("delayed", tmp_path, DELAYED_SQL,
                    dead_letter={"kind": "parquet", "path": str(tmp_path / "dlq")})
    spec = load_pipeline(toml)
    cp, out, p = spec.run.checkpoint_location, spec.target.path, spec.pipeline_name

    lines: list[str] = []
    summary, registry = run(spec, spark, lines.append)
    outs = oracle_run(feed, cp, DELAYED_QUERY)
    check_the_data(outs)
    assert parquet_batches(out) == expected_batches(outs)  # rows, columns, order; nothing after batch 3
    assert dead_letters(str(tmp_path / "dlq")) == expected_dead_letters(outs)
    assert [(r.watermark, r.counts.released_rows, r.counts.held_rows) for r in summary.reports] == \
        [(o.watermark, len(o.released), len(o.held)) for o in outs]
    assert metric(registry, "rows_filtered_total", pipeline=p, reason="not_released") == 4
    assert metric(registry, "rows_filtered_total", pipeline=p, reason="where") == 0
    assert metric(registry, "released_rows_total", pipeline=p) == sum(len(o.released) for o in outs)
    assert metric(registry, "buffered_rows", pipeline=p) == len(outs[-1].held)
    assert metric(registry, "dead_letter_rows_total", pipeline=p, reason="sql_error") == 1
    held = outs[-1].held
    assert metric(registry, "watermark_seconds", pipeline=p, source="_output") * 1e6 == \
        min(outs[-1].watermark, *(h.event_ts for h in held)), "the output watermark waits for the oldest pending row"
    assert stat.S_IMODE(os.stat(tmp_path / "state.db").st_mode) == 0o600, "pending payloads are not public"

    # the end of input releases nothing and says what stays held
    assert any(f"input exhausted: {len(held)} rows held back by WATERMARK_TS() stay in" in line for line in lines), lines

    # `state`: the pending rows' count, bytes and next release time, never their values
    capsys.readouterr()
    assert cli(["state", str(toml)]) == 0
    shown = capsys.readouterr().out
    pending = json.loads(shown)["pending"]
    assert pending["rows"] == len(held) and pending["payload_bytes"] > 0
    assert pending["next_release_us"] == min(h.release for h in held) == us(at(13))
    assert pending["next_release"] == "2024-01-01T00:13:00Z"
    assert not any(v in shown for v in ("held-24", "held-26", "dup", "00:30:00")), "a pending value is shown"
    # the output watermark the last commit stored (schema step 11): W, kept back by the oldest pending row
    assert json.loads(shown)["output_watermark"] == min(outs[-1].watermark, *(h.event_ts for h in held))

    # a changed SQL (its output schema) with rows pending refuses to start, saying what and why
    changed = row_toml("delayed", tmp_path, DELAYED_SQL.replace("v, page", "v, page AS title"),
                       dead_letter={"kind": "parquet", "path": str(tmp_path / "dlq")})
    with pytest.raises(FingerprintChanged) as refused:
        run(load_pipeline(changed), spark)
    message = str(refused.value)
    assert "transform.sql" in message and "5 rows pending" in message and "reset" in message, message
    row_toml("delayed", tmp_path, DELAYED_SQL, dead_letter={"kind": "parquet", "path": str(tmp_path / "dlq")})

    # a second run with more input releases the held rows in the batch whose W reaches them
    write_batches(feed, files, DELAYED_RUN_2)
    summary, registry = run(spec, spark)
    outs = oracle_run(feed, cp, DELAYED_QUERY)
    check_the_data(outs)
    written = parquet_batches(out)
    assert written == expected_batches(outs)
    assert [r.batch_id for r in summary.reports] == [4] and summary.reports[0].counts.held_rows == 1
    assert metric(registry, "buffered_rows", pipeline=p) == 1
    account(DELAYED_RUN_1 + DELAYED_RUN_2, outs, written)

    # reset names the pending rows it discards
    assert cli(["reset", str(toml), "--yes"]) == 0
    assert "discarded 1 pending row (" in capsys.readouterr().out


# -- without WATERMARK_TS() -----------------------------------------------------------------------------------

# no _event_ts in the output: the engine still orders by it, picks keyed winners by it and dead-letters with it
PLAIN_SQL = "SELECT id, k, CAST(page AS BIGINT) AS page_no FROM source WHERE v >= 0"
PLAIN_QUERY = ro.Query(
    select=lambda r: {"id": r["id"], "k": r["k"], "page_no": cast_bigint(r["page"])},
    where=lambda r: ge(r["v"], 0))
TRUNCATED = '{"id": 90, "k": "a", "v": 1, "page": "1", "ts": "2024-01-01 00:0'
JSON_DDL = "id BIGINT, k STRING, v BIGINT, page STRING, ts STRING"


def _json(rows: list[dict]) -> str:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"


def _expected(r: dict | str) -> dict:
    """The oracle's view of a json line: malformed, or its values with the parsed event time."""
    if isinstance(r, str):
        return {"id": None, "_event_ts": None, "_malformed": True, "_corrupt_record": r}
    try:
        event = us(dt.datetime.strptime(r["ts"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc))
    except ValueError:
        event = None
    return {"id": r["id"], "k": r["k"], "v": r["v"], "page": r["page"], "_event_ts": event}


def _line(id_: int, k: str | None, v: int | None, page: str | None, ts: str) -> dict:
    """A json line; ``ts`` is a time of 2024-01-01 unless it has a date of its own."""
    return {"id": id_, "k": k, "v": v, "page": page, "ts": ts if "-" in ts else f"2024-01-01 {ts}"}


# Per key, several rows a batch: ties on event time decided by the values; a later batch replaces a key's row
PLAIN_BATCHES: list[list[dict | str]] = [
    [_line(1, "a", 1, "10", "00:01:00"), _line(2, "a", 5, "20", "00:02:00"), _line(3, "a", 5, "30", "00:02:00"),
     _line(4, "b", -1, "x", "00:01:00"), _line(5, "b", None, "40", "00:01:00"), _line(6, "b", 4, "x6", "00:01:30"),
     _line(7, None, 7, None, "00:00:30"), _line(8, "c", 8, "80", "not a time"), TRUNCATED,
     _line(9, "c", 9, "90", "00:01:10")],
    [_line(10, "c", 10, "5", "00:00:10"), _line(11, "e", 11, "11", "00:03:00"), _line(16, "e", 16, "99", "00:02:00"),
     _line(12, "d", 1, "1", "2099-01-01 00:00:00"), _line(13, None, 13, "13", "00:00:20"),
     _line(14, "b", 14, "14", "00:00:05")],
]


@pytest.mark.parametrize("target", ["parquet", "postgres", "postgres-key"])
def test_a_plain_filter_writes_every_row_once_and_dead_letters_bad_ones(target, spark, tmp_path, batch_files,
                                                                          pg_dsn, pg_schema):
    files, feed = batch_files("in", "json"), Feed()
    for lines in PLAIN_BATCHES:
        feed.text("a", files, _json(lines), [_expected(r) for r in lines])
    table = f"{pg_schema}.plain"
    targets = {"parquet": parquet_target(tmp_path / "out"), "postgres": postgres_target(pg_dsn, table),
               "postgres-key": {**postgres_target(pg_dsn, table), "key": ["k"]}}
    toml = row_toml(f"plain-{target}", tmp_path, PLAIN_SQL, target=targets[target], max_buffered_rows=None,
                    source=files_source("a", files.directory, "json", JSON_DDL),
                    dead_letter={"kind": "parquet", "path": str(tmp_path / "dlq")})
    spec = load_pipeline(toml)
    summary, registry = run(spec, spark)
    outs = oracle_run(feed, spec.run.checkpoint_location, PLAIN_QUERY)
    assert [sorted(r["id"] for r in o.filtered) for o in outs] == [[4, 5], []], "v < 0 and v NULL"
    assert [sorted(reason for reason, _ in o.dead) for o in outs] == [
        ["invalid_event_time", "malformed", "sql_error"], ["future"]]

    p = spec.pipeline_name
    assert dead_letters(str(tmp_path / "dlq")) == expected_dead_letters(outs)
    failed = [r for rows in read_batch_dirs(str(tmp_path / "dlq")).values() for r in rows if r["_reason"] == "sql_error"]
    assert [(r["id"], r["page_no"], r["_source"], r["_event_ts"]) for r in failed] == \
        [(r["id"], None, "a", r["_event_ts"]) for reason, r in outs[0].dead if reason == "sql_error"], \
        "a failed row keeps its columns, _source and _event_ts"
    assert metric(registry, "rows_filtered_total", pipeline=p, reason="where") == 2
    assert metric(registry, "rows_filtered_total", pipeline=p, reason="not_released") == 0
    assert metric(registry, "malformed_rows_total", pipeline=p, source="a") == 1
    assert [r.watermark for r in summary.reports] == [o.watermark for o in outs]
    columns = ["id", "k", "page_no"]
    if target == "parquet":
        assert parquet_batches(spec.target.path) == expected_batches(outs)  # ordered by event time, then values
    elif target == "postgres":
        assert by_batch(postgres_rows(pg_dsn, table, [*columns, "_batch_id"])) == \
            {b: sorted(rows, key=repr) for b, rows in expected_batches(outs).items()}
    else:
        want = ro.upsert_table(outs, ("k",))
        assert want[("c",)]["id"] == 10, "a later batch replaces a key's row, even with an earlier event time"
        assert want[("e",)]["id"] == 11, "within a batch the largest event time wins, whatever the values"
        assert want[("a",)]["id"] == 3, "a tie on event time: the larger values win"
        assert sorted(postgres_rows(pg_dsn, table, columns), key=repr) == \
            sorted((tuple(r.values()) for r in want.values()), key=repr)


@pytest.mark.slow
def test_a_failed_row_of_several_sources_carries_its_own_source(spark, tmp_path, batch_files):
    """A SELECT without ``_source`` over two sources: each ``sql_error`` dead letter names the source its row
    came from (read from the row before the SQL), also with ``include_source_row = "none"``, which
    leaves ``_source_row`` out."""
    ins = {"a": batch_files("in"), "b": batch_files("in_b")}
    bad = {"a": 1, "b": 2}  # source -> id of its row whose page does not cast
    for name, files in ins.items():
        files.write([row(bad[name], "k", 1, at(1), page="abc"), row(10 + bad[name], "k", 1, at(1), page="7")],
                    schema=SCHEMA)
    toml = row_toml("sources", tmp_path, "SELECT id, CAST(page AS BIGINT) AS page_no FROM source",
                    max_buffered_rows=None,
                    dead_letter={"kind": "parquet", "path": str(tmp_path / "dlq"), "include_source_row": "none"})
    doc = tomllib.loads(toml.read_text())
    doc["sources"].append(files_source("b", ins["b"].directory))
    toml.write_text(tomli_w.dumps(doc))
    run(load_pipeline(toml), spark)
    letters = [r for rows in read_batch_dirs(str(tmp_path / "dlq")).values() for r in rows]
    assert sorted((r["_reason"], r["id"], r["_source"]) for r in letters) == [
        ("sql_error", 1, "a"), ("sql_error", 2, "b")]
    assert all("_source_row" not in r for r in letters)
    written = [r for rows in read_batch_dirs(str(tmp_path / "out")).values() for r in rows]
    assert sorted((r["id"], r["page_no"]) for r in written) == [(11, 7), (12, 7)]


def test_the_oracle_reads_sql_three_valued():
    """The oracle's guards: NULL is not TRUE (a NULL key releases nothing), whatever the branch order."""
    row = {"id": 1, "k": None, "v": 150, "page": None, "_event_ts": 0}
    assert eq(None, "emb") is None and ro.release_time(row, DELAYED_QUERY.branches) is None
    branches = DELAYED_QUERY.branches
    row = {"id": 1, "k": "emb", "v": 150, "page": "2024-01-01 00:00:00", "_event_ts": us(at(10))}
    assert ro.release_time(row, branches) == ro.release_time(row, tuple(reversed(branches))) == us(at(0)) + 1
