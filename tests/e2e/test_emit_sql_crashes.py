"""``[emit] sql`` on tumbling windows under ``reopen`` with SIGKILL on the way (docs/contract/delayed-windows.md; fault
points of ``ematix_dagster/faults.py``, driven by ``run_with_kills`` of tests/e2e/test_emit_trigger_crashes.py): each
series is one ``ematix-dagster run`` process group over ``trigger_helpers.BATCHES`` (``every_batch``, the flush), killed
and restarted until it exits 0, then compared with the ``[emit]`` oracle (tests/e2e/emit_oracle.py):

* parquet target with ``retractions``, SQLite store: killed when batch 0's rows are written (nothing of it
  committed), right after batch 2's store commit (Spark replays it; the store skips it) and when the flush's
  (empty) file is written (its waiting rows not committed). Every batch
  directory written before a kill holds the same rows at the end, the output equals the oracle (finals wait
  while corrections replace them and, after their retract, still leave as finals; ``b``'s rows leave at once,
  the NULL group's never), and the store holds as many waiting rows as the oracle. Then one more file, run in
  this process: the flush's rows left nothing in the flush and leave in that later batch;
* exactly-once PostgreSQL (``same_transaction``, PostgreSQL store): killed inside batch 2's transaction (its
  target rows, waiting rows and state roll back together) and right after the flush's commit (its waiting rows
  kept); the table equals the released rows folded by key.

Each restart starts a JVM (about 20 s on a busy machine), so the kills are few: every point once, batch 0, the
middle and the flush each met at least once.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import psycopg
import pytest

from ematix_dagster.operations import summary
from ematix_dagster.spec import load_pipeline
from tests.conftest import BatchFiles
from tests.e2e.lateness_helpers import run
from tests.e2e.test_emit_sql import check_written, emit_table, expected
from tests.e2e.test_emit_trigger_crashes import offsets_written, run_with_kills
from tests.e2e.trigger_helpers import BATCHES, config, pipeline_text, read_target, write_input
from tests.pipeline_toml import postgres_store, postgres_target

LAST = len(BATCHES) - 1
MORE = [[("a", 400, 22)]]  # the later run's one file: W = 395 s


@pytest.mark.slow
def test_kills_keep_waiting_rows_and_a_later_batch_releases_the_flush(tmp_path, spark):
    cfg = config("tumbling", "reopen", "every_batch", True)
    files = BatchFiles(tmp_path / "in")
    feed = write_input(files)
    toml = tmp_path / "emit-crash.toml"
    toml.write_text(pipeline_text("emit-crash", tmp_path, cfg) + emit_table())
    spec = load_pipeline(toml)
    out, cp = spec.target.path, spec.run.checkpoint_location
    snapshots: list[tuple[set[int], dict[int, Any]]] = []

    def snapshot() -> None:
        snapshots.append((offsets_written(cp), read_target(out)))

    assert run_with_kills(toml, tmp_path / "faults", "target_write:0,after_store_commit:2,target_write:flush",
                          snapshot) == 3
    assert [sorted(ids) for ids, _ in snapshots] == [[0], [0, 1, 2], list(range(LAST + 1))]
    final = read_target(out)
    for ids, before in snapshots:
        for batch_id in ids:
            assert final.get(batch_id, ([], []))[0] == before.get(batch_id, ([], []))[0], f"batch {batch_id} rewritten"
    want = expected(feed, cp, cfg, flush_after={LAST})
    check_written(out, want)
    waiting = len(want.oracle.pending) + len(want.oracle.retracts)
    assert summary(spec, windows=False)["pending"]["rows"] == waiting > 0

    write_input(files, MORE, feed)
    run(spec, spark)
    want = expected(feed, cp, cfg, flush_after={LAST, LAST + 1})
    check_written(out, want)
    # the run reaches the rules it is there for: a correction replaced a waiting final and left as a final,
    # a retract of a released row left, the NULL group never did, the flush's rows left in the later batch
    emitted, released = [r for b in want.emitted for r in b], [r for b in want.released for r in b]
    assert any(r["_emit_kind"] == "correction" and r["k"] == "a" for r in emitted)
    assert not any(r["_emit_kind"] == "correction" and r["k"] == "a" for r in released)
    assert any(r["_emit_kind"] == "retract" for r in released) and not any(r["k"] is None for r in released)
    flushed = {(r["window_start"], r["k"]) for r in want.flushes[LAST] if r["_emit_kind"] != "retract"}
    assert flushed and flushed <= {(r["window_start"], r["k"]) for r in want.released[LAST + 1]}
    assert any(r["window_end"] + 30_000_000 > want.watermarks[LAST] for r in want.flushes[LAST] if r["k"] == "a")


@pytest.mark.slow
def test_a_kill_inside_exactly_once_postgres_keeps_the_table_exact(tmp_path, pg_dsn, pg_schema):
    cfg = config("tumbling", "reopen", "every_batch", False)
    feed = write_input(BatchFiles(tmp_path / "in"))
    table = f"{pg_schema}.delayed"
    toml = tmp_path / "emit-crash-pg.toml"
    toml.write_text(pipeline_text("emit-crash-pg", tmp_path, cfg, store=postgres_store(pg_dsn, pg_schema),
                                  target=postgres_target(pg_dsn, table, same_transaction=True)) + emit_table())
    spec = load_pipeline(toml)
    assert run_with_kills(toml, tmp_path / "faults", "store_commit:2,after_store_commit:flush") == 2

    want = expected(feed, spec.run.checkpoint_location, cfg, flush_after={LAST})
    folded: dict[tuple, tuple] = {}
    for rows in want.released:
        for r in rows:
            key = (r["window_start"], r["k"])
            if r["_emit_kind"] == "retract":
                folded.pop(key, None)
            else:
                folded[key] = (r["window_end"], r["n"], r["total"], r["_emit_kind"])
    assert {"final", "correction"} <= {kind for *_v, kind in folded.values()} and want.oracle.pending
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT window_start, window_end, k, n, total, _emit_kind FROM {table}").fetchall()

    def us(ts: Any) -> int:
        return int(pd.Timestamp(ts).value // 1000)

    got = {(us(ws), k): (us(we), n, total, kind) for ws, we, k, n, total, kind in rows}
    assert len(got) == len(rows) and got == folded
    assert summary(spec, windows=False)["pending"]["rows"] == len(want.oracle.pending) + len(want.oracle.retracts)
