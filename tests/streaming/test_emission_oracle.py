"""The driver (``Engine``: state, watermark, emission, triggers) against the trigger oracle
(tests/e2e/trigger_oracle.py), on random inputs, without Spark.

Each batch is fed as Spark feeds it: the late rule applied with ``Engine.closed_before()``, then one
partial (count, sum, and the triggers' hidden count(*)) per (window start, key) of the accepted assignments, or per batch-local session
of a key and cap bucket, with the source's newest event time. Every batch's rows (kinds, bounds,
values, order) and the end-of-input flush's must equal the oracle's, for every trigger, window kind,
late policy and ``retractions``.
"""

from __future__ import annotations

import random
import uuid
from typing import Any, Sequence

import numpy as np
import pytest

from ematix_dagster.spec import Aggregation, Window
from ematix_dagster.streaming.durable import batch_commit, restore_engine
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats
from state_store.int_key_column import IntKeyColumn
from state_store.memory import InMemoryStateStore
from tests.e2e.trigger_oracle import MS, Config, TriggerOracle, sessions_of, window_starts

S = 1_000_000
AGGREGATIONS = (Aggregation("count", "n"), Aggregation("sum", "total", "v"))


def engine_for(cfg: Config) -> Engine:
    window = Window(kind=cfg.kind, duration_ms=cfg.duration_ms, hop_ms=cfg.hop_ms, gap_ms=cfg.gap_ms,
                    max_session_duration_ms=cfg.max_session_duration_ms, group_by=cfg.group_by,
                    lateness_ms=cfg.lateness_ms, late_data=cfg.late_data,
                    allowed_lateness_ms=cfg.allowed_lateness_ms if cfg.late_data == "reopen" else None,
                    max_groups_per_window=10_000, aggregations=AGGREGATIONS, emit_trigger=cfg.emit_trigger)
    window.validate()
    return Engine.for_window("fuzz", window, ("a",), integral=(False, True), retractions=cfg.retractions)


def spark_input(engine: Engine, cfg: Config, batch_id: int, time_us: int, rows: list[dict[str, Any]]) -> BatchInput:
    closed = engine.closed_before()
    parts: dict[tuple[int, tuple], list[Any]] = {}  # (start, key) -> [count, sum, last]

    def add(start: int, key: tuple, vs: list[Any], last: int = 0) -> None:
        part = parts.setdefault((start, key), [0, None, last])
        values = [v for v in vs if v is not None]
        part[0] += len(vs)
        part[1] = (part[1] or 0) + sum(values) if values else part[1]

    if cfg.kind == "session":
        accepted = [r for r in rows if closed is None or r["_event_ts"] >= closed]
        by_id = dict(enumerate(accepted))
        held = [(i, (r["k"],), r["_event_ts"]) for i, r in by_id.items()]
        for key, run in sessions_of(held, cfg.gap_ms * MS, cfg.max_session_duration_ms * MS):
            add(run[0][0], key, [by_id[i]["v"] for _, i in run], run[-1][0])
    else:
        duration, hop = cfg.duration_ms * MS, (cfg.hop_ms or cfg.duration_ms) * MS
        for r in rows:
            for start in window_starts(r["_event_ts"], duration, hop):
                if closed is None or start + duration > closed:
                    add(start, (r["k"],), [r["v"]])
    ordered = sorted(parts.items(), key=lambda p: p[0][0])
    columns = [[p[0] for _, p in ordered], [p[1] for _, p in ordered]]
    if not isinstance(cfg.emit_trigger, str):  # interval, count: the hidden count(*) partial
        columns.append(columns[0])
    keys: Sequence[tuple] = [k for (_, k), _ in ordered]
    if keys and {type(k[0]) for k in keys} == {int}:  # as ``spark.batch.convert.partial_lists`` hands them over
        keys = IntKeyColumn(np.array([k[0] for k in keys]))
    starts: Sequence[int] = [s for (s, _), _ in ordered]
    partials: list[Any] = columns
    if engine.state.typed_partials:  # fixed windows: the starts and the counts as NumPy arrays, as Spark's are
        starts = np.array(starts, np.int64)
        partials = [np.array(column, np.int64) if agg.array_type is not None and None not in column else column
                    for agg, column in zip(engine.state.aggregators, columns)]
    return BatchInput(
        batch_id=batch_id, batch_time=time_us,
        sources={"a": SourceStats(rows=len(rows), max_event_ts=max((r["_event_ts"] for r in rows), default=None))},
        starts=starts, keys=keys, partials=partials,
        lasts=[p[2] for _, p in ordered] if cfg.kind == "session" else [])


