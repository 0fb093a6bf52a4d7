"""Helpers of the emission-trigger e2e tests (tests/e2e/test_emit_triggers.py, test_emit_trigger_crashes.py):
the pipeline TOML from the oracle's :class:`Config`, the input batches, what the parquet target holds
(read as docs/contract/when-results-leave.md tells readers to) and its comparison with ``tests/e2e/trigger_oracle.py``.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq

from tests.e2e.lateness_helpers import Feed, at, row, us
from tests.e2e.trigger_oracle import Config, Outcome, Row, order_key, row_key, spec_order
from tests.e2e.trigger_oracle import run as run_oracle
from tests.pipeline_toml import parquet_target, sqlite_store, windowed_pipeline_toml

SEQ, KIND = "_emit_seq", "_emit_kind"
COLUMNS = ("window_start", "window_end", "k", "n", "total", KIND)  # what the oracle gives (no session_id)
AGGREGATIONS = [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"}]

# (k, seconds after lateness_helpers.T0, v) per micro-batch; T0 is a multiple of every window and of
# the session cap. With lateness 5 s: W = 35, 50, 70, 80, 157, 157 s. Fixed windows (60 s; hopping 60/30):
# (0, a) takes 2 then 4 rows while open (count 2 crosses twice); b@58, c@45 and a@30 come after
# [0, 60) closed (corrections under reopen, c's with no final before it). Sessions (gap 20 s): b@37
# moves b's start from 40 (under drop too: 37 >= W_prev 35); under reopen a@31 bridges a's emitted
# session [10, 40) with the open [50, 72), b@58 bridges [37, 60) with [70, 90), c@45 is a session of
# late rows only and a@30 joins an emitted session; d@158 (not late: W_prev = 157) bridges d's open
# sessions [140, 160) and [162, 182) under every policy, 1 + 1 rows into 3 (count 2 does not fire:
# a merged session counts from the sum of its parts). NULL keys throughout.
BATCHES: list[list[tuple[str | None, float, int]]] = [
    [("a", 10, 1), ("a", 20, 2), (None, 30, 3), ("b", 40, 4)],
    [("a", 50, 5), ("a", 52, 6), (None, 55, 7), ("b", 37, 8)],
    [("b", 70, 9), ("a", 75, 10), ("a", 31, 11)],
    [("b", 58, 12), ("c", 45, 13), ("a", 80, 14), (None, 85, 15)],
    [("a", 130, 16), ("a", 30, 17), ("b", 110, 18), ("d", 140, 19), ("d", 162, 20)],
    [("d", 158, 21)],
]


def config(kind: str, late_data: str, trigger: Any, retractions: bool, **extra: Any) -> Config:
    sizes: dict[str, Any] = {"tumbling": {"duration_ms": 60_000}, "hopping": {"duration_ms": 60_000, "hop_ms": 30_000},
                             "session": {"gap_ms": 20_000, "max_session_duration_ms": 600_000}}[kind]
    allowed = 120_000 if late_data == "reopen" else 0
    return Config(kind=kind, lateness_ms=5_000, late_data=late_data, allowed_lateness_ms=allowed, emit_trigger=trigger,
                  retractions=retractions, end_of_input="flush", **sizes, **extra)


def window_table(cfg: Config) -> dict[str, Any]:
    """``[transform.window]`` of the oracle's configuration."""
    out: dict[str, Any] = {"kind": cfg.kind, "lateness_ms": cfg.lateness_ms, "late_data": cfg.late_data,
                           "group_by": list(cfg.group_by), "max_groups_per_window": 1000,
                           "aggregations": AGGREGATIONS, "emit_trigger": cfg.emit_trigger}
    for name in ("duration_ms", "hop_ms", "gap_ms", "max_session_duration_ms"):
        if getattr(cfg, name) is not None:
            out[name] = getattr(cfg, name)
    if cfg.late_data == "reopen":
        out["allowed_lateness_ms"] = cfg.allowed_lateness_ms
    return out


