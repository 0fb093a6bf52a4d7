"""The window-kind contract, for every registered kind, and a kind registered from the tests.

Every kind in ``streaming.kinds.KINDS_BY_NAME`` must:
- build from a spec of its kind, validate it (its ``spec.window.WindowKindSpec``), and name only
  Window fields as its own keys;
- have a Spark plan registered under the same name, saying which partial columns its state takes;
- give a state that, driven through the real ``Engine`` batch by batch, emits each (window, group)
  ``final`` at most once and only once its window is closed at the watermark, in (start, key)
  order, with retractions first;
- commit changes that, applied to a simulated store and restored into a new engine, continue
  exactly: a restart after any batch emits what the uninterrupted engine emits.

The second half registers a kind the engine has never seen, tumbling windows shifted by an
offset, from here (``OffsetSpec``, ``OffsetWindows`` and its Spark plan), and runs it end to end through the
runner, the SQLite state store (a second run resumes from it) and a parquet target; the ground
truth is pandas over the same events, with no engine code.
"""

from __future__ import annotations

import ast
import copy
import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import pytest
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ematix_dagster.columns import CLOSED_BEFORE, EMITTED_BEFORE
from ematix_dagster.spark.plans.windows import PLANS
from ematix_dagster.spark.plans.windows.fixed_plan import FixedPlan
from ematix_dagster.spark.plans.windows.kind_plan import Aggregates, WindowedFrames
from ematix_dagster.spec import Aggregation, Window
from ematix_dagster.spec.window import WINDOW_KINDS, TumblingSpec
from ematix_dagster.streaming.kinds import KINDS_BY_NAME, FixedKind, WindowBounds, WindowKind
from ematix_dagster.streaming.kinds.kind_state import StoredGroup
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats
from tests.e2e.windows_helpers import at, parquet_target, pipeline, read_parquet_target, run, to_us
from tests.streaming.store_changes import StoreChanges, take_changes

MS = 1_000
Key = tuple[Any, ...]

#: per registered kind: a spec's own keys (ms), and how a row at ``t`` (µs) becomes the starts of
#: its partials (the Spark plan's job; ``None``: one partial at ``t`` with ``lasts``)
SAMPLES: dict[str, tuple[dict[str, Any], Callable[[WindowKind, int, int | None], list[int]] | None]] = {
    "tumbling": ({"duration_ms": 10}, lambda kind, t, closed: [w.start for w in kind.row_windows(t, closed)]),
    "hopping": ({"duration_ms": 10, "hop_ms": 4}, lambda kind, t, closed: [w.start for w in kind.row_windows(t, closed)]),
    "session": ({"gap_ms": 3, "max_session_duration_ms": 40}, None),
    "sliding": ({"duration_ms": 10, "max_events_per_group": 1_000},
                lambda kind, t, closed: [t] if kind.row_windows(t, closed) else []),
}


def sample_window(name: str, **changes: Any) -> Window:
    own, _ = SAMPLES[name]
    return replace(Window(kind=name, max_groups_per_window=100, group_by=("k",),
                          aggregations=(Aggregation("count", "n"), Aggregation("sum", "total", "v")), **own),
                   **changes)


