"""Sliding windows (KIP-450, docs/contract/windows.md) on the driver against an independent ground truth.

The oracle below imports nothing from the engine. It keeps every accepted row with the number of
the batch that brought it and, each batch, applies §9 from scratch:

* W_prev is the watermark before the batch (None before any row); a row at x is late iff
  x + D < W_prev (under ``reopen``: x + D < W_prev - allowed_lateness) and is never kept;
* an accepted row creates the window (key, x) iff x >= W_prev (reopen: x >= W_prev - allowed) and
  no such window exists;
* W = newest event time seen (late rows included) - lateness;
* every live window's values are recomputed from *all* accepted rows of its key with event time in
  [t - D, t] (both bounds inclusive), with plain Python (``oracle_values``);
* a window not emitted yet is written as ``final`` once t < W, except a window created behind
  W_prev (reopen), which is written as a ``correction`` in the batch that created it; an emitted,
  retained window that took a row of this batch is re-written as a ``correction``;
* windows are forgotten once t + retention < W (retention = allowed_lateness under reopen, else 0).

Each batch yields a canonical sorted list of (kind, start = t - D, end = t, key, values).

The engine side is fed what Spark will send: the late rule applied with ``Engine.closed_before()``,
then one partial per (key, event time) of the batch's accepted rows, built per aggregator exactly as
Spark's partial aggregates come out (the formats of ``tests/streaming/test_state_session.py``), in a shuffled
order, merged by the real ``Engine`` with the real aggregator classes. After each batch the state's
``take_changes`` is applied to a simulated store; the randomised runs restart once from it (a new
Engine restored from the store, the watermark and the source clock). No Spark is started.
"""

from __future__ import annotations

import bisect
import copy
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import pytest

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.spec import Aggregation, Window
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats
from ematix_dagster.streaming.state.base import StoredGroup

Key = tuple[Any, ...]
Row = tuple[Key, int, Any]  # (group key, event time µs, value or None)
Out = tuple[str, int, int, Key, tuple[Any, ...]]  # (kind, start, end, key, values)

MS = 1_000  # µs per ms
T = MS  # scenario times are written in ms: 5 * T is 5 ms

# n = count(*), n_v = count(v), then sum, min, max, first, last, exact distinct and avg of v
ALIASES = ["n", "n_v", "sum_v", "min_v", "max_v", "first_v", "last_v", "distinct_v", "avg_v"]
AGGREGATIONS = (
    Aggregation("count", "n"),
    Aggregation("count_col", "n_v", "v"),
    Aggregation("sum", "sum_v", "v"),
    Aggregation("min", "min_v", "v"),
    Aggregation("max", "max_v", "v"),
    Aggregation("first", "first_v", "v"),
    Aggregation("last", "last_v", "v"),
    Aggregation("count_distinct", "distinct_v", "v", mode="exact", max_distinct_values_per_group=10_000),
    Aggregation("avg", "avg_v", "v"),
)
INTEGRAL = (False, False, True, False, False, False, False, False, False)  # only sum_v sums integers
ADDITIVE = ("n", "n_v", "sum_v", "avg_v")  # aggregators whose windows are differences of prefix sums
assert [a.as_ for a in AGGREGATIONS] == ALIASES


