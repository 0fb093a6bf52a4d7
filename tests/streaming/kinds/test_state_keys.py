"""Key ids (``ematix_dagster/streaming/kinds/state_keys.py``): dense, in order of first sight, whether a
batch brings new keys or none, against a dict kept here."""

from __future__ import annotations

import random

import pytest

from ematix_dagster.streaming.kinds.state_keys import KeyIndex


@pytest.mark.parametrize("seed", range(4))
def test_ids_are_dense_in_order_of_first_sight_over_batches_with_and_without_new_keys(seed: int) -> None:
    rng = random.Random(seed)
    index, seen = KeyIndex(), {}
    for batch in range(30):
        pool = 5 + batch // 3 if rng.random() < 0.5 else len(seen) or 1  # some batches only bring held keys
        keys = [(rng.randrange(pool), "x") for _ in range(rng.randint(0, 20))]
        for key in keys:
            seen.setdefault(key, len(seen))
        assert index.ids_of(keys).tolist() == [seen[key] for key in keys]
        assert index.keys == list(seen)
