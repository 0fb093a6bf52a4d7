"""``[emit] sql`` end to end (docs/contract/delayed-windows.md): files -> windows -> the delay -> parquet on real Spark,
against the trigger oracle's emitted rows put through the ``[emit]`` oracle (tests/e2e/emit_oracle.py, no engine code).

Session windows under ``drop`` over the six micro-batches of ``trigger_helpers.BATCHES`` (SQLite state,
``every_batch``, the end-of-input flush), run once and read by the tests below: early rows wait while their
session's end grows (each replaced by the next, with a later release time), a merged session's retract cancels
a waiting row, the NULL group's rows never leave. Tumbling windows under ``reopen`` (corrections replacing
waiting finals, a later run after the flush) run in tests/e2e/test_emit_sql_crashes.py, killed on the way.
The helpers here serve both files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from ematix_dagster.operations import summary
from ematix_dagster.spec import load_pipeline_str
from tests.conftest import BatchFiles
from tests.e2e.emit_oracle import PREDICATE, EmitOracle
from tests.e2e.lateness_helpers import Feed, metric, run
from tests.e2e.trigger_helpers import BATCHES, SEQ, config, pipeline_text, read_target, view, write_input
from tests.e2e.trigger_oracle import Config, Row, TriggerOracle


def emit_table(max_rows: int = 1000) -> str:
    return f'\n[emit]\nsql = "SELECT * FROM windows WHERE {PREDICATE}"\nmax_buffered_rows = {max_rows}\n'


@dataclass
class Expected:
    released: list[list[Row]]  # per batch, in the order written
    emitted: list[list[Row]]  # what the trigger oracle says each batch emitted (before the delay)
    flushes: dict[int, list[Row]]  # batch id -> the rows its flush emitted (none leave in it)
    watermarks: list[int | None]
    output_watermarks: list[int | None]
    oracle: EmitOracle


def expected(feed: Feed, checkpoint: str, cfg: Config, flush_after: set[int]) -> Expected:
    """Every batch read (``offsets/N``) through the trigger oracle, a flush after each of ``flush_after``, and
    the ``[emit]`` oracle over what they emit."""
    triggers, delay = TriggerOracle(cfg), EmitOracle()
    out = Expected([], [], {}, [], [], delay)
    for batch_id, batch in enumerate(feed.batches(checkpoint, ["a"])):
        rows = triggers.batch(batch.time_us, batch.rows.to_dict("records"))
        W = triggers.out.watermarks[-1]
        out.emitted.append(rows)
        out.watermarks.append(W)
        out.released.append(delay.batch(batch_id, rows, W))
        smallest = delay.smallest_pending_end()
        out.output_watermarks.append(W if smallest is None or W is None else min(W, smallest))
        if batch_id in flush_after:
            out.flushes[batch_id] = flushed = triggers.flush()
            assert delay.batch(batch_id, flushed, W, first_seq=len(rows), flush=True) == []
    return out


def check_written(path: str, want: Expected) -> None:
    """Each batch's file holds its released rows in release order, ``_emit_seq`` from 0; a flush's file none."""
    got = read_target(path)
    for batch_id, rows in enumerate(want.released):
        part, flush = got.get(batch_id, ([], []))
        assert view(part) == view(rows), f"batch {batch_id}"
        assert [r[SEQ] for r in part] == list(range(len(part))), f"batch {batch_id}: _emit_seq"
        assert flush == [], f"the flush after batch {batch_id} released {flush}"
    assert set(got) <= set(range(len(want.released)))


@dataclass
class Ran:
    name: str
    cfg: Config
    path: str
    want: Expected
    registries: list[Any]
    output_watermark: int | None = None  # the one the store committed last (schema step 11)


@pytest.fixture(scope="module")
def session(spark, tmp_path_factory) -> Ran:
    name, cfg = "emit-session", config("session", "drop", "every_batch", False)
    root = tmp_path_factory.mktemp(name)
    feed = write_input(BatchFiles(root / "in"))
    spec = load_pipeline_str(pipeline_text(name, root, cfg) + emit_table())
    registry = run(spec, spark)[1]
    want = expected(feed, spec.run.checkpoint_location, cfg, flush_after={len(BATCHES) - 1})
    return Ran(name, cfg, spec.target.path, want, [registry], summary(spec, windows=False)["output_watermark"])


@pytest.mark.slow
def test_session_rows_leave_in_the_batch_whose_watermark_reaches_them(session: Ran) -> None:
    check_written(session.path, session.want)


@pytest.mark.slow
def test_the_run_exercises_the_rules(session: Ran) -> None:
    """The input must reach the rules the run is there for (else the comparison proves little): an early row
    replaced while waiting by one whose session grew, a merged session's retract cancelling a waiting row,
    rows left to wait after the flush."""
    want = session.want
    ends: dict[tuple, set[int]] = {}
    for rows in want.emitted:
        for r in rows:
            if r["_emit_kind"] == "early":
                ends.setdefault((r["window_start"], r["k"]), set()).add(r["window_end"])
    assert any(len(v) > 1 for v in ends.values()), ends
    assert any(r["_emit_kind"] == "retract" for rows in want.emitted for r in rows)
    assert not any(r["_emit_kind"] == "retract" for rows in want.released for r in rows), "cancelled, not written"
    assert want.oracle.pending and want.oracle.not_released


@pytest.mark.slow
def test_metrics_count_released_and_buffered_rows_and_the_output_watermark(session: Ran) -> None:
    want, registry, name = session.want, session.registries[0], session.name
    assert metric(registry, "released_rows_total", pipeline=name) == sum(len(rows) for rows in want.released)
    assert metric(registry, "buffered_rows", pipeline=name) == len(want.oracle.pending) + len(want.oracle.retracts)
    assert metric(registry, "watermark_seconds", pipeline=name, source="_output") == want.output_watermarks[-1] / 1e6
    # the flush releases nothing and its open sessions end past W: the stored one is the last batch's too
    assert session.output_watermark == want.output_watermarks[-1] is not None
    assert metric(registry, "rows_filtered_total", pipeline=name, reason="not_released") == want.oracle.not_released