class Store:
    """A store that applies ``StoreChanges`` as the real ones do: deletes, then upserts."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, Key], StoredGroup] = {}

    def apply(self, changes: StoreChanges, kind: WindowKind) -> None:
        for start, key in changes.deletes:
            del self.rows[(start, key)]
        bound = changes.deleted_before
        self.rows = {sk: g for sk, g in self.rows.items() if bound is None or sk[0] >= bound}
        for group in changes.upserts:
            assert group.end is None or kind.valid_end(group.start, group.end), group
            self.rows[(group.start, group.key)] = group._replace(accs=copy.deepcopy(group.accs))


class Driven:
    """The real Engine fed batch by batch, its commits kept in a simulated store."""

    def __init__(self, name: str, window: Window) -> None:
        self.name, self.window = name, window
        self.engine = Engine.for_window("contract", window, sources=("s",), integral=(None, True))
        self.store = Store()
        self.batch_id = 0

    def batch(self, rows: list[tuple[Key, int, int]]) -> list[tuple]:
        eng, (_, starts_of) = self.engine, SAMPLES[self.name]
        kind, closed = eng.state.kind, eng.closed_before()
        starts, keys, counts, sums, lasts = [], [], [], [], []
        for key, t, v in rows:
            for start in (([t] if kind.row_windows(t, closed) else []) if starts_of is None else starts_of(kind, t, closed)):
                starts.append(start)
                keys.append(key)
                counts.append(1)
                sums.append(v)
                lasts.append(t)
        accepted_max = max((t for _, t, _ in rows), default=None)
        result = eng.process(BatchInput(
            batch_id=self.batch_id, batch_time=self.batch_id, sources={"s": SourceStats(len(rows), accepted_max)},
            starts=starts, keys=keys, partials=[counts, sums], lasts=lasts if starts_of is None else ()))
        self.batch_id += 1
        self.store.apply(take_changes(eng.state), kind)
        return [(r.kind, r.start, r.end, r.key, r.values) for r in result.rows], result

    def restarted(self) -> "Driven":
        """A new engine continuing from the store (as ``streaming.durable.restore_engine`` does)."""
        other = Driven(self.name, self.window)
        old = self.engine
        clock = old.watermarks.clocks["s"]
        groups = [g._replace(end=g.end if other.engine.state.kind.ends_stored else None,
                             accs=copy.deepcopy(g.accs)) for g in self.store.rows.values()]
        other.engine.restore(old.last_batch_id, old.watermarks.global_wm, {"s": (clock.max_event_ts, clock.last_arrival)},
                             dict(old.counters), groups)
        other.store.rows = dict(self.store.rows)
        other.batch_id = self.batch_id
        return other


def random_batches(seed: int) -> list[list[tuple[Key, int, int]]]:
    rng = random.Random(seed)
    batches, t = [], 0
    for _ in range(8):
        rows = []
        for _ in range(rng.randint(0, 6)):
            t += rng.randint(0, 4) * MS
            rows.append(((rng.choice("ab"),), t - rng.randint(0, 6) * MS, rng.randint(-3, 9)))
        batches.append(rows)
    return batches


@pytest.mark.parametrize("name", sorted(KINDS_BY_NAME))
def test_every_registered_kind_has_a_sample_and_a_spark_plan(name: str) -> None:
    assert name in SAMPLES, f"window kind {name!r} is registered: add its sample spec to SAMPLES here"
    window = sample_window(name)
    window.validate()
    assert window.shape.startswith(f"{name} windows"), window.shape
    kind = KINDS_BY_NAME[name].for_window(window)
    spec = WINDOW_KINDS[name]
    assert spec in type(kind).specs and spec.name == name
    assert set(spec.own_keys) <= set(Window.__dataclass_fields__), spec.own_keys
    assert spec.id_column == kind.id_column
    assert name in PLANS, f"window kind {name!r} has no Spark plan in ematix_dagster.spark.plans.windows.PLANS"
    plan = PLANS[name]
    assert isinstance(plan.start_column, str) and isinstance(plan.sort_by_start, bool)
    assert (plan.last_column is None) == (SAMPLES[name][1] is not None)  # a state that takes lasts gets them
    assert isinstance(spec.fingerprint(window), dict)
    state = kind.make_state("p", [], [], 10)
    for member in ("merge", "report", "accumulators", "values", "set_marks", "mark_emitted", "evict", "take_column_changes",
                   "restore", "group_count", "window_count", "state_rows", "flush_watermark", "open_windows",
                   "describe"):
        assert hasattr(state, member), (name, member)
    assert state.kind is kind and take_changes(state) == StoreChanges()
    if kind.id_column is None:
        with pytest.raises(TypeError):
            kind.row_ids("p", [b"k"], [0])
    else:
        assert len(kind.row_ids("p", [b"k", b"k"], [0, 1])) == 2


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("late_data", ["drop", "reopen"])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_kind_emits_each_window_once_in_order_and_restarts_exactly(name: str, late_data: str, seed: int) -> None:
    window = sample_window(name, late_data=late_data, lateness_ms=2,
                           allowed_lateness_ms=5 if late_data == "reopen" else None)
    batches = random_batches(seed)
    straight = Driven(name, window)
    outputs = [straight.batch(rows)[0] for rows in batches]
    flushed = straight.engine.flush(straight.batch_id, straight.batch_id)
    finals: set[tuple[int, Key]] = set()
    for out in outputs:
        kinds = [row[0] for row in out]
        retracts = kinds.count("retract")
        assert "retract" not in kinds[retracts:], out  # retractions first
        rows = out[retracts:]
        assert [(r[1], r[3]) for r in rows] == sorted((r[1], r[3]) for r in rows), out  # by (start, key)
        for kind_of_row, start, _end, key, _values in rows:
            if kind_of_row == "final":
                assert (start, key) not in finals, f"second final of {start} {key}"
                finals.add((start, key))
    for row in flushed.rows:
        assert row.kind != "final" or (row.start, row.key) not in finals
    total = sum(len(rows) for rows in batches)
    assert straight.engine.counters["late_rows_dropped"] == 0 or total  # counted by the plan, not here
    for cut in range(len(batches) - 1):
        resumed = Driven(name, window)
        for rows in batches[:cut + 1]:
            resumed.batch(rows)
        resumed = resumed.restarted()
        for i, rows in enumerate(batches[cut + 1:], start=cut + 1):
            assert resumed.batch(rows)[0] == outputs[i], (name, seed, cut, i)
        assert resumed.engine.flush(resumed.batch_id, resumed.batch_id).rows == flushed.rows


def test_a_window_is_final_only_once_closed() -> None:
    for name in sorted(SAMPLES):
        driven = Driven(name, sample_window(name))
        for rows in random_batches(7):
            out, result = driven.batch(rows)
            kind = driven.engine.state.kind
            for kind_of_row, start, end, _key, _values in out:
                if kind_of_row == "final":
                    assert kind.is_final(WindowBounds(start, end), result.watermark), (name, start, end)


ENGINE_CORE = ("streaming/micro_batch.py", "streaming/durable.py", "spark/batch/batch_step.py", "spark/batch/convert.py",
               "spark/plans/window_plan.py", "spec/model.py", "spec/emit.py", "fingerprint.py")


@pytest.mark.parametrize("module", ENGINE_CORE)
def test_the_engine_core_never_asks_which_kind_it_runs(module: str) -> None:
    """No ``isinstance`` on a window kind or state class, and no comparison with a kind's name: a
    kind's differences are answers of its ``WindowKind``, its state and its Spark plan."""
    path = Path(__file__).resolve().parents[2] / "ematix_dagster" / module
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = set(KINDS_BY_NAME) | {"tumbling_offset"}
    names = {"WindowKind", "KeyedByStart", "FixedWindows", "SessionWindows", "SlidingWindows", "StatefulKind",
             "FixedKind", "SessionKind", "SlidingKind", "KindState", "StateBase", "FixedState", "SessionState",
             "SlidingState", "WindowState", "WindowKindSpec", "TumblingSpec", "HoppingSpec", "SessionSpec",
             "SlidingSpec"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            checked = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            checked |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if checked & names:
                found.append(f"line {node.lineno}: isinstance on {sorted(checked & names)}")
        if isinstance(node, ast.Compare):
            consts = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            if consts & kinds:
                found.append(f"line {node.lineno}: compares with kind name {sorted(consts & kinds)}")
    assert not found, f"{module} asks which window kind it runs:\n" + "\n".join(found)


# -- a kind registered from the tests: tumbling windows shifted by an offset ------------------------

OFFSET_MS = 15_000


class OffsetSpec(TumblingSpec):
    """What the spec knows of the offset windows: a tumbling window's keys and rules, by its own name."""

    name = "tumbling_offset"
    late_on_driver = False  # the driver-late plan computes unshifted windows
    backfills = False


class OffsetWindows(FixedKind):
    """Tumbling windows ``[offset + k * D, offset + (k + 1) * D)``: a fixed window whose starts are
    not multiples of its duration. Its state is the fixed windows' (any start works there)."""

    specs = (OffsetSpec,)

    offset = OFFSET_MS * MS

    @classmethod
    def for_window(cls, window: Window) -> OffsetWindows:
        assert window.duration_ms is not None
        return cls(window.duration_ms * MS, window.duration_ms * MS)

    def row_windows(self, t: int, closed_before: int | None) -> list[WindowBounds]:
        shifted = super().row_windows(t - self.offset, None if closed_before is None else closed_before - self.offset)
        return [WindowBounds(w.start + self.offset, w.end + self.offset) for w in shifted]

    def valid_end(self, start: int, end: int) -> bool:
        return (start - self.offset) % self.duration == 0 and end == start + self.duration


class OffsetPlan:
    """The fixed plan over event times shifted back by the offset, its window starts shifted forward."""

    start_column = "_ws"
    last_column: str | None = None
    sort_by_start = True

    def __init__(self, window: Window, aggregates: Callable[[Column], Aggregates], has_reason: bool) -> None:
        self.fixed = FixedPlan(replace(window, kind="tumbling"), aggregates, has_reason)
        self.shift = F.expr(f"INTERVAL {OFFSET_MS} MILLISECONDS")

    def frames(self, out: DataFrame, batch_id: int) -> WindowedFrames:
        off = OFFSET_MS * MS
        shifted = (out.withColumn("_event_ts", F.col("_event_ts") - self.shift)
                   .withColumn(CLOSED_BEFORE, F.col(CLOSED_BEFORE) - off)
                   .withColumn(EMITTED_BEFORE, F.col(EMITTED_BEFORE) - off))
        frames = self.fixed.frames(shifted, batch_id)
        return WindowedFrames(frames.partials.withColumn("_ws", F.col("_ws") + off),
                              lambda classes: frames.class_rows(classes)
                              .withColumn("_event_ts", F.col("_event_ts") + self.shift),
                              frames.classified.withColumn("_event_ts", F.col("_event_ts") + self.shift))


@pytest.fixture
def offset_kind() -> Iterator[str]:
    name = "tumbling_offset"
    WINDOW_KINDS[name], KINDS_BY_NAME[name], PLANS[name] = OffsetSpec, OffsetWindows, OffsetPlan  # type: ignore[assignment]
    SAMPLES[name] = ({"duration_ms": 10}, lambda kind, t, closed: [w.start for w in kind.row_windows(t, closed)])
    try:
        yield name
    finally:
        del WINDOW_KINDS[name], KINDS_BY_NAME[name], PLANS[name], SAMPLES[name]


def test_offset_kind_obeys_the_contract(offset_kind: str) -> None:
    test_every_registered_kind_has_a_sample_and_a_spark_plan(offset_kind)
    for seed in range(3):
        test_kind_emits_each_window_once_in_order_and_restarts_exactly(offset_kind, "reopen", seed)


def test_a_kind_registered_from_the_tests_runs_end_to_end(spark, batch_files, tmp_path, offset_kind) -> None:
    """Two runs over two files (the first keeps its open windows in SQLite, the second resumes and
    flushes): every window, its bounds shifted by the offset, equals pandas over all events."""
    rng = random.Random(3)
    first = [{"user_id": rng.choice("xyz"), "qty": rng.randint(1, 9), "ts": at(rng.uniform(0, 100))} for _ in range(40)]
    second = [{"user_id": rng.choice("xyz"), "qty": rng.randint(1, 9), "ts": at(rng.uniform(100, 200))} for _ in range(40)]
    src = batch_files("offset")
    window = f'kind = "{offset_kind}"\nduration_ms = 60_000\ngroup_by = ["user_id"]\nmax_groups_per_window = 100'
    aggs = [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "qty", "as": "qty_sum"}]
    out = tmp_path / "out"

    def toml(end_of_input: str) -> str:
        return pipeline("offset-kind", src.directory, "user_id STRING, qty BIGINT, ts TIMESTAMP", tmp_path / "cp",
                        window, aggs, parquet_target(out), end_of_input=end_of_input)

    src.write(first)
    run(toml("keep"), spark)
    src.write(second)
    run(toml("flush"), spark)

    events = pd.DataFrame(first + second)
    offset_us, duration_us = OFFSET_MS * MS, 60_000 * MS
    events["t"] = events["ts"].map(to_us)
    events["start"] = (events["t"] - offset_us) // duration_us * duration_us + offset_us
    truth = {(int(start), user): {"n": len(g), "qty_sum": int(g["qty"].sum())}
             for (start, user), g in events.groupby(["start", "user_id"])}
    actual = read_parquet_target(out, "window_start", "window_end", ["user_id"])
    assert set(actual) == set(truth)
    for key, row in actual.items():
        assert row["window_end"] == key[0] + duration_us
        assert (row["n"], row["qty_sum"]) == (truth[key]["n"], truth[key]["qty_sum"]), key
    assert any(start % duration_us != 0 for start, _ in truth)  # the offset shows in the bounds