@dataclass(frozen=True)
class Params:
    duration_ms: int = 10
    lateness_ms: int = 0
    policy: str = "drop"  # "drop" | "dlq" | "reopen"
    allowed_ms: int = 0  # allowed_lateness_ms (reopen only)
    max_events: int = 1_000
    max_groups: int = 1_000
    aliases: tuple[str, ...] = tuple(ALIASES)  # the aggregations the pipeline has (ALIASES' order)

    def pick(self, values: tuple[Any, ...] | list[Any]) -> Any:
        """Of the nine aggregations' values (or partials), those the pipeline has."""
        picked = [values[ALIASES.index(a)] for a in self.aliases]
        return tuple(picked) if isinstance(values, tuple) else picked

    @property
    def D(self) -> int:  # noqa: N802 - the spec's name
        return self.duration_ms * MS

    @property
    def lateness(self) -> int:
        return self.lateness_ms * MS

    @property
    def retention(self) -> int:
        return self.allowed_ms * MS if self.policy == "reopen" else 0

    def window(self) -> Window:
        return Window(kind="sliding", duration_ms=self.duration_ms, max_events_per_group=self.max_events,
                      max_groups_per_window=self.max_groups, group_by=("k",),
                      aggregations=tuple(a for a in AGGREGATIONS if a.as_ in self.aliases),
                      late_data=self.policy, allowed_lateness_ms=self.allowed_ms if self.policy == "reopen" else None,
                      lateness_ms=self.lateness_ms)


def canon(rows: list[Any]) -> list[Out]:
    """Rows as (kind, start, end, key, values) in one order (keys holding None do not sort)."""
    plain = [r if isinstance(r, tuple) and len(r) == 5 and isinstance(r[0], str) else
             (r.kind, r.start, r.end, tuple(r.key), tuple(r.values)) for r in rows]
    return sorted(plain, key=lambda r: (r[1], repr(r[3]), r[0]))


# -- the oracle: docs/contract/windows.md applied batch by batch, from scratch -----------------------------------

def oracle_values(ts: list[int], vs: list[Any]) -> tuple[Any, ...]:
    """The nine aggregations over rows (event time, value); first/last break event-time ties by value,
    as Spark's min/max over (t, v) structs do."""
    vals = [v for v in vs if v is not None]
    pairs = [(t, v) for t, v in zip(ts, vs) if v is not None]
    return (len(ts), len(vals), sum(vals) if vals else None, min(vals, default=None), max(vals, default=None),
            min(pairs)[1] if pairs else None, max(pairs)[1] if pairs else None, len(set(vals)),
            sum(map(float, vals)) / len(vals) if vals else None)


class Oracle:
    def __init__(self, p: Params) -> None:
        self.p, self.n = p, 0
        self.max_seen: int | None = None
        self.w: int | None = None  # W after the last batch
        self.rows: dict[Key, list[tuple[int, int, Any, int]]] = defaultdict(list)  # key -> sorted (ts, seq, v, batch)
        self.seq = 0
        self.windows: dict[tuple[Key, int], bool] = {}  # live (key, t) -> emitted
        self.gone: set[tuple[Key, int]] = set()
        self.stats: Counter[str] = Counter()
        self.outputs: list[list[Out]] = []

    def _values(self, key: Key, t: int) -> tuple[tuple[Any, ...], bool]:
        """The window's values over all accepted rows of ``key`` in [t - D, t], and whether one of them
        came in the current batch."""
        held = self.rows[key]
        lo = bisect.bisect_left(held, (t - self.p.D,))
        hi = bisect.bisect_left(held, (t + 1,))
        inside = held[lo:hi]
        assert inside, "a window always holds the row that created it"
        return (self.p.pick(oracle_values([r[0] for r in inside], [r[2] for r in inside])),
                any(r[3] == self.n for r in inside))

    def batch(self, rows: list[Row]) -> list[Out]:
        p = self.p
        w_prev = self.w
        threshold = None if w_prev is None else w_prev - p.retention
        created: set[tuple[Key, int]] = set()
        for key, x, v in rows:
            if threshold is not None and x + p.D < threshold:
                self.stats["late"] += 1
                continue
            bisect.insort(self.rows[key], (x, self.seq, v, self.n))
            self.seq += 1
            if threshold is None or x >= threshold:
                assert (key, x) not in self.gone, "a forgotten window can never be created again"
                if (key, x) not in self.windows:
                    self.windows[(key, x)] = False
                    created.add((key, x))
            else:
                self.stats["accepted_without_window"] += 1
        if rows:
            newest = max(t for _, t, _ in rows)
            self.max_seen = newest if self.max_seen is None else max(self.max_seen, newest)
        w = self.w = None if self.max_seen is None else self.max_seen - p.lateness
        assert w_prev is None or (w is not None and w >= w_prev)
        out: list[Out] = []
        for (key, t), emitted in self.windows.items():
            values, changed = self._values(key, t)
            if emitted:
                kind = "correction" if changed else None
                self.stats["changed_retained"] += changed
            elif (key, t) in created and w_prev is not None and t < w_prev:
                kind = "correction"
                self.stats["created_behind"] += 1
            elif w is not None and t < w:
                kind = "final"
            else:
                kind = None
            if kind is not None:
                out.append((kind, t - p.D, t, key, values))
                self.windows[(key, t)] = True
        for kt in [kt for kt in self.windows if w is not None and kt[1] + p.retention < w]:
            assert self.windows[kt], "a window is emitted before it is forgotten"
            del self.windows[kt]
            self.gone.add(kt)
        self.n += 1
        self.outputs.append(canon(out))
        return self.outputs[-1]

    def flush(self) -> list[Out]:
        """End of input: every window not emitted yet, as final."""
        out = []
        for (key, t), emitted in self.windows.items():
            if not emitted:
                out.append(("final", t - self.p.D, t, key, self._values(key, t)[0]))
                self.windows[(key, t)] = True
        return canon(out)


