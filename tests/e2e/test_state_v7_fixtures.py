"""The committed state of schema 7 (one store row per group, session and sliding partial, or a
fixed window's row written whole) still loads and continues exactly under the columnar driver
state.

``tests/fixtures/state_v7/`` was written by ``make_fixtures.py`` with the code before schema step 8
(state segments): for each window kind a real pipeline stopped part way, its SQLite store file at
schema version 7, its Spark checkpoint and its target so far. Opening a copy of that store runs the
migrations; the pipeline then resumes over the rest of the input and its whole target (the
committed run's rows included) must equal the pandas oracle's, so a migration that lost, moved or
re-keyed a window, a session's emitted flag or written row, or a sliding partial fails here.
"""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from ematix_dagster.spec import StateStoreConfig, load_pipeline_str
from tests.e2e import test_sessions_reopen as sessions
from tests.e2e import test_sliding as sliding
from tests.e2e.lateness_helpers import files_source, make_spec
from tests.e2e.test_state_v2_fixture import minute_rows
from tests.pipeline_toml import windowed_pipeline_toml

FIXTURES = Path(__file__).parent.parent / "fixtures" / "state_v7"
# The committed runs were made from the specs and batches below: changing them breaks the fixtures.
SCHEMA = 7  # the store schema the committed files are at
MINUTES, FIRST_MINUTES = 5, 3  # tumbling: input files, and those the committed run consumed
FIRST_SESSION_BATCHES = 2  # sessions.BRIDGES: the committed run read the bridging batch
FIRST_SLIDING_BATCHES = 2  # sliding.BATCHES


def tumbling_spec(root: Path):
    return load_pipeline_str(windowed_pipeline_toml("v7_tumbling", root, window_kind="tumbling", duration_ms=60_000,
                                                    lateness_ms=30_000))


def session_spec(root: Path):
    spec = make_spec(root, "v7_session", [files_source("a", root / "in")], sessions.session_window())
    return dataclasses.replace(spec, state_store=StateStoreConfig(kind="sqlite", path=str(root / "state.db")))


def sliding_spec(root: Path):
    spec = make_spec(root, "v7_sliding", [files_source("a", root / "in")], sliding.sliding_window("reopen"))
    return dataclasses.replace(spec, state_store=StateStoreConfig(kind="sqlite", path=str(root / "state.db")))


def write_tumbling(files, feed, minutes: range) -> None:
    for minute in minutes:
        files.count = minute
        feed.parquet("a", files, minute_rows(minute))


def install(kind: str, root: Path) -> None:
    install_run(FIXTURES / kind, root)


def install_run(src: Path, root: Path) -> None:
    """A committed run's store, checkpoint and target (``src``), as if the run had happened in ``root``."""
    for path in src.iterdir():
        if path.is_dir():
            shutil.copytree(path, root / path.name)
        else:
            shutil.copyfile(path, root / path.name)
    for path in root.rglob("*"):
        if path.is_file() and path.suffix != ".db":
            text = path.read_bytes()
            if b"@ROOT@" in text:
                path.write_bytes(text.replace(b"@ROOT@", str(root).encode()))


def stored_rows(db: Path) -> int:
    """State rows in the committed file, which must still be at schema 7."""
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max(version) FROM ematix_streaming_schema_version").fetchone()[0] == SCHEMA
        rows = conn.execute("SELECT count(*) FROM ematix_streaming_state").fetchone()[0]
    conn.close()
    return rows


def migrated(db: Path) -> tuple[int, int]:
    """(state rows, segments) after the resumed run: every kind leaves its rows for segments on the
    first commit (schema step 8)."""
    with sqlite3.connect(db) as conn:
        out = (conn.execute("SELECT count(*) FROM ematix_streaming_state").fetchone()[0],
               conn.execute("SELECT count(*) FROM ematix_streaming_segments").fetchone()[0])
    conn.close()
    return out


