"""State store throughput of what a commit writes: segments (schema step 8), PostgreSQL and SQLite.

    .venv/bin/python benchmarks/state_store_bench.py [--groups 100000] [--load-groups 1000000]

A commit of ``--groups`` changed groups is one delta segment (``state_store.segments``, encoded as
the engine encodes one), first of new groups, then of the same keys with new values; encoding and
committing are timed apart. A restart loads a state of ``--load-groups`` groups stored as the
engine's compaction leaves it, one base segment, and replays it decoded as a restore does
(``state_store.segment_replay.replay``). State rows are not measured: commits no longer write them.

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

from state_store import codec  # noqa: E402
from state_store.contract import BatchCommit, PipelineRecord, SourceProgress, StateStore  # noqa: E402
from state_store.postgres_store import PostgresStateStore  # noqa: E402
from state_store.segment_replay import Live, replay  # noqa: E402
from state_store.segments import Segment, encode_segment  # noqa: E402
from state_store.sqlite import SqliteStateStore  # noqa: E402

WINDOW_US = 60_000_000


def make_segment(n: int, start_window: int = 0, version: int = 0, base: bool = False) -> Segment:
    """``n`` groups over ten windows as one segment's columns, one column per accumulator."""
    starts = [start_window + (i % 10) * WINDOW_US for i in range(n)]
    accs = [[i % 13 + version for i in range(n)], [i * 7 for i in range(n)],
            [(1_700_000_000_000_000 + i, f"page-{i % 50}") for i in range(n)], [(i * 0.5, 3) for i in range(n)],
            [{f"p{i % 5}", f"p{i % 7}"} for i in range(n)]]
    return Segment(base=base, starts=starts, ends=[start + WINDOW_US for start in starts],
                   keys=[codec.encode_key((i, f"user-{i % 977}")) for i in range(n)], emitted=None, written=None,
                   accs=accs)


def record(pipeline: str, batch: int) -> PipelineRecord:
    return PipelineRecord(pipeline=pipeline, state_version=codec.STATE_VERSION, query_id="bench", last_batch_id=batch,
                          fingerprint="bench", watermark=batch, sources={"s": SourceProgress(batch, batch)},
                          counters={"rows": batch}, offsets={"s": '{"logOffset": %d}' % batch})


def bench(store: StateStore, groups: int, load_groups: int) -> dict[str, float]:
    out: dict[str, float] = {}
    store.open()
    store.acquire_lease("bench-commit", "bench")
    for batch, kind in enumerate(("new", "updated")):  # updated: same keys, new values, a running window's delta
        segment = make_segment(groups, version=batch)
        t = time.perf_counter()
        blob = encode_segment(segment)
        out[f"encode_{kind}_s"] = time.perf_counter() - t
        t = time.perf_counter()
        store.commit(BatchCommit(record("bench-commit", batch), segments=[blob]))
        out[f"commit_{kind}_s"] = time.perf_counter() - t
    store.release_lease("bench-commit")

    store.acquire_lease("bench-load", "bench")
    base = encode_segment(make_segment(load_groups, base=True))
    out["base_bytes"] = len(base)
    store.commit(BatchCommit(record("bench-load", 0), segments=[base], rebase=True))
    t = time.perf_counter()
    state = store.load("bench-load")
    out["load_s"] = time.perf_counter() - t
    assert state.segments == [base]
    t = time.perf_counter()
    live: Live = {}
    replay(live, state.segments, "bench-load")
    out["replay_s"] = time.perf_counter() - t
    assert len(live) == load_groups, len(live)
    store.reset("bench-load")
    store.release_lease("bench-load")
    store.reset("bench-commit")
    store.close()
    return out


def report(name: str, groups: int, load_groups: int, r: dict[str, float]) -> None:
    print(f"{name}:")
    for kind in ("new", "updated"):
        encode, commit = r[f"encode_{kind}_s"], r[f"commit_{kind}_s"]
        print(f"  commit {groups:,} {kind} groups: encode {encode:.2f} s + commit {commit:.2f} s  "
              f"{groups / (encode + commit):>10,.0f} groups/s")
    print(f"  load {load_groups:,} groups (one base segment, {r['base_bytes'] / 1e6:.1f} MB)  {r['load_s']:.2f} s  "
          f"{load_groups / r['load_s']:>10,.0f} groups/s")
    print(f"  + replay them decoded (segment_replay.replay)  {r['replay_s']:.2f} s  -> restart total "
          f"{r['load_s'] + r['replay_s']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--load-groups", type=int, default=1_000_000)
    parser.add_argument("--only", choices=["postgres", "sqlite"])
    args = parser.parse_args()
    sample = make_segment(1)
    one = encode_segment(sample)  # also pays PyArrow's first-call setup before anything is timed
    print(f"group: key {len(sample.keys[0])} bytes, {len(sample.accs)} accumulators; a one-group segment "
          f"{len(one)} bytes")

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
