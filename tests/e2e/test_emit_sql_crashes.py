"""``[emit] sql``'s pending rows survive SIGKILL (SPEC §11; fault points of ``ematix_dagster/faults.py``, driven by
``run_with_kills`` of tests/e2e/test_emit_trigger_crashes.py): each series is one ``ematix-dagster run`` process group
over ``trigger_helpers.BATCHES`` (tumbling windows under ``reopen``, ``every_batch``, the flush), killed and restarted
until it exits 0, then compared with the ``[emit]`` oracle (tests/e2e/emit_oracle.py):

* parquet target with ``retractions``, SQLite store: killed when batch 0's rows are written (nothing of it
  committed), inside batch 2's store transaction and when the flush's (empty) file is written. Every batch
  directory written before a kill holds the same rows at the end, the output equals the oracle, and the store
  holds as many pending rows as the oracle (the flush's);
* exactly-once PostgreSQL (``same_transaction``, PostgreSQL store): killed inside batch 2's transaction and inside
  the flush's; the table equals the released rows folded by key (the latest row per key, ``_emit_kind`` included).

Each restart starts a JVM (about 20 s on a busy machine), so the kills are few.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import psycopg
import pytest

from ematix_dagster.operations import summary
from ematix_dagster.spec import load_pipeline
from tests.conftest import BatchFiles
from tests.e2e.test_emit_sql import check_written, emit_table, expected
from tests.e2e.test_emit_trigger_crashes import offsets_written, run_with_kills
from tests.e2e.trigger_helpers import BATCHES, config, pipeline_text, read_target, write_input
from tests.pipeline_toml import postgres_store, postgres_target

LAST = len(BATCHES) - 1


@pytest.mark.slow
def test_kills_keep_pending_rows_and_rewrite_parquet_batches_identically(tmp_path):
    cfg = config("tumbling", "reopen", "every_batch", True)
    feed = write_input(BatchFiles(tmp_path / "in"))
    toml = tmp_path / "emit-crash.toml"
    toml.write_text(pipeline_text("emit-crash", tmp_path, cfg) + emit_table())
    spec = load_pipeline(toml)
    out, cp = spec.target.path, spec.run.checkpoint_location
    snapshots: list[tuple[set[int], dict[int, Any]]] = []

    def snapshot() -> None:
        snapshots.append((offsets_written(cp), read_target(out)))

    assert run_with_kills(toml, tmp_path / "faults", "target_write:0,store_commit:2,target_write:flush") == 3
    assert [sorted(ids) for ids, _ in snapshots] == [[0], [0, 1, 2], list(range(LAST + 1))]
    final = read_target(out)
    for ids, before in snapshots:
        for batch_id in ids:
            assert final.get(batch_id, ([], []))[0] == before.get(batch_id, ([], []))[0], f"batch {batch_id} rewritten"
    want = expected(feed, cp, cfg, flush_after={LAST})
    check_written(out, want)
    assert summary(spec, windows=False)["pending"]["rows"] == len(want.oracle.pending) + len(want.oracle.retracts) > 0


@pytest.mark.slow
def test_kills_into_exactly_once_postgres_keep_the_table_exact(tmp_path, pg_dsn, pg_schema):
    cfg = config("tumbling", "reopen", "every_batch", False)
    feed = write_input(BatchFiles(tmp_path / "in"))
    table = f"{pg_schema}.delayed"
    toml = tmp_path / "emit-crash-pg.toml"
    toml.write_text(pipeline_text("emit-crash-pg", tmp_path, cfg, store=postgres_store(pg_dsn, pg_schema),
                                  target=postgres_target(pg_dsn, table, same_transaction=True)) + emit_table())
    spec = load_pipeline(toml)
    assert run_with_kills(toml, tmp_path / "faults", "store_commit:2,store_commit:flush") == 2

    want = expected(feed, spec.run.checkpoint_location, cfg, flush_after={LAST})
    folded: dict[tuple, tuple] = {}
    for rows in want.released:
        for r in rows:
            key = (r["window_start"], r["k"])
            if r["_emit_kind"] == "retract":
                folded.pop(key, None)
            else:
                folded[key] = (r["window_end"], r["n"], r["total"], r["_emit_kind"])
    assert any(kind == "final" for *_v, kind in folded.values()) and want.oracle.pending
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT window_start, window_end, k, n, total, _emit_kind FROM {table}").fetchall()

    def us(ts: Any) -> int:
        return int(pd.Timestamp(ts).value // 1000)

    got = {(us(ws), k): (us(we), n, total, kind) for ws, we, k, n, total, kind in rows}
    assert len(got) == len(rows) and got == folded