# -- the engine side: late rule, partials as Spark forms them, the real Engine ---------------------

def partials_of(rows: list[Row], rng: random.Random) -> tuple[list[int], list[Key], list[list[Any]]]:
    """One partial per (key, event time) of the batch's accepted rows, in an arbitrary order (as Spark
    returns them): event times, keys, and one column of partials per aggregator."""
    groups: dict[tuple[Key, int], list[Any]] = {}
    for key, t, v in rows:
        groups.setdefault((key, t), []).append(v)
    parts = []
    for (key, t), vs in groups.items():
        vals = [v for v in vs if v is not None]
        pairs = [(t, v) for v in vals]
        parts.append((t, key, [
            len(vs), len(vals), sum(vals) if vals else None, min(vals, default=None), max(vals, default=None),
            min(pairs) if pairs else None, max(pairs) if pairs else None, sorted(set(vals)),
            (float(sum(vals)) if vals else None, len(vals)),
        ]))
    rng.shuffle(parts)
    columns = [[part[2][i] for part in parts] for i in range(len(ALIASES))]
    return [q[0] for q in parts], [q[1] for q in parts], columns


class Harness:
    """Drives the real Engine batch by batch the way the Spark side will, and keeps a simulated store
    (what ``take_changes`` wrote) to restart from."""

    def __init__(self, p: Params, seed: int = 0) -> None:
        self.p, self.rng, self.n = p, random.Random(seed), 0
        self.engine = Engine.for_window("p", p.window(), sources=("s",), integral=p.pick(INTEGRAL))
        self.store: dict[tuple[int, Key], list[Any]] = {}
        self.late = 0
        self.watermarks: list[int | None] = []
        self.outputs: list[list[Out]] = []

    def batch(self, rows: list[Row]) -> list[Out]:
        p, eng = self.p, self.engine
        closed_before = eng.closed_before()
        accepted = [r for r in rows if closed_before is None or r[1] + p.D >= closed_before]
        self.late += len(rows) - len(accepted)
        starts, keys, partials = partials_of(accepted, self.rng)
        partials = p.pick(partials)
        stats = SourceStats(rows=len(rows), max_event_ts=max((t for _, t, _ in rows), default=None))
        res = eng.process(BatchInput(batch_id=self.n, batch_time=self.n, sources={"s": stats}, starts=starts,
                                     keys=keys, partials=partials, late_rows=len(rows) - len(accepted)))
        self.n += 1
        self.commit()
        self.watermarks.append(res.watermark)
        self.outputs.append(canon(res.rows))
        return self.outputs[-1]

    def commit(self) -> None:
        """Apply the state's changes like a store: the range delete, then upserts (one row per (event
        time, key))."""
        changes = self.engine.state.take_changes()
        upserts, evicted_before = changes.upserts, changes.deleted_before
        if evicted_before is not None:  # a range delete: every row of an older event time
            self.store = {tk: accs for tk, accs in self.store.items() if tk[0] >= evicted_before}
        for t, end, key, accs, _emitted in upserts:
            assert end == t
            self.store[(t, key)] = copy.deepcopy(accs)

    def restart(self) -> None:
        """A new Engine continuing from the store, the watermark and the source clock."""
        old = self.engine
        clock = old.watermarks.clocks["s"]
        self.engine = Engine.for_window("p", self.p.window(), sources=("s",), integral=self.p.pick(INTEGRAL))
        groups = [StoredGroup(t, t, key, copy.deepcopy(accs)) for (t, key), accs in self.store.items()]
        self.engine.restore(old.last_batch_id, old.watermarks.global_wm,
                            {"s": (clock.max_event_ts, clock.last_arrival)}, dict(old.counters), groups)
        assert self.engine.closed_before() == old.closed_before()

    def flush(self) -> list[Out]:
        res = self.engine.flush(self.n, self.n)
        self.n += 1
        return canon(res.rows)


