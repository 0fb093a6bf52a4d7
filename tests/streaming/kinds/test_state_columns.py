"""``search_pairs``: where (key id, time) queries sort among held rows sorted by (key id, time),
against Python's own search over tuples, on each of its three paths: the pair as one int64 (small
ids), ids ranked first (ids that are keys' own integers, negative or past what a pair holds), and
run by run (times whose span leaves no room)."""

from __future__ import annotations

import bisect
import random

import numpy as np
import pytest

from ematix_dagster.streaming.kinds.state_columns import search_pairs

IDS = {"small": (0, 50), "own integers": (-(10**15), 10**17)}
TIMES = {"near": (0, 1_000), "a day of µs": (1_700_000_000_000_000, 1_700_086_400_000_000), "far": (-(2**62), 2**62)}


@pytest.mark.parametrize("times", TIMES)
@pytest.mark.parametrize("ids", IDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_pairs_sort_where_tuples_sort(ids: str, times: str, side: str) -> None:
    rng = random.Random(f"{ids}-{times}-{side}")
    (id_lo, id_hi), (t_lo, t_hi) = IDS[ids], TIMES[times]
    pool = [rng.randint(id_lo, id_hi) for _ in range(12)]
    instants = [rng.randint(t_lo, t_hi) for _ in range(8)]
    for _ in range(20):
        held = sorted((rng.choice(pool), rng.choice(instants)) for _ in range(rng.randint(1, 40)))
        queries = [(rng.choice(pool) if rng.random() < 0.7 else rng.randint(id_lo, id_hi),
                    rng.choice(instants) if rng.random() < 0.5 else rng.randint(t_lo, t_hi))
                   for _ in range(rng.randint(1, 30))]
        search = bisect.bisect_left if side == "left" else bisect.bisect_right
        expected = [search(held, q) for q in queries]
        got = search_pairs(np.array([k for k, _ in held], dtype=np.int64), np.array([t for _, t in held], dtype=np.int64),
                           np.array([k for k, _ in queries], dtype=np.int64),
                           np.array([t for _, t in queries], dtype=np.int64), side=side)
        assert got.tolist() == expected
