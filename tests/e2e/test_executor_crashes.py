"""An executors pipeline, killed with SIGKILL at random moments and restarted each time, ends exact.

``[run] window_state = "executors"``: Spark's own stateful aggregation (RocksDB, append mode) keeps the
windows in the checkpoint; each batch's windows, dead letters, the fence row of (query, batch) and the
store's record commit in one PostgreSQL transaction (``same_transaction`` target, postgres store,
postgres dead letters in the same database). The pipeline reads CSV files, one micro-batch each,
through a SQL that fails on some rows (``10 / v`` with v = 0: ``sql_error``) and filters others
(WHERE), with rows without an event time (``invalid_event_time``) and late rows.

``ematix-dagster run`` runs in a process group of its own and is restarted with a plain ``run`` (never
``reset``) after each kill of the whole group (driver and JVM). The first run dies at the fault point
after batch 1's store commit (Spark then runs that batch again: a replay). Then :data:`KILLS` runs are
each SIGKILLed a seeded random delay after one of their batches was reported, every one before it
finished; the last run goes to the end (exit 0).

The ground truth is plain pandas over the input, no engine code imported: the batches Spark formed are
read from the checkpoint (``sources/0/N``: the files of batch N; ``offsets/N``: its watermark), and
each row is classified as the contract does: no event time -> ``invalid_event_time`` dead letter;
WHERE -> filtered; ``10 / v`` fails -> ``sql_error`` dead letter; then Spark's late rule, a row of
batch N whose window ends at or before the watermark in effect during batch N-1 is dropped (counted);
the others aggregate. A window is written iff its end is at or before the final watermark. The
target, the dead letters (each row once, by id and reason, under its batch), the store's counters and
the fence table's batches must equal it.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import psycopg
import pytest
import tomli_w

from tests.conftest import BatchFiles
from tests.e2e.test_crash_recovery import ROOT, start_run, wait_group_gone
from tests.pipeline_toml import postgres_dead_letter, postgres_store, postgres_target, windowed_pipeline_toml

NAME = "exec-crash"
FILES = 12
ROWS_PER_FILE = 300
KEYS = 4
PAGES = 8  # few distinct pages per group: the HLL estimate of count_distinct is exact there
T0_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
STEP_MS = 40_000  # file b holds events in [T0 + b*STEP, T0 + b*STEP + 60 s)
DURATION_MS = 60_000
LATENESS_MS = 5_000
SQL = "SELECT *, 10 / v AS r FROM source WHERE page <> 'skip'"
KILLS = 5
SEED = 11
RUN_TIMEOUT_S = 300  # a hang guard: on a busy two-core machine a run took 100 s
FAULT_BATCH = 1
BATCH_LINE = re.compile(rf"^\[{re.escape(NAME)}\] batch (\d+): rows in .*, ([0-9.]+)s$")


# -- input -------------------------------------------------------------------------------------------


def write_input(directory: Path) -> dict[str, pd.DataFrame]:
    """CSV files with strictly increasing mtimes (the file source orders by mtime), by file name.

    Besides ordinary rows each file holds rows without an event time, rows with v = 0 (the SQL's
    division fails), rows the WHERE filters (page 'skip', v never 0 there), and from file 2 on rows up to
    three minutes behind the file's: late for the windows the watermark in effect during the batch before
    closed, or in windows only the batch's own watermark closes (Spark still counts them there).
    """
    out = BatchFiles(directory, fmt="csv")  # part-00000.csv, ... with increasing mtimes
    rnd = random.Random(SEED)
    files: dict[str, pd.DataFrame] = {}
    next_id = 0
    for b in range(FILES):
        rows = []
        for i in range(ROWS_PER_FILE):
            ts: int | None = T0_MS + b * STEP_MS + rnd.randrange(60_000)
            v, page = rnd.randrange(1, 100), f"p{rnd.randrange(PAGES)}"
            if i % 50 == 7:
                ts = None
            elif i % 40 == 11:
                v = 0
            elif i % 30 == 13:
                page = "skip"
            elif b >= 2 and i % 25 == 17:
                ts = T0_MS + b * STEP_MS - rnd.randrange(1, 180_000)
            rows.append((next_id, f"k{rnd.randrange(KEYS)}", v, page, ts))
            next_id += 1
        text = "id,k,v,page,ts\n" + "".join(f"{i},{k},{v},{p},{'' if ts is None else ts}\n" for i, k, v, p, ts in rows)
        name = out.write(text).name
        files[name] = pd.DataFrame(rows, columns=["id", "k", "v", "page", "ts"]).astype({"ts": "Int64"})
    return files


def pipeline_toml(tmp: Path, dsn: str, schema: str) -> Path:
    """The executors pipeline: CSV with epoch-ms times, count / sum / approximate count_distinct per k in
    1-minute windows, exactly-once PostgreSQL target, PostgreSQL store and dead letters."""
    doc = tomllib.loads(windowed_pipeline_toml(
        NAME, tmp, fmt="csv", ts_type="BIGINT", event_time_unit="ms", duration_ms=DURATION_MS,
        lateness_ms=LATENESS_MS, distinct_mode=None,
        target=postgres_target(dsn, f"{schema}.out", same_transaction=True),
        state_store=postgres_store(dsn, schema), trigger="available_now",
        extra={"dead_letter": postgres_dead_letter(dsn, f"{schema}.dead")}))
    doc["transform"]["sql"] = SQL
    doc["run"]["window_state"] = "executors"
    path = tmp / "pipeline.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


# -- killing runs --------------------------------------------------------------------------------------


class Run:
    """One ``run`` in its own process group, its stderr read line by line as it comes."""

    def __init__(self, toml: Path, **env: str) -> None:
        self.started = time.monotonic()
        self.proc = start_run(toml, **env)
        self.lines: list[str] = []
        self.batch_seconds: list[float] = []  # each reported batch's own time, as its line gives it
        self.first_batch_at: float | None = None  # seconds after the start
        self.ended_after = 0.0
        self.reported = threading.Semaphore(0)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if (found := BATCH_LINE.match(line)) is not None:
                if self.first_batch_at is None:
                    self.first_batch_at = time.monotonic() - self.started
                self.batch_seconds.append(float(found.group(2)))
                self.reported.release()

    def wait_batch(self, timeout: float = RUN_TIMEOUT_S) -> bool:
        """Whether a batch was reported before the run exited or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        while not self.reported.acquire(timeout=0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
        return True

    def kill(self) -> bool:
        """SIGKILL the whole group; whether that ended the run (it had not exited before)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.wait() == -signal.SIGKILL

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        """The run's exit status once it and its group are gone (past ``timeout``: killed, failing the test)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"a run did not finish within {timeout:.0f} s\n{self.text[-3000:]}")
        self.ended_after = time.monotonic() - self.started
        self.reader.join(timeout=10)
        assert wait_group_gone(self.proc.pid) == [], "a process of the run's group (driver or JVM) survived"
        return self.proc.returncode

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def __str__(self) -> str:
        first = "none" if self.first_batch_at is None else f"{self.first_batch_at:.1f} s"
        replays = [int(m) for m in re.findall(r"batch (\d+) is already in the state store", self.text)]
        return (f"exit {self.proc.returncode} after {self.ended_after:.1f} s, batches {self.batch_ids} reported "
                f"(the first at {first}), replays skipped {replays}")

    @property
    def batch_ids(self) -> list[int]:
        return [int(found.group(1)) for line in self.lines if (found := BATCH_LINE.match(line))]


def run_with_kills(toml: Path, fault_dir: Path, rnd: random.Random) -> list[Run]:
    """The pipeline run to the end through :data:`KILLS` kills at random moments, and one at a fault point.

    The first run is killed by the fault point ``after_store_commit`` of batch :data:`FAULT_BATCH`: its
    windows, dead letters and record are committed, Spark's commit log lacks it, so the next run's Spark
    runs it again (a replay the store skips, Spark's stateful operator still running it). Then each run
    is let report a batch and killed a random delay later, up to one batch's time (the first run's batch
    1, then the latest one reported after a run's first, which pays for the warm-up): anywhere in the
    next batch (Spark's aggregation, the input read again, the target and store transaction, Spark's
    commit and offset logs) or just past it. A run that exits before its kill fails the test: the input
    must outlast the kills. The last run goes to the end (exit 0). Returns every run.
    """
    first = Run(toml, EMATIX_FAULT_POINTS=f"after_store_commit:{FAULT_BATCH}", EMATIX_FAULT_DIR=str(fault_dir))
    runs = [first]
    code = first.wait()
    assert code == -signal.SIGKILL and (fault_dir / f"after_store_commit-{FAULT_BATCH}.fired").exists(), \
        first.text[-3000:]
    assert first.first_batch_at is not None
    batch_s = first.ended_after - first.first_batch_at  # from batch 0's line to batch 1's commit: one batch
    for _ in range(KILLS):
        run = Run(toml)
        runs.append(run)
        if run.wait_batch():
            time.sleep(rnd.uniform(0.0, batch_s))
        assert run.kill(), f"the run ended (exit {run.proc.returncode}) before its kill:\n{run.text[-3000:]}"
        batch_s = run.batch_seconds[-1] if len(run.batch_seconds) > 1 else batch_s
    last = Run(toml)
    runs.append(last)
    code = last.wait()
    assert code == 0, f"the last run failed (exit {code}):\n{last.text[-4000:]}"
    return runs


# -- ground truth ----------------------------------------------------------------------------------------


def checkpoint_batches(cp: Path, files: dict[str, pd.DataFrame]) -> list[tuple[pd.DataFrame, int]]:
    """The micro-batches Spark formed: (rows, batchWatermarkMs) per batch id.

    The files of batch N are the entries of the file source's log (``sources/0``) whose ``batchId`` is
    N: in ``sources/0/N``, or, every tenth batch, in the ``N.compact`` file that holds all before it.
    """
    ids = sorted(int(p.name) for p in (cp / "offsets").iterdir() if p.name.isdigit())
    assert ids == list(range(len(ids))), f"offsets/ holds batches {ids}"
    logged: dict[int, set[str]] = {}
    for log in (cp / "sources" / "0").iterdir():
        if log.name.startswith("."):  # a checksum file
            continue
        for line in log.read_text().splitlines()[1:]:
            if line.strip():
                entry = json.loads(line)
                logged.setdefault(entry["batchId"], set()).add(Path(entry["path"]).name)
    empty = next(iter(files.values())).iloc[0:0]
    batches = []
    for batch_id in ids:
        meta = json.loads((cp / "offsets" / str(batch_id)).read_text().splitlines()[1])
        frames = [files[name] for name in sorted(logged.get(batch_id, ()))]
        batches.append((pd.concat(frames, ignore_index=True) if frames else empty, int(meta["batchWatermarkMs"])))
    assert sorted(name for names in logged.values() for name in names) == sorted(files), "every file read once"
    return batches


@dataclass
class Truth:
    target: dict[tuple[int, str], tuple[int, int, int]]  # (window start ms, k) -> (n, total, pages)
    letters: dict[int, tuple[str, int]]  # row id -> (reason, batch id)
    counters: dict[str, int]
    fenced: set[int]  # the batches that write windows: each records (query, batch) in the fence table


def truth(batches: list[tuple[pd.DataFrame, int]]) -> Truth:
    """What the pipeline must leave, from the batches Spark formed."""
    counters = {"rows_consumed:a": 0, "invalid_event_time_rows:a": 0, "future_rows:a": 0, "malformed_rows:a": 0,
                "dead_letter_rows:invalid_event_time": 0, "dead_letter_rows:sql_error": 0,
                "rejected_rows:sql_error": 0, "filtered_rows:where": 0, "late_rows_dropped": 0,
                "late_assignments_dropped": 0}
    letters: dict[int, tuple[str, int]] = {}
    aggregated = []
    newest: int | None = None
    behind = 0  # rows of windows their own batch's watermark closes, which Spark still counts
    marks: list[int] = []  # the watermark in effect during each batch, computed from the rows
    for n, (rows, stored_mark) in enumerate(batches):
        # Spark's watermark during batch N: the newest event time of batches 0..N-1 (every row with one:
        # it is set before the SQL, so filtered and failing rows move it too) less the lateness, never
        # back; 0 before any row
        marks.append(max(marks[-1] if marks else 0, newest - LATENESS_MS if newest is not None else 0))
        assert marks[n] == stored_mark, f"batch {n}: the offsets log's watermark is {stored_mark}, not {marks[n]}"
        counters["rows_consumed:a"] += len(rows)
        timed = rows[rows["ts"].notna()]
        if len(timed):
            newest = max(newest or 0, int(timed["ts"].max()))
        invalid = rows[rows["ts"].isna()]
        counters["invalid_event_time_rows:a"] += len(invalid)
        counters["dead_letter_rows:invalid_event_time"] += len(invalid)
        letters.update({int(i): ("invalid_event_time", n) for i in invalid["id"]})
        counters["filtered_rows:where"] += int((timed["page"] == "skip").sum())
        passed = timed[timed["page"] != "skip"]
        failing = passed[passed["v"] == 0]
        counters["dead_letter_rows:sql_error"] += len(failing)
        counters["rejected_rows:sql_error"] += len(failing)
        letters.update({int(i): ("sql_error", n) for i in failing["id"]})
        valid = passed[passed["v"] != 0].copy()
        valid["start"] = valid["ts"].astype("int64") // DURATION_MS * DURATION_MS
        end = valid["start"] + DURATION_MS
        # Spark's late rule: dropped iff the window ends at or before the watermark in effect during
        # batch N-1 (batch 0: nothing is late)
        late = end <= marks[n - 1] if n > 0 else pd.Series(False, index=valid.index)
        counters["late_rows_dropped"] += int(late.sum())
        behind += int(((end <= marks[n]) & ~late).sum())
        aggregated.append(valid[~late])
    # The final watermark is the newest event time less the lateness: available_now ends with a batch
    # without data that moves the watermark there, so both that computed value and the last batch's
    # batchWatermarkMs hold it (asserted here, and every batch's above). A window is written iff its end
    # is at or before it; in the first batch whose watermark reaches its end (its rows all came before:
    # a later one would be late).
    final = newest - LATENESS_MS
    assert batches[-1][0].empty and batches[-1][1] == final, "the last batch must move the watermark to the end"
    rows = pd.concat(aggregated, ignore_index=True)
    written = rows[rows["start"] + DURATION_MS <= final]
    groups = written.groupby(["start", "k"]).agg(n=("id", "size"), total=("v", "sum"), pages=("page", "nunique"))
    target = {(int(s), k): (int(r.n), int(r.total), int(r.pages)) for (s, k), r in groups.iterrows()}
    fenced = {next(n for n, mark in enumerate(marks) if start + DURATION_MS <= mark) for start, _ in target}
    counters["windows_emitted"] = len(target)
    assert counters["late_rows_dropped"] > 0 and behind > 0 and len(rows) > len(written), \
        "some rows late, some counted in windows their own batch closes, some windows left open"
    return Truth(target, letters, counters, fenced)


# -- what the pipeline left -----------------------------------------------------------------------------


def actual_target(dsn: str, table: str) -> dict[tuple[int, str], tuple[int, int, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT window_start, k, n, total, pages FROM {table}").fetchall()
    got = {(pd.Timestamp(ws).value // 1_000_000, k): (n, total, pages) for ws, k, n, total, pages in rows}
    assert len(got) == len(rows), "one target row per (window start, k)"
    return got


def actual_letters(dsn: str, table: str) -> list[tuple[int, str, int]]:
    """(id, reason, batch id) of every dead-letter row."""
    with psycopg.connect(dsn) as conn:
        return [(int(payload["id"]), reason, batch) for reason, batch, payload in
                conn.execute(f"SELECT _reason, _batch_id, payload FROM {table}").fetchall()]


def fence_rows(dsn: str, schema: str, table: str) -> list[tuple[str, int]]:
    """(query id, batch id) of the batches the fence table records as written to ``table``."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT query_id, batch_id FROM {schema}.ematix_written_batches WHERE table_name = %s",
                            (table,)).fetchall()


def stored_state(toml: Path) -> dict:
    """The store's record (counters, last batch, query id), as ``ematix-dagster state`` shows it."""
    out = subprocess.run([sys.executable, "-m", "ematix_dagster.cli", "state", str(toml)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)


@pytest.mark.slow
def test_executors_pipeline_killed_at_random_moments_ends_exact(tmp_path, pg_dsn, pg_schema):
    started = time.monotonic()
    files = write_input(tmp_path / "in")
    toml = pipeline_toml(tmp_path, pg_dsn, pg_schema)

    runs = run_with_kills(toml, tmp_path / "faults", random.Random(SEED))
    kills = sum(run.proc.returncode == -signal.SIGKILL for run in runs[1:])
    assert kills >= KILLS
    replay = f"batch {FAULT_BATCH} is already in the state store: replay skipped"
    assert replay in runs[1].text, runs[1].text[-3000:]

    batches = checkpoint_batches(tmp_path / "cp", files)
    assert sum(not rows.empty for rows, _ in batches) == FILES, "one micro-batch per file"
    want = truth(batches)

    got = actual_target(pg_dsn, f"{pg_schema}.out")
    assert got == want.target

    dead = actual_letters(pg_dsn, f"{pg_schema}.dead")
    assert len(dead) == len({(i, reason) for i, reason, _ in dead}), "a dead letter written twice"
    assert {i: (reason, batch) for i, reason, batch in dead} == want.letters

    state = stored_state(toml)
    assert state["last_batch_id"] == len(batches) - 1
    stored = state["counters"]
    assert {k: stored.get(k, 0) for k in want.counters} == want.counters

    fenced = fence_rows(pg_dsn, pg_schema, "out")
    assert {query for query, _ in fenced} == {state["query_id"]}, "one query wrote the target, through every restart"
    assert sorted(batch for _, batch in fenced) == sorted(want.fenced), "each batch that writes windows, fenced once"
    for i, run in enumerate(runs):
        print(f"run {i}: {run}")
    print(f"executors crash series: {kills} random kills and one at a fault point, {len(batches)} batches, "
          f"{len(got)} windows, {len(dead)} dead letters, {time.monotonic() - started:.1f} s")
