"""Ground truths for the streaming unit tests, written out by hand, independent of the code under test.

Shared by ``tests/streaming/test_aggregators.py``, ``kinds/test_window_kinds.py`` and ``test_micro_batch.py``.
"""

from __future__ import annotations

import math
import random
from typing import Any

NAN = float("nan")
MS = 1_000  # µs per ms


def same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN and floats compare with a tiny tolerance."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def spark_key(v: Any) -> tuple:
    """Spark's order of non-null values: NaN is larger than every other float (incl. +inf)."""
    if isinstance(v, float) and v != v:
        return (1, 0)
    return (0, v)


def brute_starts(t: int, duration: int, hop: int, lo: int = -2000, hi: int = 2000) -> list[int]:
    """Every multiple of hop in [lo*hop, hi*hop] whose window [s, s+D) contains t, by exhaustion."""
    return [s for s in range(lo * hop, hi * hop + 1, hop) if s <= t < s + duration]


def direct(agg: str, rows: list[tuple[int, Any]]) -> Any:
    """The answer over all rows at once, Spark semantics, written out by hand."""
    vals = [v for _, v in rows if v is not None]
    if agg == "count":
        return len(rows)
    if agg == "count_col":
        return len(vals)
    if agg == "count_distinct":
        return len(set(vals))
    if not vals:
        return None
    if agg == "sum":
        return sum(vals)
    if agg == "avg":
        return sum(vals) / len(vals)
    nans = [v for v in vals if isinstance(v, float) and v != v]
    real = [v for v in vals if not (isinstance(v, float) and v != v)]
    if agg == "max":
        return NAN if nans else max(real)
    if agg == "min":
        return min(real) if real else NAN
    timed = [(t, v) for t, v in rows if v is not None]
    if agg == "first":
        t0 = min(t for t, _ in timed)
        cands = [v for t, v in timed if t == t0]
        real = [v for v in cands if not (isinstance(v, float) and v != v)]
        return min(real) if real else NAN
    if agg == "last":
        t1 = max(t for t, _ in timed)
        cands = [v for t, v in timed if t == t1]
        if any(isinstance(v, float) and v != v for v in cands):
            return NAN
        return max(cands)
    raise AssertionError(agg)


def spark_partial(agg: str, rows: list[tuple[int, Any]]) -> Any:
    """What the executors hand the driver for one chunk of rows (one (window, group), one batch)."""
    vals = [v for _, v in rows if v is not None]
    if agg == "count":
        return len(rows)
    if agg == "count_col":
        return len(vals)
    if agg == "count_distinct":
        return sorted(set(vals), key=spark_key)  # collect_set: a list
    if agg == "avg":
        return (sum(vals) if vals else None, len(vals))  # sum(col), count(col)
    if not vals:
        return None
    if agg == "sum":
        return sum(vals)
    if agg == "min":
        return min(vals, key=spark_key)
    if agg == "max":
        return max(vals, key=spark_key)
    timed = [(t, v) for t, v in rows if v is not None]
    if agg == "first":
        return min(timed, key=lambda p: (p[0], spark_key(p[1])))
    if agg == "last":
        return max(timed, key=lambda p: (p[0], spark_key(p[1])))
    raise AssertionError(agg)


def random_split(rng: random.Random, items: list, max_parts: int = 6) -> list[list]:
    """Split into 1..max_parts non-empty chunks at random cut points."""
    n = len(items)
    k = rng.randint(1, min(max_parts, n))
    cuts = sorted(rng.sample(range(1, n), k - 1))
    bounds = [0, *cuts, n]
    return [items[a:b] for a, b in zip(bounds, bounds[1:])]


def fold_random_tree(rng: random.Random, agg_obj: Any, partials: list) -> Any:
    """Merge partials pairwise in a random tree and random argument order."""
    pool = list(partials)
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        a, b = pool[i], pool[j]
        merged = agg_obj.merge(a, b) if rng.random() < 0.5 else agg_obj.merge(b, a)
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [merged]
    return pool[0]
