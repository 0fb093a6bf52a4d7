#!/usr/bin/env python
"""How much window state one driver holds: RSS and commit time per 1,000,000 open groups.

Window state lives in the driver process (as columns: key ids and one object array of
accumulators per aggregator), so the driver's memory is the ceiling of a pipeline's open state.
This script fills the engine's real ``FixedState`` (or, ``--kind session``, ``SessionState``:
one open session per key) with ``--groups`` groups (one BIGINT key column; count and sum,
or ``--aggs`` others) the way a batch does, measures the driver's RSS growth with psutil, then
commits every group to a fresh SQLite (and, with ``--postgres URL``, PostgreSQL) state store
through the same ``batch_commit`` a batch uses, and times it, and a restart's load and restore. It extrapolates the number of
groups that fit in ``--memory-gib`` (default 24) with a third left for Spark's JVM and the rest.

    .venv/bin/python benchmarks/driver_state_ceiling.py                     # 1,000,000 groups
    .venv/bin/python benchmarks/driver_state_ceiling.py --kind session      # 1,000,000 keys, a session each
    .venv/bin/python benchmarks/driver_state_ceiling.py --groups 3000000 --postgres postgresql://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ematix_dagster.spec import Aggregation, Window  # noqa: E402
from ematix_dagster.streaming.durable import batch_commit, restore_engine  # noqa: E402
from ematix_dagster.streaming.kinds.kind_state import StoredSize  # noqa: E402
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats  # noqa: E402
from state_store.contract import make_holder  # noqa: E402

GIB = 1 << 30
AGGS = {
    "count": Aggregation("count", "n"),
    "sum": Aggregation("sum", "total", column="amount"),
    "avg": Aggregation("avg", "mean", column="amount"),
    "distinct": Aggregation("count_distinct", "items", column="item"),
}
PARTIALS = {"count": lambda i: 3, "sum": lambda i: i * 7, "avg": lambda i: (1.5 * i, 2),
            "distinct": None}


def fill(engine: Engine, groups: int, aggs: list[str], per_batch: int) -> None:
    """``groups`` new groups (one window, or one session per key), ``per_batch`` at a time, as
    batches merge them."""
    for first in range(0, groups, per_batch):
        keys = [(k,) for k in range(first, min(first + per_batch, groups))]
        partials = [[PARTIALS[a](k[0]) for k in keys] for a in aggs]
        starts = [0] * len(keys) if engine.window.kind == "tumbling" else [k * 1_000 for k, in keys]
        engine.state.merge(starts, keys, partials, starts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=1_000_000)
    ap.add_argument("--aggs", nargs="+", choices=[a for a, p in PARTIALS.items() if p], default=["count", "sum"])
    ap.add_argument("--kind", choices=["tumbling", "session"], default="tumbling")
    ap.add_argument("--memory-gib", type=float, default=24.0)
    ap.add_argument("--postgres", default=None, help="also commit to this PostgreSQL (a scratch schema)")
    args = ap.parse_args(argv)

    shape = {"duration_ms": 60_000} if args.kind == "tumbling" else \
        {"gap_ms": 30_000, "max_session_duration_ms": 3_600_000_000}
    window = Window(kind=args.kind, group_by=("key",), max_groups_per_window=args.groups,
                    aggregations=tuple(AGGS[a] for a in args.aggs), **shape)
    engine = Engine.for_window("ceiling", window, ("s",), [a == "sum" for a in args.aggs])
    engine.process(BatchInput(batch_id=0, batch_time=0, sources={"s": SourceStats()}))
    proc = psutil.Process()
    gc.collect()
    before = proc.memory_info().rss
    t0 = time.perf_counter()
    fill(engine, args.groups, args.aggs, 100_000)
    fill_s = time.perf_counter() - t0
    gc.collect()
    grown = proc.memory_info().rss - before
    per_million = grown / args.groups * 1_000_000
    print(f"{args.groups:,} groups ({', '.join(args.aggs)}): driver RSS +{grown / GIB:.2f} GiB "
          f"({per_million / GIB:.2f} GiB per 1,000,000 groups, {grown / args.groups:.0f} bytes per group); "
          f"merged in {fill_s:.1f} s")

    stores = [("sqlite", None)] + ([("postgres", args.postgres)] if args.postgres else [])
    for kind, url in stores:
        from state_store.postgres_store import PostgresStateStore
        from state_store.sqlite import SqliteStateStore

        with tempfile.TemporaryDirectory() as tmp:
            store = SqliteStateStore(Path(tmp) / "state.db") if kind == "sqlite" else \
                PostgresStateStore(url, f"ematix_ceiling_{int(time.time())}")
            store.open()
            try:
                store.acquire_lease("ceiling", make_holder("ceiling benchmark"))
                # the whole state as one base segment for each store, as the first commit after
                # loading rows writes it (the second store's would otherwise find nothing changed)
                engine.state.stored_size = StoredSize(from_rows=True)
                t0 = time.perf_counter()
                commit = batch_commit(engine, "ceiling")
                encode_s = time.perf_counter() - t0
                store.commit(commit)
                total_s = time.perf_counter() - t0
                print(f"commit of {args.groups:,} new groups to {kind}: {total_s:.1f} s ({encode_s:.1f} s encoding), "
                      f"{total_s / args.groups * 1_000_000:.1f} s per 1,000,000 groups")
                t0 = time.perf_counter()
                restored = Engine.for_window("ceiling", window, ("s",), [a == "sum" for a in args.aggs])
                restore_engine(restored, store.load("ceiling"), store.description)
                print(f"load and restore of {restored.state.state_rows:,} groups from {kind}: "
                      f"{time.perf_counter() - t0:.1f} s")
                store.release_lease("ceiling")
            finally:
                store.close()
            if kind == "postgres":
                import psycopg
                from psycopg import sql

                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(store.schema)))

    usable = args.memory_gib * GIB * 2 / 3
    print(f"on a {args.memory_gib:g} GiB machine, with a third left for the JVM and the OS: about "
          f"{usable / per_million:.0f} million open groups of this shape")
    return 0


if __name__ == "__main__":
    sys.exit(main())
