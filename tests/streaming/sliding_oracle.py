"""The sliding-window oracle (KIP-450, docs/contract/windows.md), Spark's partials and the harness stepping the real
Engine beside the oracle, for tests/streaming/kinds/sliding/test_sliding_state.py and the e2e tests.

The oracle imports nothing from the engine. It keeps every accepted row with the number of
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
Spark's partial aggregates come out (the formats of ``tests/streaming/session_oracle.py``), in a shuffled
order, merged by the real ``Engine`` with the real aggregator classes. After each batch the state's
``take_column_changes`` is applied to a simulated store; the randomised runs restart once from it (a new
Engine restored from the store, the watermark and the source clock). No Spark is started.
"""

from __future__ import annotations

import bisect
import copy
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from ematix_dagster.spec import Aggregation, Window
from ematix_dagster.streaming.kinds.kind_state import StoredGroup
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats
from tests.streaming.store_changes import take_changes

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
    (what ``take_column_changes`` handed over) to restart from."""

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
        changes = take_changes(self.engine.state)
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