def engine_rows(result) -> list[tuple]:
    return [(r.kind, r.start, r.end, r.key[0], *r.values) for r in result.rows]


def oracle_rows(rows: list[dict[str, Any]]) -> list[tuple]:
    return [(r["_emit_kind"], r["window_start"], r["window_end"], r["k"], r["n"], r["total"]) for r in rows]


CONFIGS = [Config(kind=kind.split("-")[0], duration_ms=None if kind == "session" else 20_000,
                  hop_ms={"hopping": 10_000, "hopping-15": 15_000}.get(kind),
                  gap_ms=8_000 if kind == "session" else None,  # hopping-15: D is not a multiple of the hop
                  max_session_duration_ms=60_000 if kind == "session" else None,
                  lateness_ms=lateness, late_data=policy, allowed_lateness_ms=30_000 if policy == "reopen" else 0,
                  emit_trigger=trigger, retractions=retractions, end_of_input="flush")
           for kind in ("tumbling", "hopping", "hopping-15", "session") for policy in ("drop", "reopen") for lateness in (0, 5_000)
           for trigger in ("watermark", "every_batch", {"interval_ms": 3_000}, {"count": 2}, {"count": 3})
           for retractions in (False, True)]


#: the group keys rows take: strings and NULL (a key index), or ints of int64's both ends, a NULL rarely
#: (integer ids: keys crossing merge, emission and commit as one column, until a NULL comes)
KEYS = {"strings": ["a", "b", None], "ints": [-2**63, 7, 2**63 - 1] * 10 + [None]}


def random_batches(rng: random.Random, keys: str = "strings") -> list[tuple[int, list[dict[str, Any]]]]:
    t, clock, batches = 0.0, 1_000.0, []
    for _ in range(rng.randint(3, 9)):
        t += rng.choice([0, 1, 2, 4, 7])
        clock += rng.choice([0.5, 1, 2, 3, 4])
        rows = [{"_event_ts": int(max(0.0, t - rng.choice([0, 0, 1, 3, 6, 12, 25])) * S),
                 "k": rng.choice(KEYS[keys]), "v": rng.choice([1, 2, 5, None])}
                for _ in range(rng.randint(1, 5))]
        batches.append((int(clock * S), rows))
    return batches


@pytest.mark.parametrize("keys,seed", [*(("strings", seed) for seed in range(12)), *(("ints", seed) for seed in range(4))])
def test_the_engine_writes_what_the_oracle_writes(keys: str, seed: int) -> None:
    """Every batch is committed to an in-memory store; after some, the engine is restarted from it
    (written rows, emitted flags, hidden counts and the interval timer must survive)."""
    rng = random.Random(seed)
    for n, cfg in enumerate(CONFIGS):
        batches = random_batches(rng, keys)
        engine, oracle = engine_for(cfg), TriggerOracle(cfg)
        name = f"fuzz-{uuid.uuid4().hex[:8]}"
        store = InMemoryStateStore(name)
        store.open()
        try:
            for batch_id, (time_us, rows) in enumerate(batches):
                got = engine_rows(engine.process(spark_input(engine, cfg, batch_id, time_us, rows)))
                want = oracle_rows(oracle.batch(time_us, rows))
                assert got == want, f"config {n} {cfg}, batch {batch_id} of {batches}"
                store.commit(batch_commit(engine, name))
                if rng.random() < 0.3:
                    engine = engine_for(cfg)
                    restore_engine(engine, store.load(name))
        finally:
            store.close()
            InMemoryStateStore.forget(name)
        got = engine_rows(engine.flush(len(batches) - 1, batches[-1][0]))
        assert got == oracle_rows(oracle.flush()), f"config {n} {cfg}, the flush after {batches}"