class Both:
    """The oracle and the engine side, stepped together; every batch must give the same rows."""

    def __init__(self, p: Params, seed: int = 0) -> None:
        self.p, self.seed = p, seed
        self.oracle, self.harness = Oracle(p), Harness(p, seed)
        self.flushed: list[Out] | None = None

    def batch(self, rows: list[Row]) -> list[Out]:
        i = self.oracle.n
        expected = self.oracle.batch(rows)
        got = self.harness.batch(rows)
        assert got == expected, f"batch {i}, seed {self.seed}, {self.p}, rows {rows}"
        assert self.harness.watermarks[-1] == self.oracle.w, f"batch {i}: watermark"
        assert self.harness.late == self.oracle.stats["late"], f"batch {i}: late rows"
        return got

    def flush(self) -> list[Out]:
        expected, got = self.oracle.flush(), self.harness.flush()
        assert got == expected, f"flush, seed {self.seed}, {self.p}"
        self.flushed = got
        return got


def run_both(p: Params, batches: list[list[Row]], seed: int = 0, flush: bool = False,
             restart_after: int | None = None) -> Both:
    both = Both(p, seed)
    for i, rows in enumerate(batches):
        both.batch(rows)
        if i == restart_after:
            both.harness.restart()
    if flush:
        both.flush()
    return both


A, Z = ("a",), ("z",)


def vals(*vs: int) -> tuple[Any, ...]:
    """The expected values of a window whose rows carry ``vs`` at distinct, increasing times (no NULLs)."""
    return (len(vs), len(vs), sum(vs), min(vs), max(vs), vs[0], vs[-1], len(set(vs)), sum(vs) / len(vs))


def final(t: int, key: Key, values: tuple[Any, ...], D: int = 10 * T) -> Out:  # noqa: N803
    return ("final", t - D, t, key, values)


def correction(t: int, key: Key, values: tuple[Any, ...], D: int = 10 * T) -> Out:  # noqa: N803
    return ("correction", t - D, t, key, values)


# -- the oracle on its own (hand-computed values) --------------------------------------------------

def test_oracle_by_hand() -> None:
    o = Oracle(Params())
    assert o.batch([]) == [] and o.w is None
    # W = 20 ms + 1 µs: windows 0 and 10 ms are final, 20 ms + 1 µs is not (t < W is strict)
    assert o.batch([(A, 0, 1), (A, 10 * T, 2), (A, 20 * T + 1, 3)]) == [final(0, A, vals(1)),
                                                                        final(10 * T, A, vals(1, 2))]
    assert sorted(o.windows) == [(A, 20 * T + 1)] and o.gone == {(A, 0), (A, 10 * T)}
    assert o.batch([(A, 10 * T + 1, 4), (A, 10 * T, 5)]) == []  # x + D = W_prev kept (no window); 1 µs less late
    assert o.stats["late"] == 1 and o.stats["accepted_without_window"] == 1
    assert o.batch([(Z, 100 * T, 0)]) == [final(20 * T + 1, A, vals(4, 3))]
    assert o.flush() == [final(100 * T, Z, vals(0))] and o.flush() == []


