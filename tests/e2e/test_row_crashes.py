"""Rows held back by ``WATERMARK_TS()`` survive SIGKILL (docs/contract/row-pipelines.md; fault points of
``ematix_dagster/faults.py``, driven as ``tests/e2e/test_crash_recovery.py`` does).

One ``ematix-dagster run`` process group over the delayed input of ``tests/e2e/row_helpers.py`` (five files, one
micro-batch each; every batch holds rows back or releases held ones) is killed at two points and restarted with a
plain ``run`` until it exits 0:

* parquet target, SQLite store: killed when batch 0's rows are written (its held rows not committed yet), inside
  batch 2's store transaction (batch 1's held rows committed, batch 2's release of some not) and right after batch
  3's commit (Spark replays it; the store already holds it, so it is skipped). After each kill the
  pending rows in the store are those the oracle held after the last committed batch; every batch directory
  written before a kill holds the same rows at the end (a replay rewrites it identically), and the whole output
  equals the oracle;
* exactly-once PostgreSQL (``same_transaction = true``, PostgreSQL store, no key: ``_batch_id``): killed inside
  batch 0's transaction (nothing of it committed: its held rows and its target rows come back with the replay) and
  inside batch 2's transaction, after its target rows are inserted and its released rows deleted from the store, before
  COMMIT, and at the end of input; the table equals the oracle, each row with the batch that released it. (With ``same_transaction`` the
  ``target_write`` point comes before anything is written, so one kill inside the transaction is the case.)

A fourth kill comes at the end of input (``after_store_commit:flush``, ``end_of_input = "flush"``): a row pipeline's
flush releases and writes nothing, so the restart finds every batch done and the last batch's held rows still pending,
and ends with the same output. Each restart starts a JVM (about 20 s on a busy machine), so the kills are few.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ematix_dagster.operations import summary
from ematix_dagster.spec import load_pipeline
from tests.e2e import row_oracle as ro
from tests.e2e.lateness_helpers import Feed
from tests.e2e.row_helpers import (
    DELAYED_QUERY,
    DELAYED_RUN_1,
    DELAYED_RUN_2,
    DELAYED_SQL,
    by_batch,
    expected_batches,
    ge,
    oracle_run,
    parquet_batches,
    plain_row,
    postgres_rows,
    row_toml,
    write_batches,
)
from tests.e2e.test_emit_trigger_crashes import offsets_written, run_with_kills
from tests.pipeline_toml import postgres_store, postgres_target

BATCHES = DELAYED_RUN_1 + DELAYED_RUN_2  # five files, batches 0..4


@pytest.mark.slow
def test_kills_keep_held_rows_and_rewrite_parquet_batches_identically(tmp_path, batch_files):
    feed = Feed()
    write_batches(feed, batch_files("in"), BATCHES)
    toml = row_toml("row-crash", tmp_path, DELAYED_SQL)
    spec = load_pipeline(toml)
    cp, out = spec.run.checkpoint_location, spec.target.path
    snapshots: list[tuple[set[int], dict[int, list[tuple]], int | None, int]] = []

    def snapshot() -> None:
        state = summary(spec, windows=False)
        written = parquet_batches(out) if Path(out).exists() else {}
        snapshots.append((offsets_written(cp), written, state["last_batch_id"], state["pending"]["rows"]))

    assert run_with_kills(toml, tmp_path / "faults",
                          "target_write:0,store_commit:2,after_store_commit:3,after_store_commit:flush", snapshot) == 4
    outs = oracle_run(feed, cp, DELAYED_QUERY)
    assert len(outs) == len(BATCHES), "one micro-batch per file"
    final = parquet_batches(out)
    assert final == expected_batches(outs)

    # after each kill: the store holds the last committed batch and exactly the rows the oracle held after it
    assert [(sorted(ids), committed) for ids, _, committed, _ in snapshots] == [
        ([0], None), ([0, 1, 2], 1), ([0, 1, 2, 3], 3),  # committed, not yet recorded by Spark (replayed)
        ([0, 1, 2, 3, 4], 4)]  # the end of input: every batch done, the last one's held rows kept
    assert [pending for *_, pending in snapshots] == [0, len(outs[1].held), len(outs[3].held), len(outs[4].held)]
    assert outs[4].held and snapshots[3][1] == final, "the end-of-input kill met held rows and wrote nothing more"
    assert len(outs[1].held) > 0 and 0 in snapshots[0][1] and 2 in snapshots[1][1], "the kills met held rows"
    for ids, before, _, _ in snapshots:
        for batch_id in ids:
            assert final.get(batch_id) == before.get(batch_id, final.get(batch_id)), \
                f"batch {batch_id} was rewritten differently"


@pytest.mark.slow
def test_kills_keep_held_rows_in_exactly_once_postgres(tmp_path, batch_files, pg_dsn, pg_schema):
    feed = Feed()
    write_batches(feed, batch_files("in"), BATCHES)
    table = f"{pg_schema}.released"
    toml = row_toml("row-crash-pg", tmp_path, DELAYED_SQL, store=postgres_store(pg_dsn, pg_schema),
                    target=postgres_target(pg_dsn, table, same_transaction=True))
    spec = load_pipeline(toml)
    pending: list[int] = []
    assert run_with_kills(toml, tmp_path / "faults", "store_commit:0,store_commit:2,after_store_commit:flush",
                          lambda: pending.append(summary(spec, windows=False)["pending"]["rows"])) == 3

    outs = oracle_run(feed, spec.run.checkpoint_location, DELAYED_QUERY)
    released = {h.row["id"] for h in outs[2].released} & {h.row["id"] for h in outs[1].held}
    assert pending == [0, len(outs[1].held), len(outs[4].held)] and outs[0].held and released, \
        "batch 0's held rows were lost with its transaction; batch 1's were found by the second kill, some released by batch 2"
    got = by_batch(postgres_rows(pg_dsn, table, ["id", "k", "v", "page", "_event_ts", "_batch_id"]))
    assert got == {b: sorted(rows, key=repr) for b, rows in expected_batches(outs).items()}


PLAIN_QUERY = ro.Query(select=lambda r: plain_row(r, ("id", "k", "v", "page", "_event_ts")),
                       where=lambda r: ge(r["v"], 20))


@pytest.mark.slow
def test_a_kill_inside_a_plain_row_pipelines_commit_rewrites_the_batch_identically(tmp_path, batch_files):
    """Without WATERMARK_TS() (nothing held): killed inside batch 2's store transaction, after its parquet file
    was written; the replay rewrites that file identically and the whole output equals the oracle."""
    feed = Feed()
    write_batches(feed, batch_files("in"), BATCHES)
    toml = row_toml("row-crash-plain", tmp_path, "SELECT id, k, v, page, _event_ts FROM source WHERE v >= 20",
                    max_buffered_rows=None)
    spec = load_pipeline(toml)
    cp, out = spec.run.checkpoint_location, spec.target.path
    before: list[tuple[set[int], dict[int, list[tuple]]]] = []
    assert run_with_kills(toml, tmp_path / "faults", "store_commit:2",
                          lambda: before.append((offsets_written(cp), parquet_batches(out)))) == 1
    outs = oracle_run(feed, cp, PLAIN_QUERY)
    final = parquet_batches(out)
    assert final == expected_batches(outs) and 2 in before[0][1], "batch 2's file was written before the kill"
    assert all(final[b] == rows for b, rows in before[0][1].items()), "a batch was rewritten differently"
