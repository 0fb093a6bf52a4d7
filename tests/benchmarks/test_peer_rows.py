"""The rule ``peers.py`` compares a peer's window rows with ours by (hand-built rows, no engine)."""

from __future__ import annotations

import pandas as pd

from benchmarks.peer_rows import HLL_BOUND, compare


def _rows(*rows: tuple[int, int, int, int, float]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["key", "start_ms", "end_ms", "n", "total"])


def test_rows_equal_when_sums_differ_only_in_the_last_bits():
    ours = _rows((1, 0, 60_000, 3, 0.1 + 0.2 + 0.3), (2, 0, 60_000, 1, 5.0))
    peer = _rows((2, 0, 60_000, 1, 5.0), (1, 0, 60_000, 3, 0.3 + 0.2 + 0.1))
    assert compare(ours, peer, "Flink").verdict() == "equal"


def test_a_count_and_a_missing_window_are_named():
    ours = _rows((1, 0, 60_000, 3, 6.0), (1, 60_000, 120_000, 1, 1.0))
    peer = _rows((1, 0, 60_000, 2, 6.0))
    assert compare(ours, peer, "Flink").verdict() == "DIFFER: only ours 1, count differs 1"


def test_distinct_counts_pass_within_the_sketch_error_only():
    ours = _rows((1, 0, 60_000, 3, 6.0)).assign(items=1000.0)
    assert compare(ours, ours.assign(items=1000.0 * (1 + HLL_BOUND / 2)), "Flink").equal
    assert compare(ours, ours.assign(items=1000.0 * (1 + 2 * HLL_BOUND)), "Flink").items_outside == 1


def test_a_session_split_at_an_exact_gap_is_the_named_rule():
    # rows of key 1 at 0, 30 s and 40 s: ours joins 0 and 30 s (exactly the 30 s gap apart)
    ours = _rows((1, 0, 70_000, 3, 6.0), (2, 0, 30_000, 1, 1.0))
    peer = _rows((1, 0, 30_000, 1, 1.0), (1, 30_000, 70_000, 2, 5.0), (2, 0, 30_000, 1, 1.0))
    verdict = compare(ours, peer, "Flink", session_gap_ms=30_000).verdict()
    assert verdict.startswith("equal but for: 1 session(s): ours joins two rows exactly the gap apart")


def test_a_session_split_elsewhere_is_a_difference():
    ours = _rows((1, 0, 70_000, 3, 6.0))
    peer = _rows((1, 0, 30_000, 1, 1.0), (1, 31_000, 70_000, 2, 5.0))  # the peer's sessions do not touch
    assert compare(ours, peer, "Flink", session_gap_ms=30_000).verdict().startswith("DIFFER")
