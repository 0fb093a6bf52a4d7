"""SIGKILL crashes under an interval trigger (docs/contract/when-results-leave.md, "Replays"): batches replay with their
recorded batch times, so they fire as the original did and are rewritten identically.

Each series is one ``ematix-dagster run`` process group killed at fault points (``ematix_dagster/faults.py``,
driven as ``tests/e2e/test_crash_recovery.py`` does) and restarted with a plain ``run`` until it exits 0:

* parquet target with ``retractions = true``, SQLite store, session windows under ``reopen``:
  killed when batch 0's rows are written, inside batch 2's store transaction and when the flush's
  rows are written. After each kill the target is read; every file of a batch whose ``offsets/N``
  existed before the kill must hold the same rows after the restarts (a replay rewrites it
  identically), and the whole output must equal the trigger oracle fed the batch times Spark
  recorded (``offsets/N`` read after the last run);
* exactly-once PostgreSQL (``same_transaction``, PostgreSQL store; the interval trigger without
  retractions, which PostgreSQL refuses): killed inside batch 2's transaction (target rows, state
  and timer roll back together; the replay fires as the original did); the table must equal the
  oracle's latest row per key (``_emit_kind`` included). One kill only: each restart costs a JVM.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pytest

from ematix_dagster.spec import load_pipeline
from tests.conftest import BatchFiles
from tests.e2e.test_crash_recovery import finish, start_run, wait_group_gone
from tests.e2e.trigger_helpers import (
    check_against_oracle,
    check_finals,
    check_retractions,
    config,
    oracle_for,
    pipeline_text,
    read_target,
    write_input,
)
from tests.pipeline_toml import postgres_store, postgres_target

INTERVAL = {"interval_ms": 3_000}


def offsets_written(checkpoint: str) -> set[int]:
    return {int(p.name) for p in (Path(checkpoint) / "offsets").iterdir() if p.name.isdigit()}


def run_with_kills(toml: Path, fault_dir: Path, kills: str, after_kill=None) -> int:
    """Run until exit 0, calling ``after_kill()`` after each kill; returns the number of kills."""
    killed = 0
    for _ in range(len(kills.split(",")) + 2):
        proc = start_run(toml, EMATIX_FAULT_POINTS=kills, EMATIX_FAULT_DIR=str(fault_dir))
        err = finish(proc)
        if proc.returncode == -signal.SIGKILL:
            killed += 1
            assert wait_group_gone(proc.pid) == [], "a process of the killed group (driver or JVM) survived"
            if after_kill is not None:
                after_kill()
            continue
        assert proc.returncode == 0, err[-3000:]
        assert wait_group_gone(proc.pid) == []
        fired = sorted(p.name for p in fault_dir.iterdir())
        assert fired == sorted(f"{p.replace(':', '-')}.fired" for p in kills.split(",")), "every point was reached"
        return killed
    pytest.fail("the pipeline never finished")


@pytest.mark.slow
def test_kills_under_an_interval_trigger_with_retractions_rewrite_batches_identically(tmp_path):
    cfg = config("session", "reopen", INTERVAL, True)
    feed = write_input(BatchFiles(tmp_path / "in"))
    toml = tmp_path / "crash-trigger.toml"
    toml.write_text(pipeline_text("crash-trigger", tmp_path, cfg))
    spec = load_pipeline(toml)
    out, cp = spec.target.path, spec.run.checkpoint_location
    snapshots: list[tuple[set[int], dict[int, Any]]] = []

    def snapshot() -> None:
        snapshots.append((offsets_written(cp), read_target(out) if Path(out).exists() else {}))

    kills = "target_write:0,store_commit:2,target_write:flush"
    assert run_with_kills(toml, tmp_path / "faults", kills, snapshot) == 3
    final = read_target(out)
    assert [sorted(ids) for ids, _ in snapshots] == [[0], [0, 1, 2], [0, 1, 2, 3, 4, 5]]
    # what each kill interrupted had been written: batch 0's rows, batch 2's rows, the flush's rows
    assert snapshots[0][1][0][0] and snapshots[1][1][2][0] and snapshots[2][1][5][1]
    for ids, before in snapshots:
        for batch_id in ids:
            part, flush = before.get(batch_id, ([], []))
            assert final.get(batch_id, ([], []))[0] == part, f"batch {batch_id} was rewritten differently"
            if flush:
                assert final[batch_id][1] == flush, "the flush was rewritten differently"

    expected = oracle_for(feed, cp, cfg)
    assert expected.fired[0] and not all(expected.fired), expected.fired
    check_against_oracle(out, expected, cfg)
    check_finals(final, expected, cfg)
    check_retractions(final, expected, cfg)


@pytest.mark.slow
def test_kills_under_an_interval_trigger_into_exactly_once_postgres(tmp_path, pg_dsn, pg_schema):
    cfg = config("tumbling", "reopen", INTERVAL, False)
    feed = write_input(BatchFiles(tmp_path / "in"))
    table = f"{pg_schema}.triggered"
    toml = tmp_path / "crash-trigger-pg.toml"
    toml.write_text(pipeline_text("crash-trigger-pg", tmp_path, cfg, store=postgres_store(pg_dsn, pg_schema),
                                  target=postgres_target(pg_dsn, table, same_transaction=True)))
    spec = load_pipeline(toml)
    assert run_with_kills(toml, tmp_path / "faults", "store_commit:2") == 1

    expected = oracle_for(feed, spec.run.checkpoint_location, cfg)
    kinds = {r["_emit_kind"] for r in expected.final_table.values()}
    assert {"final", "correction"} <= kinds, "the table holds corrections beside finals"
    assert any(r["_emit_kind"] == "early" for b in expected.batches for r in b)
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT window_start, window_end, k, n, total, _emit_kind FROM {table}").fetchall()

    def us(ts: Any) -> int:
        return int(pd.Timestamp(ts).value // 1000)

    got = {(us(ws), k): (us(we), n, total, kind) for ws, we, k, n, total, kind in rows}
    assert len(got) == len(rows), "one row per (window_start, k)"
    assert got == {key: (r["window_end"], r["n"], r["total"], r["_emit_kind"]) for key, r in expected.final_table.items()}