# -- scenarios with exact values -------------------------------------------------------------------

def test_rows_sharing_an_event_time_make_one_window() -> None:
    b = run_both(Params(), [
        [(A, 5 * T, 1), (A, 5 * T, 2), (A, 5 * T, None)],
        [(A, 5 * T, 4), (A, 8 * T, 3)],  # 5 ms >= W_prev = 5 ms: joins the still open window 5 ms
        [(Z, 100 * T, 0)],
    ], flush=True)
    assert b.harness.outputs == [
        [],
        [final(5 * T, A, (4, 3, 7, 1, 4, 1, 4, 3, 7 / 3))],  # ties at one time: first = min, last = max value
        [final(8 * T, A, (5, 4, 10, 1, 4, 1, 3, 4, 2.5))],
    ]


def test_both_bounds_are_inclusive() -> None:
    rows = [(A, 0, 1), (A, 10 * T, 2), (A, 20 * T + 1, 3), (("b",), 0, 5), (("b",), 10 * T - 1, 6),
            (("b",), 20 * T - 1, 7), (Z, 100 * T, 0)]
    b = run_both(Params(), [rows], flush=True)
    B = ("b",)  # noqa: N806
    assert b.harness.outputs == [sorted([
        final(0, A, vals(1)), final(10 * T, A, vals(1, 2)),  # 0 = 10 ms - D counts in window 10 ms
        final(20 * T + 1, A, vals(3)),  # 10 ms = (20 ms + 1 µs) - D - 1 µs does not
        final(0, B, vals(5)), final(10 * T - 1, B, vals(5, 6)), final(20 * T - 1, B, vals(6, 7)),
    ], key=lambda r: (r[1], repr(r[3]), r[0]))]


@pytest.mark.parametrize("policy", ["drop", "dlq"])
def test_late_rows_are_not_merged(policy: str) -> None:
    b = run_both(Params(policy=policy), [
        [(A, 0, 1), (A, 50 * T, 2)],
        [(A, 39 * T, 7), (A, 40 * T, 8), (A, 55 * T, 3)],  # 39 + 10 < 50: late; 40 is kept but makes no window
        [(Z, 100 * T, 0)],
    ], flush=True)
    assert b.harness.outputs == [
        [final(0, A, vals(1))],
        [final(50 * T, A, vals(8, 2))],
        [final(55 * T, A, vals(2, 3))],
    ]
    assert b.harness.late == 1 and b.oracle.stats["accepted_without_window"] == 1


def test_reopen_corrections() -> None:
    p = Params(policy="reopen", allowed_ms=30)
    b = run_both(p, [
        [(A, 0, 1), (A, 20 * T, 2), (Z, 50 * T, 0)],  # W = 50: a@0, a@20 final; a@0 forgotten (0 + 30 < 50)
        [(A, 25 * T, 5), (A, 12 * T, 6), (A, 5 * T, 9)],  # 25 creates a window behind W; 12 changes a@20; 5 late
        [(A, 21 * T, 4), (Z, 81 * T, 0)],  # 21 creates a window and changes a@25; W = 81 forgets a@20..25
        [(A, 45 * T, 7), (A, 40 * T, 8), (A, 51 * T, 3)],  # 40 late; 45 kept, no window; 51 = W - allowed
        [(Z, 200 * T, 0)],
    ], flush=True)
    assert b.harness.outputs == [
        [final(0, A, vals(1)), final(20 * T, A, vals(2))],
        [correction(20 * T, A, vals(6, 2)), correction(25 * T, A, vals(2, 5))],
        [correction(21 * T, A, vals(6, 2, 4)), correction(25 * T, A, vals(2, 4, 5)), final(50 * T, Z, vals(0))],
        [correction(51 * T, A, vals(7, 3))],
        [final(81 * T, Z, vals(0))],
    ]
    assert b.harness.late == 2


