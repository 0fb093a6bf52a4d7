"""``ematix-dagster run --resume-from-store``: the checkpoint is lost, the store's offsets rebuild it.

The run after the resume must read exactly the entries after the stored offsets (none twice, none
lost), continue the batch ids, keep the open windows' state, and leave a checkpoint ``check``
accepts; a files source refuses the resume.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import redis
import tomli_w

from ematix_dagster.cli import main
from ematix_dagster.operations import check
from ematix_dagster.spec import load_pipeline
from tests import oracle
from tests.e2e.lateness_helpers import at, compare_output, oracle_params, row, run
from tests.e2e.redis_helpers import RedisFeed, redis_source
from tests.redis_server import stream_name

WINDOW = {"kind": "tumbling", "duration_ms": 60_000, "lateness_ms": 5_000, "group_by": ["k"],
          "max_groups_per_window": 100, "aggregations": [{"agg": "count", "as": "n"},
                                                         {"agg": "sum", "column": "v", "as": "total"}]}


def pipeline(tmp: Path, source: dict) -> Path:
    toml = tmp / "p.toml"
    toml.write_text(tomli_w.dumps({
        "pipeline_name": "redis_resume", "sources": [source], "transform": {"window": WINDOW},
        "target": {"kind": "parquet", "path": str(tmp / "out")},
        "state_store": {"kind": "sqlite", "path": str(tmp / "state.db")},
        "run": {"checkpoint_location": str(tmp / "cp"), "end_of_input": "flush"}}))
    return toml


def test_lost_checkpoint_resumes_from_the_store_exactly(spark, redis_url, tmp_path, capsys):
    feed = RedisFeed(redis.Redis.from_url(redis_url, decode_responses=True))
    stream = stream_name("resume")
    for i in range(20):
        feed.json_row("clicks", stream, row(i, f"k{i % 2}", i, at(0, 5 * i)))
    toml = pipeline(tmp_path, redis_source("clicks", redis_url, [stream], event_time_column="ts",
                                           max_entries_per_trigger=6))
    spec = load_pipeline(toml)
    first, _ = run(dataclasses.replace(spec, run=dataclasses.replace(spec.run, end_of_input="keep")), spark)  # batches 0..3, windows left open in the store
    assert [r.batch_id for r in first.reports] == [0, 1, 2, 3] and first.windows_left_open > 0
    cp = Path(spec.run.checkpoint_location)
    shutil.copytree(cp / "offsets", tmp_path / "old-offsets")
    shutil.rmtree(cp)

    report = check(spec)
    assert [p.code for p in report.problems] == ["checkpoint_missing"]
    assert "--resume-from-store" in report.problems[0].fix
    for i in range(20, 32):
        feed.json_row("clicks", stream, row(i, f"k{i % 2}", i, at(0, 5 * i)))
    assert main(["run", str(toml), "--resume-from-store"]) == 0
    err = capsys.readouterr().err
    assert "continues with batch 4" in err and "batch 4: rows in 6" in err and "batch 3:" not in err
    assert check(spec).healthy

    # the oracle sees batches 0..3 as the lost checkpoint recorded them, then the resumed ones
    for old in (tmp_path / "old-offsets").iterdir():
        if old.name.isdigit() and int(old.name) < 4:
            shutil.copy(old, cp / "offsets" / old.name)
    batches = feed.batches(str(cp), ["clicks"])
    assert len(batches) == 6
    compare_output(spec, oracle.run(batches, oracle_params(spec)))


def test_files_sources_refuse_to_resume(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    toml = pipeline(tmp_path, {"name": "clicks", "kind": "files", "format": "json", "path": str(tmp_path / "in"),
                               "schema": "id BIGINT, k STRING, v BIGINT, ts TIMESTAMP", "event_time_column": "ts"})
    assert main(["run", str(toml), "--resume-from-store"]) == 1
    err = capsys.readouterr().err
    assert "error (terminal)" in err and "'clicks' (files) cannot" in err and "seek" in err
    assert not (tmp_path / "cp").exists()
