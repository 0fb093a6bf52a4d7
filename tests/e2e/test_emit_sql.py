"""``[emit] sql`` end to end (SPEC §11): files -> windows -> the delay -> parquet on real Spark, against the trigger
oracle's emitted rows put through the ``[emit]`` oracle (tests/e2e/emit_oracle.py, no engine code).

Two pipelines over the six micro-batches of ``trigger_helpers.BATCHES`` (SQLite state, ``every_batch``, the
end-of-input flush), each run once and read by several tests:

* tumbling windows under ``reopen`` with ``[target] retractions``: finals wait while corrections replace
  them (and, preceded by their retract, still leave as finals), ``b``'s rows leave at once, the NULL
  group's never; then a second run with one more file: the flush's rows left nothing in the flush and
  leave in that later batch, once its W reaches them;
* session windows under ``drop``: early rows wait while their session's end grows (each replaced by
  the next, with a later release time), merged sessions' retracts cancel pending rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from ematix_dagster.spec import load_pipeline_str
from tests.conftest import BatchFiles
from tests.e2e.emit_oracle import PREDICATE, EmitOracle
from tests.e2e.lateness_helpers import Feed, metric, run
from tests.e2e.trigger_helpers import BATCHES, SEQ, config, pipeline_text, read_target, view, write_input
from tests.e2e.trigger_oracle import Config, Row, TriggerOracle

MORE = [[("a", 400, 22)]]  # the second run's one file: W = 395 s


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


@pytest.fixture(scope="module")
def tumbling(spark, tmp_path_factory) -> Ran:
    name, cfg = "emit-tumbling", config("tumbling", "reopen", "every_batch", True)
    root = tmp_path_factory.mktemp(name)
    files = BatchFiles(root / "in")
    feed = write_input(files)
    spec = load_pipeline_str(pipeline_text(name, root, cfg) + emit_table())
    first = run(spec, spark)[1]
    write_input(files, MORE, feed)
    second = run(spec, spark)[1]
    want = expected(feed, spec.run.checkpoint_location, cfg, flush_after={len(BATCHES) - 1, len(BATCHES)})
    return Ran(name, cfg, spec.target.path, want, [first, second])


@pytest.fixture(scope="module")
def session(spark, tmp_path_factory) -> Ran:
    name, cfg = "emit-session", config("session", "drop", "every_batch", False)
    root = tmp_path_factory.mktemp(name)
    feed = write_input(BatchFiles(root / "in"))
    spec = load_pipeline_str(pipeline_text(name, root, cfg) + emit_table())
    registry = run(spec, spark)[1]
    want = expected(feed, spec.run.checkpoint_location, cfg, flush_after={len(BATCHES) - 1})
    return Ran(name, cfg, spec.target.path, want, [registry])


@pytest.mark.slow
def test_tumbling_reopen_rows_leave_in_the_batch_whose_watermark_reaches_them(tumbling: Ran) -> None:
    check_written(tumbling.path, tumbling.want)


@pytest.mark.slow
def test_session_rows_leave_in_the_batch_whose_watermark_reaches_them(session: Ran) -> None:
    check_written(session.path, session.want)


@pytest.mark.slow
def test_the_runs_exercise_the_rules(tumbling: Ran, session: Ran) -> None:
    """The inputs must reach the rules the runs are there for (else the comparisons prove little)."""
    t, s = tumbling.want, session.want
    last = len(BATCHES) - 1
    emitted = [r for rows in t.emitted for r in rows]
    released = [r for rows in t.released for r in rows]
    # a correction replaced a pending final and left as a final; a retract leaves at once; NULL never leaves
    assert any(r["_emit_kind"] == "correction" for r in emitted) and not any(
        r["_emit_kind"] == "correction" and r["k"] == "a" and r["window_start"] == 0 for r in released)
    assert any(r["_emit_kind"] == "retract" for r in released) and not any(r["k"] is None for r in released)
    assert t.oracle.not_released > 0
    # the flush's rows waited and left in the later batch, not before W reached them
    flushed = {(r["window_start"], r["k"]) for r in t.flushes[last] if r["k"] is not None}
    assert flushed and flushed <= {(r["window_start"], r["k"]) for r in t.released[last + 1]}
    assert any(r["window_end"] + 30_000_000 > t.watermarks[last] for r in t.flushes[last] if r["k"] == "a")
    # sessions: an early row replaced while pending by one whose session grew
    ends: dict[tuple, set[int]] = {}
    for rows in s.emitted:
        for r in rows:
            if r["_emit_kind"] == "early":
                ends.setdefault((r["window_start"], r["k"]), set()).add(r["window_end"])
    assert any(len(v) > 1 for v in ends.values()), ends
    assert any(r["_emit_kind"] == "retract" for rows in s.emitted for r in rows)


@pytest.mark.slow
def test_metrics_count_released_and_buffered_rows_and_the_output_watermark(tumbling: Ran, session: Ran) -> None:
    for ran, registries in ((tumbling, tumbling.registries), (session, session.registries)):
        want = ran.want
        released = sum(len(rows) for rows in want.released)
        got = sum(metric(r, "released_rows_total", pipeline=ran.name) or 0 for r in registries)
        assert got == released
        pending = len(want.oracle.pending) + len(want.oracle.retracts)
        assert metric(registries[-1], "buffered_rows", pipeline=ran.name) == pending
        assert metric(registries[-1], "watermark_seconds", pipeline=ran.name, source="_output") == \
            want.output_watermarks[-1] / 1e6
        never = sum(metric(r, "rows_filtered_total", pipeline=ran.name, reason="not_released") or 0
                    for r in registries)
        assert never == want.oracle.not_released