def test_reopen_row_exactly_at_the_allowance() -> None:
    """Under reopen the threshold is W_prev - allowed (here 40 - 15 = 25 ms): a row with x + D = 25 ms is
    kept, 1 µs less is late; a row at exactly 25 ms creates a window (behind W_prev: a correction)."""
    p = Params(policy="reopen", allowed_ms=15)
    B = ("b",)  # noqa: N806
    b = run_both(p, [
        [(A, 25 * T, 1), (Z, 40 * T, 0)],  # W = 40: a@25 final, retained (25 + 15 is not < 40)
        [(A, 15 * T, 2), (A, 15 * T - 1, 3)],  # 15 kept, no window, changes a@25; 15 ms - 1 µs late
        [(B, 25 * T, 4), (B, 25 * T - 1, 5)],  # b@25 is created behind W; 25 ms - 1 µs makes no window
    ], flush=True)
    assert b.harness.outputs == [
        [final(25 * T, A, vals(1))],
        [correction(25 * T, A, vals(2, 1))],
        [correction(25 * T, B, vals(5, 4))],
    ]
    assert b.flushed == [final(40 * T, Z, vals(0))]
    assert b.harness.late == 1 and b.oracle.stats["accepted_without_window"] == 2


@pytest.mark.parametrize("policy, allowed_ms", [("drop", 0), ("reopen", 5)])
def test_a_row_d_before_the_threshold_is_kept_for_a_window_created_at_it(policy: str, allowed_ms: int) -> None:
    """After W, a window may still be created at W - retention, and it reaches back to W - retention - D:
    a row exactly there must still be held."""
    p = Params(policy=policy, allowed_ms=allowed_ms)
    threshold = 10 * T
    b = run_both(p, [
        [(A, 0, 1), (Z, threshold + p.retention, 0)],
        [(A, threshold, 2)],  # the window [0, threshold] holds a@0
        [(Z, 100 * T, 0)],
    ], flush=True)
    made = final if policy == "drop" else correction  # under reopen the window is behind W_prev
    assert b.harness.outputs[0] == [final(0, A, vals(1))]
    assert (made(threshold, A, vals(1, 2)) in b.harness.outputs[1] + b.harness.outputs[2])


def test_lateness_delays_the_watermark() -> None:
    b = run_both(Params(lateness_ms=5), [
        [(A, 0, 1), (A, 10 * T, 2)],  # W = 5
        [(A, 3 * T, 3), (A, 14 * T, 4)],  # 3 counts in a@10, makes no window; W = 9
        [(A, 16 * T, 5)],  # W = 11: a@10 final
        [(A, 4 * T, 6), (A, 0, 9), (Z, 100 * T, 0)],  # 4 + 10 >= 11 kept; 0 + 10 < 11 late
    ], flush=True)
    assert b.harness.outputs == [
        [final(0, A, vals(1))],
        [],
        [final(10 * T, A, vals(1, 3, 2))],
        [final(14 * T, A, vals(6, 2, 4)), final(16 * T, A, vals(2, 4, 5))],
    ]
    assert b.harness.watermarks == [5 * T, 9 * T, 11 * T, 95 * T] and b.harness.late == 1


