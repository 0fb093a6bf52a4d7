"""A pipeline whose window state Spark keeps (``[run] window_state = "executors"``) materialized as a Dagster
asset, in process: its events carry the batches' rows and watermark, and the health checks evaluate on
them as for a driver-mode pipeline (docs/contract/window-state.md, docs/dagster.md)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

from ematix_dagster.dagster import (
    CheckBounds,
    EmatixSparkResource,
    MetricsResource,
    StateStoreResource,
    streaming_pipeline_asset,
)
from ematix_dagster.dagster.pipeline import metadata_value
from tests.conftest import BatchFiles
from tests.dagster_support import latest_check_evaluations, small_spec
from tests.e2e.lateness_helpers import read_batch_dirs, us

pytestmark = pytest.mark.slow  # one executors-mode run of three batches

SCHEMA = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))])
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def test_an_executors_pipeline_materializes_with_its_checks(spark, tmp_path: Path) -> None:
    spec = small_spec(tmp_path, "exec-clicks")
    spec = replace(spec, run=replace(spec.run, window_state="executors"),
                   shape=replace(spec.window, max_groups_per_window=None)).validate()
    files = BatchFiles(tmp_path / "in")
    for seconds in ((5, 10, 70), (80, 130), (200,)):  # user 1's clicks: every window but [180, 240) closes
        files.write([{"user_id": 1, "amount": 1.0, "ts": T0 + dt.timedelta(seconds=s)} for s in seconds], SCHEMA)
    asset = streaming_pipeline_asset(spec, checks=CheckBounds(max_watermark_lag_seconds=10 ** 9,
                                                             max_late_row_ratio=0.5))
    instance = dg.DagsterInstance.ephemeral()
    try:
        result = dg.materialize([asset], instance=instance, resources={
            "spark": EmatixSparkResource(), "state_store": StateStoreResource(),
            "metrics": MetricsResource(enabled=False)})
        assert result.success
        # a batch that wrote nothing is an observation, the others materializations
        events = [*result.asset_materializations_for_node(asset.node_def.name),
                  *(r.asset_observation for r in instance.fetch_observations(asset.key, limit=100).records)]
        rows_in = sum(metadata_value(e.metadata["rows_in"]) or 0 for e in events if e and "rows_in" in e.metadata)
        written = sum(metadata_value(e.metadata["rows_written"]) or 0 for e in events
                      if e and "rows_written" in e.metadata)
        assert (rows_in, written) == (6, 3)  # [0, 60), [60, 120) and [120, 180) of user 1, once each
        checks = latest_check_evaluations(instance, asset.key)
        assert {name: check.passed for name, check in checks.items()
                if name in ("watermark_lag", "late_row_ratio")} == {"watermark_lag": True, "late_row_ratio": True}
    finally:
        instance.dispose()
    rows = [row for batch in read_batch_dirs(str(tmp_path / "out")).values() for row in batch]
    minute = 60_000_000
    assert sorted((row["window_start"], row["clicks"]) for row in rows) == [
        (us(T0), 2), (us(T0) + minute, 2), (us(T0) + 2 * minute, 1)]