def test_tumbling_windows_of_schema_7_continue_exactly(spark, tmp_path, batch_files):
    from tests import oracle
    from tests.e2e.lateness_helpers import Feed, compare_output, oracle_params, run

    install("tumbling", tmp_path)
    assert stored_rows(tmp_path / "state.db") > 0, "the fixture holds open windows"
    spec = tumbling_spec(tmp_path)
    files, feed = batch_files("in"), Feed()
    write_tumbling(files, feed, range(MINUTES))  # the committed run read the first files; the rest is new
    result, _ = run(spec, spark)
    assert [r.batch_id for r in result.reports] == list(range(FIRST_MINUTES, MINUTES))
    expected = oracle.run(feed.batches(spec.run.checkpoint_location, ["a"]), oracle_params(spec))
    got = compare_output(spec, expected)  # the committed run numbered its rows already
    assert min(got) < FIRST_MINUTES <= max(got), "rows of both runs are compared"
    rows, segments = migrated(tmp_path / "state.db")
    assert rows == 0 and segments >= 1


def test_sessions_of_schema_7_keep_their_flags_and_written_rows(spark, tmp_path, batch_files):
    from tests.e2e.lateness_helpers import run

    install("session", tmp_path)
    assert stored_rows(tmp_path / "state.db") > 0
    spec = session_spec(tmp_path)
    feed, _ = sessions.write_feed(batch_files, sessions.BRIDGES)
    summary, _ = run(spec, spark)
    assert [r.batch_id for r in summary.reports] == list(range(FIRST_SESSION_BATCHES, len(sessions.BRIDGES)))
    oracle, expected = sessions.oracle_batches(feed, spec.run.checkpoint_location)
    # the retractions of batch 1 were written by the committed run; later batches retract and
    # correct sessions whose flags and written rows come from the schema-7 rows
    view = sessions.check_parquet_batches(spec.target.path, expected)
    assert {key: (r["window_end"], tuple(r[a] for a in sessions.ALIASES)) for key, r in view.items()} == \
        sessions.oracle_target(oracle)
    rows, segments = migrated(tmp_path / "state.db")
    assert rows == 0 and segments >= 1


def test_sliding_partials_of_schema_7_continue_exactly(spark, tmp_path, batch_files):
    from tests.e2e.lateness_helpers import run

    install("sliding", tmp_path)
    assert stored_rows(tmp_path / "state.db") > 0
    spec = sliding_spec(tmp_path)
    feed, _ = sliding.write_batches(batch_files, sliding.BATCHES)
    summary, _ = run(spec, spark)
    assert [r.batch_id for r in summary.reports] == list(range(FIRST_SLIDING_BATCHES, len(sliding.BATCHES)))
    _, expected, _ = sliding.oracle_batches(feed, spec.run.checkpoint_location, "reopen")
    expected[-1] = [r for r in expected[-1] if r[2] < sliding.us(sliding.at(100))]  # no flush: b@100 stays open
    assert sliding.target_batches(spec.target.path) == {b: rows for b, rows in enumerate(expected) if rows}
    rows, segments = migrated(tmp_path / "state.db")
    assert rows == 0 and segments >= 1


def first_run(kind: str, root: Path, files_factory: Any) -> Any:
    """Feed the committed run's input into ``root/in`` and return its spec (make_fixtures.py)."""
    files = files_factory(root / "in")
    if kind == "tumbling":
        from tests.e2e.lateness_helpers import Feed

        write_tumbling(files, Feed(), range(FIRST_MINUTES))
        return tumbling_spec(root)
    if kind == "session":
        sessions.write_feed(lambda _name: files, sessions.BRIDGES[:FIRST_SESSION_BATCHES])
        return session_spec(root)
    sliding.write_batches(lambda _name: files, sliding.BATCHES[:FIRST_SLIDING_BATCHES])
    return sliding_spec(root)