def pipeline_text(name: str, root: Path, cfg: Config, target: dict[str, Any] | None = None,
                  store: dict[str, Any] | None = None) -> str:
    """The pipeline over ``root/in`` (one parquet file per micro-batch), SQLite state, parquet target
    in ``root/out`` (with ``retractions`` as configured), ``available_now`` with the flush."""
    if target is None:
        target = {**parquet_target(root / "out"), **({"retractions": True} if cfg.retractions else {})}
    return windowed_pipeline_toml(name, root, target=target, state_store=store or sqlite_store(root / "state.db"),
                                  trigger="available_now", end_of_input=cfg.end_of_input,
                                  extra={"transform": {"window": window_table(cfg)}})


def write_input(files, batches: list[list[tuple]] = BATCHES, feed: Feed | None = None) -> Feed:
    feed = feed or Feed()
    for rows in batches:
        n = len(feed.rows)
        feed.parquet("a", files, [row(100 * n + i, k, v, at(0, s)) for i, (k, s, v) in enumerate(rows)])
    return feed


def oracle_for(feed: Feed, checkpoint: str, cfg: Config) -> Outcome:
    """The oracle fed the rows each micro-batch read, at the batch time Spark recorded (``offsets/N``)."""
    batches = feed.batches(checkpoint, ["a"])
    return run_oracle([(b.time_us, b.rows.to_dict("records")) for b in batches], cfg)


# -- the parquet target ---------------------------------------------------------------------------------


def _plain(v: Any) -> Any:
    return us(v) if isinstance(v, dt.datetime) else v


def read_target(path: str) -> dict[int, tuple[list[Row], list[Row]]]:
    """batch id -> (rows of ``part-0.parquet``, rows of ``flush.parquet``), each in file order."""
    out = {}
    for directory in Path(path).glob("batch_id=*"):
        files = {f.stem: [{c: _plain(v) for c, v in r.items()} for r in pq.read_table(f).to_pylist()]
                 for f in directory.glob("*.parquet")}
        assert set(files) <= {"part-0", "flush"}, files.keys()
        out[int(directory.name.split("=", 1)[1])] = (files.get("part-0", []), files.get("flush", []))
    return out


def view(rows: list[Row]) -> list[tuple]:
    return [tuple(r[c] for c in COLUMNS) for r in rows]


def body(r: Row) -> tuple:
    """A written row without its markers: what a retract must repeat."""
    return tuple(sorted((c, v) for c, v in r.items() if c not in (SEQ, KIND)))


def in_order(got: dict[int, tuple[list[Row], list[Row]]]) -> Iterator[tuple[int, str, list[Row]]]:
    """(batch id, "part-0" | "flush", rows) in the order they were written."""
    for batch_id in sorted(got):
        part, flush = got[batch_id]
        yield batch_id, "part-0", part
        if flush:
            yield batch_id, "flush", flush


def check_against_oracle(path: str, expected: Outcome, cfg: Config) -> dict[int, tuple[list[Row], list[Row]]]:
    """Every batch's rows (kinds, values, the contract's order) and the flush's, ``_emit_seq`` numbering them."""
    got = read_target(path)
    want = {b: (rows, expected.flush if b == len(expected.batches) - 1 else []) for b, rows in enumerate(expected.batches)}
    want = {b: w for b, w in want.items() if w[0] or w[1]}
    assert sorted(got) == sorted(want), "batch directories"
    for batch_id, (part, flush) in sorted(got.items()):
        assert view(part) == view(want[batch_id][0]), f"batch {batch_id}"
        assert view(flush) == view(want[batch_id][1]), f"the flush after batch {batch_id}"
    for batch_id, (part, flush) in sorted(got.items()):
        for rows in (part, flush):
            assert spec_order(rows, cfg.group_by) == rows
        seqs = [r.get(SEQ) for r in part + flush]
        assert seqs == list(range(len(seqs))), f"batch {batch_id}: _emit_seq numbers part-0 then the flush"
    return got


