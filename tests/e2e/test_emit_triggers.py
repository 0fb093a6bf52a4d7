"""Emission triggers and retractions end to end (docs/contract/when-results-leave.md): files -> windows -> parquet on
real Spark, against the trigger oracle (tests/e2e/trigger_oracle.py, no engine code).

Each run is one ``available_now`` pipeline over the five micro-batches of ``trigger_helpers.BATCHES``
(SQLite state, the end-of-input flush), shared by the tests below through a module fixture. The
nine runs put every trigger (every_batch, interval, count) on every window kind (tumbling,
hopping, session); each trigger and each kind meets both ``drop`` and ``reopen``, and each trigger
runs with and without ``[target] retractions``. The oracle gets the rows each batch read
(``sources/0/N``) at the time Spark recorded for it (``offsets/N``), so an interval trigger
fires where the recorded times say; one batch is held for longer than the interval so that it fires
after a batch in which it did not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from ematix_dagster.spec import load_pipeline_str
from tests.conftest import BatchFiles
from tests.e2e.lateness_helpers import metric, run
from tests.e2e.trigger_helpers import (
    BATCHES,
    Pauses,
    check_against_oracle,
    check_finals,
    check_retractions,
    config,
    oracle_for,
    pipeline_text,
    read_target,
    write_input,
)
from tests.e2e.trigger_oracle import Config, Outcome

INTERVAL = {"interval_ms": 6_000}  # longer than a few batches take even on a busy machine: some batches do not fire
PAUSE_S = 6.2  # after batch 3: batch 4 is later than any firing + the interval
COUNT = {"count": 2}

RUNS: dict[str, Config] = {
    "tumbling-drop-every_batch-retractions": config("tumbling", "drop", "every_batch", True),
    "tumbling-reopen-count": config("tumbling", "reopen", COUNT, False),
    "tumbling-drop-interval": config("tumbling", "drop", INTERVAL, False),
    "hopping-reopen-every_batch": config("hopping", "reopen", "every_batch", False),
    "hopping-drop-count-retractions": config("hopping", "drop", COUNT, True),
    "hopping-reopen-interval-retractions": config("hopping", "reopen", INTERVAL, True),
    "session-reopen-count-retractions": config("session", "reopen", COUNT, True),
    "session-drop-every_batch": config("session", "drop", "every_batch", False),
    "session-reopen-interval": config("session", "reopen", INTERVAL, False),
}
FAST = {"tumbling-drop-every_batch-retractions", "session-reopen-count-retractions"}


@dataclass
class Ran:
    name: str
    cfg: Config
    path: str
    expected: Outcome
    registry: Any


@pytest.fixture(scope="module", params=[pytest.param(n, id=n, marks=() if n in FAST else pytest.mark.slow)
                                        for n in RUNS])
def ran(request, spark, tmp_path_factory) -> Ran:
    name, cfg = request.param, RUNS[request.param]
    root = tmp_path_factory.mktemp(name)
    feed = write_input(BatchFiles(root / "in"))
    spec = load_pipeline_str(pipeline_text(name, root, cfg))
    interval = isinstance(cfg.emit_trigger, dict) and "interval_ms" in cfg.emit_trigger
    with Pauses(root / "faults", [3] if interval else [], PAUSE_S):
        _, registry = run(spec, spark)
    expected = oracle_for(feed, spec.run.checkpoint_location, cfg)
    assert len(expected.batches) == len(BATCHES), "one micro-batch per file"
    return Ran(name, cfg, spec.target.path, expected, registry)


def test_every_batch_and_the_flush_equal_the_oracle(ran: Ran) -> None:
    check_against_oracle(ran.path, ran.expected, ran.cfg)


def test_one_final_per_window_and_none_missing(ran: Ran) -> None:
    check_finals(read_target(ran.path), ran.expected, ran.cfg)


def test_retracts_repeat_what_they_withdraw_and_signed_sums_are_the_table(ran: Ran) -> None:
    check_retractions(read_target(ran.path), ran.expected, ran.cfg)


def test_rows_emitted_total_counts_every_row_by_kind(ran: Ran) -> None:
    want = Counter(r["_emit_kind"] for rows in [*ran.expected.batches, ran.expected.flush] for r in rows)
    for kind in ("early", "final", "correction", "retract"):
        assert metric(ran.registry, "rows_emitted_total", pipeline=ran.name, emit_kind=kind) == want[kind], kind


def test_the_run_exercises_its_rules(ran: Ran) -> None:
    """The input must reach the rules each run is there for (else the comparisons prove little)."""
    cfg, out = ran.cfg, ran.expected
    rows = [r for b in [*out.batches, out.flush] for r in b]
    kinds = Counter(r["_emit_kind"] for r in rows)
    assert kinds["early"] and kinds["final"] and any(r["k"] is None for r in rows)
    assert bool(kinds["correction"]) == (cfg.late_data == "reopen")
    assert any(r["_emit_kind"] == "early" for r in out.batches[-1]) or any(r["_emit_kind"] == "final" for r in out.flush)
    if cfg.retractions or cfg.kind == "session":
        assert kinds["retract"]
    trigger = cfg.emit_trigger
    if cfg.kind == "session" and cfg.late_data == "reopen" and trigger != INTERVAL:
        # a late row merged an emitted session with a written one: a retract beside the correction
        assert any({"retract", "correction"} <= {r["_emit_kind"] for r in b} for b in out.batches)
    if trigger == COUNT and cfg.kind != "session":
        earlies = Counter((r["window_start"], r["k"]) for r in rows if r["_emit_kind"] == "early")
        assert max(earlies.values()) >= 2, "a count crossing N twice"
    if trigger == INTERVAL:
        assert out.fired[0] and out.fired[4] and not all(out.fired), f"interval fired {out.fired}"