def test_every_aggregator() -> None:
    rows = [(A, 0, 3), (A, 2 * T, None), (A, 4 * T, -2), (A, 6 * T, 3), (A, 6 * T, 7), (A, 8 * T, None),
            (A, 16 * T, None), (("n",), 1 * T, None)]
    b = run_both(Params(), [rows, [(Z, 100 * T, 0)]], flush=True)  # W = 16 ms after the first batch
    assert canon(b.harness.outputs[0] + b.harness.outputs[1]) == sorted([
        final(0, A, (1, 1, 3, 3, 3, 3, 3, 1, 3.0)),
        final(2 * T, A, (2, 1, 3, 3, 3, 3, 3, 1, 3.0)),
        final(4 * T, A, (3, 2, 1, -2, 3, 3, -2, 2, 0.5)),
        final(6 * T, A, (5, 4, 11, -2, 7, 3, 7, 3, 2.75)),
        final(8 * T, A, (6, 4, 11, -2, 7, 3, 7, 3, 2.75)),
        final(16 * T, A, (4, 2, 10, 3, 7, 3, 7, 2, 5.0)),  # first / last tie at 6 ms: 3 and 7
        final(1 * T, ("n",), (1, 0, None, None, None, None, None, 0, None)),  # only NULL values
    ], key=lambda r: (r[1], repr(r[3]), r[0]))


def test_null_keys_are_groups_of_their_own() -> None:
    N, S = (None,), ("None",)  # noqa: N806
    b = run_both(Params(), [
        [(N, 0, 1), (A, 0, 2), (S, 0, 3), (N, 5 * T, None)],
        [(A, 5 * T, 4), (N, 200 * T, None)],
    ], flush=True)
    assert b.harness.outputs == [
        canon([final(0, N, vals(1)), final(0, A, vals(2)), final(0, S, vals(3))]),
        canon([final(5 * T, N, (2, 1, 1, 1, 1, 1, 1, 1, 1.0)), final(5 * T, A, vals(2, 4))]),
    ]
    assert b.flushed == [final(200 * T, N, (1, 0, None, None, None, None, None, 0, None))]


def test_event_cap_counts_distinct_retained_event_times() -> None:
    b = Both(Params(max_events=3))
    b.batch([(A, 0, 1), (A, T, 2), (A, T, 3), (A, 2 * T, 4), (A, 2 * T, 5)])  # 3 distinct times, 5 rows
    b.batch([(("b",), 50 * T, 0)])  # W = 50: a's rows (x + D < 50) are needed by no window any more
    b.batch([(A, 51 * T, 1), (A, 52 * T, 2), (A, 53 * T, 3), (A, 53 * T, 4)])
    b.batch([(A, 53 * T, 5)])  # a time already held does not count again
    with pytest.raises(StateCapExceeded) as failed:
        b.harness.batch([(A, 54 * T, 6)])  # 51..53 are still needed (x + D >= W_prev = 53): a 4th time
    message = str(failed.value)
    assert "max_events_per_group" in message and "('a',)" in message, message


def test_event_cap_in_one_batch() -> None:
    h = Harness(Params(max_events=2))
    with pytest.raises(StateCapExceeded, match=r"\('k1',\)"):
        h.batch([(("k0",), 0, 1), (("k1",), 0, 1), (("k1",), 3 * T, 1), (("k1",), 6 * T, 1)])


def test_group_cap_counts_keys_holding_retained_rows() -> None:
    b = Both(Params(max_groups=2))
    b.batch([(A, 0, 1), (("b",), 100 * T, 2)])  # W = 100: a's row is needed no more
    b.batch([(("c",), 101 * T, 3)])  # b and c hold rows
    with pytest.raises(StateCapExceeded) as failed:
        b.harness.batch([(("d",), 102 * T, 4), (("c",), 103 * T, 5)])  # b (100 + 10 >= 101), c, d
    message = str(failed.value)
    assert "max_groups_per_window" in message and "('d',)" in message, message


# -- randomised: against the oracle per policy; split invariance without late rows -----------------

RANDOM_KEYS: list[Key] = [("a",), (None,), ("b",), ("c",)]
BASE = 1_700_000_000_000_000  # a realistic epoch time in µs


