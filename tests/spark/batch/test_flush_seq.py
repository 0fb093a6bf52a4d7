"""The end-of-input flush continues the ``_emit_seq`` of the last batch's rows (docs/contract/emission.md), also in a
later run that has no batch of its own: the count then comes back from the state store.

Run 1 (``end_of_input = "keep"``) reads one file: batch 0 writes the closed window [0 s, 60 s) and
keeps [60 s, 120 s) open. Run 2, on the same checkpoint and SQLite store with ``"flush"`` and no new
input, runs no batch; its flush writes ``batch_id=0/flush.parquet`` beside batch 0's ``part-0``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq

from ematix_dagster.spark.runner import PipelineRunner
from tests.dagster_support import small_spec

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SCHEMA = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))])
# window [0, 60): users 1 (twice), 2 and 3; window [60, 120): users 1 and 4; the watermark ends at 75 s
ROWS = [{"user_id": u, "amount": 1.0, "ts": T0 + timedelta(seconds=s)}
        for u, s in ((1, 5), (2, 12), (1, 20), (3, 47), (1, 61), (4, 75))]


def test_a_later_runs_flush_numbers_its_rows_after_the_last_batchs(spark, tmp_path, batch_files):
    spec = small_spec(tmp_path, "flush-seq")
    batch_files("in").write(ROWS, SCHEMA)
    first = PipelineRunner(spec, spark=spark, progress=lambda line: None).run()
    assert first.batches == 1 and first.windows_left_open == 1
    flush = dataclasses.replace(spec, run=dataclasses.replace(spec.run, end_of_input="flush"))
    second = PipelineRunner(flush, spark=spark, progress=lambda line: None).run()
    assert second.batches == 1 and [r.batch_id for r in second.reports] == [0]  # the flush only

    out = tmp_path / "out" / "batch_id=0"
    assert sorted(p.name for p in out.iterdir()) == ["flush.parquet", "part-0.parquet"]
    part = [(r["window_start"] - T0, r["user_id"], r["clicks"], r["_emit_kind"], r["_emit_seq"])
            for r in pq.read_table(out / "part-0.parquet").to_pylist()]
    flushed = [(r["window_start"] - T0, r["user_id"], r["clicks"], r["_emit_kind"], r["_emit_seq"])
               for r in pq.read_table(out / "flush.parquet").to_pylist()]
    zero, minute = timedelta(0), timedelta(seconds=60)
    assert sorted(r[:4] for r in part) == [(zero, 1, 2, "final"), (zero, 2, 1, "final"), (zero, 3, 1, "final")]
    assert [r[4] for r in part] == [0, 1, 2]
    assert sorted(r[:4] for r in flushed) == [(minute, 1, 1, "final"), (minute, 4, 1, "final")]
    assert [r[4] for r in flushed] == [3, 4], "the flush continues batch 0's numbers (3 rows)"
