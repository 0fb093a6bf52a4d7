"""State store throughput: commit of dirty groups and load of a large state, PostgreSQL and SQLite.

    .venv/bin/python benchmarks/state_store_bench.py [--groups 100000] [--load-groups 1000000]

PostgreSQL: ``EMATIX_BENCH_STATE_URL`` if set, else the local test server (tests/pg.py) in a fresh
schema that is dropped afterwards. Goals (SPEC/issue): >= 100,000 groups/s committed to
PostgreSQL, 1,000,000 groups loaded in <= 10 s. Each group is a realistic accumulator list
(count, integer sum, first (ts, str), avg (sum, n), exact set) under a 2-column key.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from state_store import codec, loaded_groups  # noqa: E402
from state_store.base import BatchCommit, PipelineRecord, SourceProgress, StateStore  # noqa: E402
from state_store.postgres import PostgresStateStore  # noqa: E402
from state_store.sqlite import SqliteStateStore  # noqa: E402

WINDOW_US = 60_000_000


def make_groups(n: int, start_window: int = 0, version: int = 0) -> list[tuple[int, int, bytes, bytes]]:
    rows = []
    for i in range(n):
        window = start_window + (i % 10) * WINDOW_US
        key = codec.encode_key((i, f"user-{i % 977}"))
        accs = [i % 13 + version, i * 7, (1_700_000_000_000_000 + i, f"page-{i % 50}"), (i * 0.5, 3),
                {f"p{i % 5}", f"p{i % 7}"}]
        rows.append((window, window + WINDOW_US, key, codec.encode_state(accs)))
    return rows


def record(pipeline: str, batch: int) -> PipelineRecord:
    return PipelineRecord(pipeline=pipeline, state_version=codec.STATE_VERSION, query_id="bench", last_batch_id=batch,
                          fingerprint="bench", watermark=batch, sources={"s": SourceProgress(batch, batch)},
                          counters={"rows": batch}, offsets={"s": '{"logOffset": %d}' % batch})


def bench(store: StateStore, groups: int, load_groups: int) -> dict[str, float]:
    out: dict[str, float] = {}
    store.open()
    store.acquire_lease("bench-commit", "bench")
    rows = make_groups(groups)
    t = time.perf_counter()
    store.commit(BatchCommit(record("bench-commit", 0), upserts=rows))
    out["commit_insert_s"] = time.perf_counter() - t
    rows = make_groups(groups, version=1)  # same keys, new values: the steady state of a running window
    t = time.perf_counter()
    store.commit(BatchCommit(record("bench-commit", 1), upserts=rows))
    out["commit_update_s"] = time.perf_counter() - t
    store.release_lease("bench-commit")

    store.acquire_lease("bench-load", "bench")
    chunk = 200_000
    for batch, first in enumerate(range(0, load_groups, chunk)):
        part = make_groups(min(chunk, load_groups - first), start_window=(first // chunk) * 100 * WINDOW_US)
        store.commit(BatchCommit(record("bench-load", batch), upserts=part))
    t = time.perf_counter()
    state = store.load("bench-load")
    out["load_s"] = time.perf_counter() - t
    assert len(state.groups) == load_groups, len(state.groups)
    t = time.perf_counter()
    windows = loaded_groups.decode_groups("bench-load", state.groups)
    out["decode_s"] = time.perf_counter() - t
    assert sum(len(g) for g in windows.values()) == load_groups
    store.reset("bench-load")
    store.release_lease("bench-load")
    store.reset("bench-commit")
    store.close()
    return out


def report(name: str, groups: int, load_groups: int, r: dict[str, float]) -> None:
    print(f"{name}:")
    print(f"  commit {groups:,} new groups      {r['commit_insert_s']:7.2f} s  {groups / r['commit_insert_s']:>10,.0f} groups/s")
    print(f"  commit {groups:,} updated groups  {r['commit_update_s']:7.2f} s  {groups / r['commit_update_s']:>10,.0f} groups/s")
    print(f"  load {load_groups:,} groups           {r['load_s']:7.2f} s  {load_groups / r['load_s']:>10,.0f} groups/s")
    print(f"  + decode them (loaded_groups.decode_groups) {r['decode_s']:5.2f} s  -> restart total {r['load_s'] + r['decode_s']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--load-groups", type=int, default=1_000_000)
    parser.add_argument("--only", choices=["postgres", "sqlite"])
    args = parser.parse_args()
    sample = make_groups(1)[0]
    print(f"group: key {len(sample[1])} bytes, state blob {len(sample[2])} bytes (state version {codec.STATE_VERSION})")

    if args.only in (None, "postgres"):
        url = os.environ.get("EMATIX_BENCH_STATE_URL")
        schema, cleanup = "ematix_bench", None
        if not url:
            from tests.pg import drop_schema, ensure_postgres, fresh_schema

            url = ensure_postgres()
            schema = fresh_schema(url, "bench")
            cleanup = lambda: drop_schema(url, schema)  # noqa: E731
        try:
            report(f"PostgreSQL ({schema})", args.groups, args.load_groups,
                   bench(PostgresStateStore(url, schema), args.groups, args.load_groups))
        finally:
            if cleanup:
                cleanup()
    if args.only in (None, "sqlite"):
        with tempfile.TemporaryDirectory() as tmp:
            report("SQLite (WAL, synchronous=FULL)", args.groups, args.load_groups,
                   bench(SqliteStateStore(Path(tmp) / "state.db"), args.groups, args.load_groups))


if __name__ == "__main__":
    main()