def random_rows(rng: random.Random, n: int, disorder_ms: int, step_ms: int = 3, keys: int = 4) -> list[Row]:
    """Rows in arrival order: event times advance by 0..step ms, up to ``disorder_ms`` behind, on whole
    ms mostly (so rows land exactly D apart and exactly on thresholds) and now and then 1 µs off."""
    rows, t, choices = [], BASE, RANDOM_KEYS[:keys]
    for _ in range(n):
        t += rng.randint(0, step_ms) * MS
        x = t - rng.randint(0, disorder_ms) * MS + rng.choice([0, 0, 0, 0, 0, -1, 1])
        rows.append((rng.choice(choices), x, rng.choice([None, *range(-5, 6)])))
    return rows


def random_split(rng: random.Random, rows: list[Row], batches: int) -> list[list[Row]]:
    cuts = sorted(rng.sample(range(1, len(rows)), batches - 1))
    return [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)])]


@pytest.mark.parametrize("policy", ["drop", "dlq", "reopen"])
@pytest.mark.parametrize("aliases", [tuple(ALIASES), ADDITIVE], ids=["two-stacks", "prefix-sums"])
def test_random_late_data_matches_the_oracle(policy: str, aliases: tuple[str, ...]) -> None:
    """All nine aggregations take the two-stack path; additive ones alone (counts, sums, averages)
    take prefix sums."""
    stats: Counter[str] = Counter()
    kinds: set[str] = set()
    for seed in range(20):
        rng = random.Random(1_000 * seed + len(policy))
        p = Params(duration_ms=rng.choice([4, 10, 20]), lateness_ms=rng.choice([0, 0, 3]), policy=policy,
                   allowed_ms=rng.choice([5, 15, 40]) if policy == "reopen" else 0, aliases=aliases)
        rows = random_rows(rng, 220, disorder_ms=rng.choice([10, 30, 60]), keys=rng.choice([1, 2, 4]))
        batches = random_split(rng, rows, 12)
        batches.insert(rng.randrange(len(batches)), [])  # a batch without rows
        both = run_both(p, batches, seed=seed, flush=True, restart_after=rng.randrange(len(batches)))
        stats += both.oracle.stats
        kinds |= {r[0] for out in both.harness.outputs for r in out}
    assert stats["late"] > 0 and stats["accepted_without_window"] > 0
    if policy == "reopen":
        assert kinds == {"final", "correction"}
        assert stats["created_behind"] > 0 and stats["changed_retained"] > 0
    else:
        assert kinds == {"final"}


@pytest.mark.parametrize("seed", range(6))
def test_split_invariance_without_late_rows(seed: int) -> None:
    rng = random.Random(500 + seed)
    disorder = rng.choice([0, 4])
    p = Params(duration_ms=rng.choice([4, 10]), lateness_ms=disorder, policy=rng.choice(["drop", "dlq", "reopen"]),
               allowed_ms=20)
    rows = sorted(random_rows(rng, 300, disorder_ms=0, step_ms=2, keys=rng.choice([2, 4])), key=lambda r: r[1])
    if disorder:  # up to ``lateness`` behind the newest row: never behind W under any split
        rows = [(k, x - rng.randint(0, disorder) * MS, v) for k, x, v in rows]
        newest = None
        for _, x, _ in rows:
            assert newest is None or x >= newest - disorder * MS
            newest = x if newest is None else max(newest, x)

    def finals(batches: list[list[Row]]) -> list[Out]:
        both = run_both(p, batches, seed=seed)
        out = [r for rows_ in both.harness.outputs for r in rows_] + both.flush()
        assert both.harness.late == 0 and {r[0] for r in out} <= {"final"}
        return canon(out)

    whole = finals([rows])
    assert len(whole) > 100 and len({(r[2], r[3]) for r in whole}) == len(whole)
    for n in (2, 7, 30, 120):
        assert finals(random_split(rng, rows, n)) == whole, f"{n} batches"
