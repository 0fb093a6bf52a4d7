"""Resuming from durable state, and every way the checkpoint and the store can disagree.

Each divergence (deleted checkpoint, store rolled back, store of another query, newer state
version, changed fingerprint, second writer) is produced for real on a SQLite store and a real
Spark checkpoint, and must be reported by ``check`` with its own code and refused by ``run``.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

from ematix_dagster.cli import main
from ematix_dagster.errors import CheckpointDiverged, FingerprintChanged, LeaseHeld, StateVersionError
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.operations import check, reset, summary
from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spec import load_pipeline_str
from state_store.sqlite import SqliteStateStore
from tests.e2e.lateness_helpers import SCHEMA, at, row
from tests.pipeline_toml import sqlite_store, windowed_pipeline_toml


def _spec(tmp: Path, duration_ms: int = 60_000, checkpoint: str = "cp", state: str = "state.db"):
    return load_pipeline_str(windowed_pipeline_toml("recovery", tmp, duration_ms=duration_ms,
                                                    state_store=sqlite_store(tmp / state), checkpoint=tmp / checkpoint))


def _run(spec, spark):
    return PipelineRunner(spec, spark=spark, metrics=StreamingMetrics(CollectorRegistry())).run()


def _add_minute(batch_files, tmp: Path, minute: int) -> None:
    files = batch_files("in")
    files.count = minute
    files.write([row(100 * minute + i, f"k{i % 2}", i, at(minute, 20 * i), page=f"p{i}") for i in range(3)],
                schema=SCHEMA)


def _codes(spec) -> list[str]:
    return [p.code for p in check(spec).problems]


def _copy_db(src: Path, dst: Path) -> None:
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)


def _restore_db(src: Path, dst: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(str(dst) + suffix).unlink(missing_ok=True)
    _copy_db(src, dst)


def _final_rows(tmp: Path) -> dict:
    table = pq.read_table(tmp / "out").to_pylist()
    return {(r["window_start"], r["k"]): (r["n"], r["total"], r["pages"]) for r in table}


@pytest.fixture
def ran(spark, tmp_path, batch_files):
    """Two minutes of events run through the pipeline once (one window emitted, one kept)."""
    for minute in (0, 1):
        _add_minute(batch_files, tmp_path, minute)
    spec = _spec(tmp_path)
    summary_ = _run(spec, spark)
    assert summary_.windows_left_open == 1
    assert check(spec).healthy
    return spec


def test_resume_continues_where_the_first_run_stopped(ran, spark, tmp_path, batch_files):
    spec = ran
    _add_minute(batch_files, tmp_path, 2)
    second = _run(spec, spark)
    assert [r.batch_id for r in second.reports] == [2]
    rows = _final_rows(tmp_path)
    # The window of minute 1 was left open by the first run and closed by the second.
    minute1 = {k: v for (start, k), v in rows.items() if start.minute == 1}
    assert minute1 == {"k0": (2, 0 + 2, 2), "k1": (1, 1, 1)}
    state = summary(spec)
    assert state["last_batch_id"] == 2 and state["open_windows"] == 1 and state["counters"]["rows_consumed:a"] == 9
    assert check(spec).healthy


def test_deleted_checkpoint(ran, spark):
    shutil.rmtree(ran.run.checkpoint_location)
    assert _codes(ran) == ["checkpoint_missing"]
    with pytest.raises(CheckpointDiverged, match="checkpoint_missing.*reset"):
        _run(ran, spark)


def test_store_rolled_back(ran, spark, tmp_path, batch_files):
    db = tmp_path / "state.db"
    _copy_db(db, tmp_path / "backup.db")
    _add_minute(batch_files, tmp_path, 2)
    _add_minute(batch_files, tmp_path, 3)
    _run(ran, spark)
    _restore_db(tmp_path / "backup.db", db)
    assert _codes(ran) == ["store_behind"]
    with pytest.raises(CheckpointDiverged, match="store_behind"):
        _run(ran, spark)


def test_store_of_another_query(ran, spark, tmp_path):
    other = _spec(tmp_path, checkpoint="cp-other", state="other.db")
    _run(other, spark)  # same input, its own checkpoint and query id
    mixed = _spec(tmp_path, checkpoint="cp-other")  # the first store with the other checkpoint
    assert "query_mismatch" in _codes(mixed)
    with pytest.raises(CheckpointDiverged, match="query_mismatch"):
        _run(mixed, spark)


def test_newer_state_version(ran, spark, tmp_path):
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute("UPDATE ematix_streaming_pipelines SET state_version = 99")
    assert _codes(ran) == ["state_too_new"]
    assert "99" in check(ran).problems[0].message
    with pytest.raises(StateVersionError, match="99"):
        _run(ran, spark)


def test_changed_fingerprint(ran, spark, tmp_path):
    changed = _spec(tmp_path, duration_ms=30_000)
    assert "fingerprint_changed" in _codes(changed)
    with pytest.raises(FingerprintChanged, match="window.duration_ms: 60000 -> 30000"):
        _run(changed, spark)


def test_second_writer(ran, spark, tmp_path):
    holder = SqliteStateStore(str(tmp_path / "state.db"))
    holder.open()
    holder.acquire_lease("recovery", "host=elsewhere pid=1 run=other since=now")
    try:
        with pytest.raises(LeaseHeld, match="run=other"):
            _run(ran, spark)
        with pytest.raises(LeaseHeld, match="run=other"):
            reset(ran)
        assert check(ran).lease_holder == "host=elsewhere pid=1 run=other since=now"
    finally:
        holder.release_lease("recovery")
        holder.close()


def test_reset_and_cli(ran, spark, tmp_path, capsys):
    toml = tmp_path / "p.toml"
    from ematix_dagster.spec import dump_pipeline

    toml.write_text(dump_pipeline(ran))
    assert main(["check", str(toml)]) == 0
    assert "ok: checkpoint and state store agree" in capsys.readouterr().out
    assert main(["state", str(toml)]) == 0
    assert '"last_batch_id": 1' in capsys.readouterr().out
    assert main(["migrate", str(toml), "--dry-run"]) == 0
    assert "at version" in capsys.readouterr().out
    shutil.rmtree(ran.run.checkpoint_location)
    assert main(["check", str(toml)]) == 1
    out = capsys.readouterr().out
    assert "problem checkpoint_missing" in out and "way out" in out
    assert main(["reset", str(toml)]) == 2  # no terminal to confirm on, no --yes
    assert main(["reset", str(toml), "--yes"]) == 0
    assert summary(ran)["last_batch_id"] is None
    again = _run(ran, spark)  # starts over from the first file
    assert [r.batch_id for r in again.reports] == [0, 1]


def test_version_1_state_migrates_and_resumes(ran, spark, tmp_path, batch_files, capsys):
    """State written in the version-1 format (by the real v1 encoder kept with the fixtures) resumes.

    Version-1 code wrote one row per group: the run's segments are replayed into those rows, each
    blob in the version-1 format, and the segments removed, as such a store holds them.
    """
    from ematix_dagster.spec import dump_pipeline
    from state_store.segment_replay import Live, replay
    from tests.fixtures.state_v1.make_fixtures import encode_state_v1

    db = tmp_path / "state.db"
    with sqlite3.connect(db) as conn:
        live: Live = {}
        replay(live, [blob for (blob,) in conn.execute("SELECT blob FROM ematix_streaming_segments ORDER BY seq")], "test")
        rows = [(ran.pipeline_name, start, end, key, encode_state_v1(list(accs)))
                for (start, key), (end, accs, _, _) in live.items()]
        assert rows, "the first run kept an open window in the store"
        conn.execute("DELETE FROM ematix_streaming_segments")
        conn.executemany("INSERT INTO ematix_streaming_state (pipeline_name, window_start, window_end, group_key, "
                         "state_blob, state_version, updated_at) VALUES (?, ?, ?, ?, ?, 1, 'now')", rows)
    toml = tmp_path / "p.toml"
    toml.write_text(dump_pipeline(ran))
    assert main(["migrate", str(toml), "--dry-run"]) == 0
    assert f"{len(rows)} of {len(rows)} state blobs would be rewritten" in capsys.readouterr().out
    with sqlite3.connect(db) as conn:
        assert {v for (v,) in conn.execute("SELECT state_version FROM ematix_streaming_state")} == {1}, "dry run"
    assert main(["migrate", str(toml)]) == 0
    assert f"rewrote {len(rows)} state blobs to version 2" in capsys.readouterr().out
    with sqlite3.connect(db) as conn:
        assert {v for (v,) in conn.execute("SELECT state_version FROM ematix_streaming_state")} == {2}
    _add_minute(batch_files, tmp_path, 2)
    _run(ran, spark)  # loads the v1 blobs through the migration
    minute1 = {k: v for (start, k), v in _final_rows(tmp_path).items() if start.minute == 1}
    assert minute1 == {"k0": (2, 2, 2), "k1": (1, 1, 1)}


def test_a_failed_start_releases_the_lease(ran, spark):
    from dataclasses import replace

    from ematix_dagster.errors import PipelineConfigError

    bad = replace(ran, transform_sql="SELECT no_such_column, _event_ts, _source FROM source")
    with pytest.raises(PipelineConfigError, match="transform.sql"):
        _run(bad, spark)  # fails in the SQL analysis, after the lease was taken
    assert check(ran).lease_holder is None
    assert _run(ran, spark).batches == 0  # the next run gets the lease
