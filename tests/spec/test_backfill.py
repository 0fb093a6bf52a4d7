"""``[backfill]`` in the TOML: what it accepts, what it refuses at load time and why, and the round trip."""

from __future__ import annotations

import datetime as dt
import tomllib
from pathlib import Path

import pytest
import tomli_w

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import dump_pipeline, load_pipeline_str
from ematix_dagster.spec.backfill import Backfill, BackfillSource
from tests.pipeline_toml import postgres_target, windowed_pipeline_toml

ROOT = Path("/tmp/backfill-spec")
TARGET = postgres_target("postgresql://u@h/db", "public.t")


def doc(backfill: dict, **keys) -> dict:
    keys.setdefault("target", TARGET)
    return tomllib.loads(windowed_pipeline_toml("bf", ROOT, extra={"backfill": backfill}, **keys))


def load(d: dict):
    return load_pipeline_str(tomli_w.dumps(d))


def test_a_backfill_table_loads_and_round_trips():
    d = doc({"partition": "hourly", "start": "2024-01-01T05:00:00Z", "sources": [{"name": "a", "path": "/archive/a"}]},
            window_kind="hopping", duration_ms=600_000, hop_ms=300_000)
    spec = load(d)
    assert spec.backfill == Backfill("hourly", "2024-01-01T05:00:00Z", (BackfillSource("a", "/archive/a"),))
    assert load_pipeline_str(dump_pipeline(spec)) == spec


@pytest.mark.parametrize("change, key, reason", [
    (dict(backfill={"partition": "weekly", "start": "2024-01-01"}), "backfill.partition", "unknown partition 'weekly'"),
    (dict(backfill={"partition": "daily", "start": "2024-01-01T01:00"}), "backfill.start", "is not the start of a day"),
    (dict(backfill={"partition": "daily", "start": "soon"}), "backfill.start", "not an ISO-8601 date"),
    (dict(backfill={"partition": "daily", "start": dt.date(2024, 1, 1)}), "backfill.start", "not a string"),
    (dict(backfill={"partition": "daily"}), "backfill.start", "is required"),
    (dict(backfill={"partition": "daily", "start": "2024-01-01", "sources": [{"name": "b", "path": "/x"}]}),
     "backfill.sources[0].name", "no source is named 'b'"),
    (dict(backfill={"partition": "daily", "start": "2024-01-01",
                    "sources": [{"name": "a", "path": "/x"}, {"name": "a", "path": "/y"}]}),
     "backfill.sources[1].name", "'a' is named twice"),
    (dict(backfill={"partition": "daily", "start": "2024-01-01", "sources": ["/x"]}), "backfill.sources",
     "must be an array of tables"),
    (dict(backfill={"partition": "daily", "start": "2024-01-01", "every": "day"}), "backfill.every", "unknown key"),
    (dict(backfill={"partition": "daily", "start": "2024-01-01"}, window_kind="session", duration_ms=None,
          gap_ms=60_000, max_session_duration_ms=3_600_000), "backfill", "does not apply to session windows: a range boundary would cut their windows"),
    (dict(backfill={"partition": "daily", "start": "2024-01-01"}, window_kind="sliding",
          max_events_per_group=100), "backfill",
     "does not apply to sliding windows"),
    (dict(backfill={"partition": "daily", "start": "2024-01-01"}, target={"kind": "parquet", "path": "/out"}),
     "backfill", "the target is 'parquet'"),
])
def test_what_a_backfill_cannot_rewrite_is_refused_at_load_time(change, key, reason):
    with pytest.raises(PipelineConfigError) as refused:
        load(doc(**change))
    assert str(refused.value).startswith(f"{key}: ") and reason in str(refused.value), str(refused.value)


def test_a_row_pipeline_or_a_source_without_files_cannot_be_backfilled():
    d = doc({"partition": "daily", "start": "2024-01-01"})
    kafka = dict(d, sources=[{"name": "a", "kind": "kafka", "bootstrap_servers": "h:9092", "topic": "t"}])
    with pytest.raises(PipelineConfigError, match=r"sources\[0\].kind: a backfill reads archived files; source 'a' is 'kafka'"):
        load(kafka)
    rows = dict(d, transform={"sql": "SELECT * FROM source"})
    with pytest.raises(PipelineConfigError, match="backfill: applies to windowed pipelines"):
        load(rows)


def test_a_backfill_of_window_state_on_the_executors_needs_the_drivers_cap():
    """A backfill's one-shot run keeps its range's windows on the driver, whatever window_state says."""
    d = doc({"partition": "daily", "start": "2024-01-01"})
    d["run"]["window_state"] = "executors"
    assert load(d).run.window_state == "executors"
    del d["transform"]["window"]["max_groups_per_window"]
    with pytest.raises(PipelineConfigError) as refused:
        load(d)
    assert refused.value.key == "transform.window.max_groups_per_window"
    assert "is required with [backfill]" in str(refused.value)