def check_finals(got: dict[int, tuple[list[Row], list[Row]]], expected: Outcome, cfg: Config) -> None:
    """Per key, the final and correction rows are one ``final`` then corrections, or corrections only
    (a group whose first rows reached a closed window); no ``early`` follows them; every key the
    reader keeps at the end was closed so."""
    closing: dict[tuple, list[str]] = {}
    for _, _, rows in in_order(got):
        for r in rows:
            key = row_key(r, cfg.group_by)
            assert not (r[KIND] == "early" and key in closing), f"an early row after the final of {key}"
            if r[KIND] in ("final", "correction"):
                closing.setdefault(key, []).append(r[KIND])
    for key, kinds in closing.items():
        assert kinds.count("final") <= 1 and "final" not in kinds[1:], f"{key}: {kinds}"
    assert set(reader_view(got, cfg)) == set(expected.final_table) <= set(closing), "every key left is closed"


def reader_view(got: dict[int, tuple[list[Row], list[Row]]], cfg: Config) -> dict[tuple, Row]:
    """Per key the row with the largest (batch_id, _emit_seq), keys whose latest row is a retract dropped."""
    latest: dict[tuple, Row] = {}
    for _, _, rows in in_order(got):
        for r in rows:
            latest[row_key(r, cfg.group_by)] = r
    return {k: r for k, r in latest.items() if r[KIND] != "retract"}


def check_retractions(got: dict[int, tuple[list[Row], list[Row]]], expected: Outcome, cfg: Config) -> None:
    """Each retract repeats the row the target holds for its key; with ``retractions``, the signed
    sum of the rows written so far is the oracle's table after every batch and after the flush."""
    held: dict[tuple, Row] = {}

    def order(r: Row) -> tuple:
        return order_key(row_key(r, cfg.group_by))

    signed: Counter[tuple] = Counter()
    for batch_id, part, rows in in_order(got):
        for r in rows:
            key = row_key(r, cfg.group_by)
            if r[KIND] == "retract":
                assert key in held and body(held.pop(key)) == body(r), f"{key}: a retract repeats the row it retracts"
            else:
                assert cfg.retractions is False or key not in held, f"{key}: superseded without a retract"
                held[key] = r
            signed[body(r)] += -1 if r[KIND] == "retract" else 1
        table = expected.final_table if part == "flush" else expected.tables[batch_id]
        assert view(sorted(held.values(), key=order)) == view(sorted(table.values(), key=order)), (batch_id, part)
        if cfg.retractions:
            assert all(c >= 0 for c in signed.values()) and +signed == Counter(body(r) for r in held.values())


# -- shaping batch times --------------------------------------------------------------------------------


class Pauses:
    """Holds the in-process run at ``after_store_commit`` of the named batches for ``seconds`` each
    (``EMATIX_FAULT_PAUSE``), so the next batch's time is at least that much later."""

    def __init__(self, directory: Path, batches: list[int], seconds: float) -> None:
        self.directory, self.batches, self.seconds = directory, batches, seconds
        self._stop = threading.Event()

    def __enter__(self) -> "Pauses":
        self._saved = {n: os.environ.get(n) for n in ("EMATIX_FAULT_PAUSE", "EMATIX_FAULT_DIR")}
        os.environ["EMATIX_FAULT_PAUSE"] = ",".join(f"after_store_commit:{b}" for b in self.batches)
        os.environ["EMATIX_FAULT_DIR"] = str(self.directory)
        self._thread = threading.Thread(target=self._resume, daemon=True)
        self._thread.start()
        return self

    def _resume(self) -> None:
        pending = {self.directory / f"after_store_commit-{b}" for b in self.batches}
        while pending and not self._stop.is_set():
            for marker in list(pending):
                if marker.with_suffix(".paused").exists():
                    time.sleep(self.seconds)
                    marker.with_suffix(".resume").write_text("go\n")
                    pending.discard(marker)
            time.sleep(0.05)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
