"""A running step's checks: evaluated on time without new batches, and standing after the run stops.

A real (ephemeral) Dagster instance stores the materializations and the runless evaluations; the
batch reports are built by hand, and the clock is a fake one, so a stalled input is a clock that
moves while no batch comes.
"""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import pytest

from ematix_dagster.dagster.check_reports import CheckTimer, StepChecks
from ematix_dagster.dagster.checks import LATE_ROW_RATIO_CHECK, WATERMARK_LAG_CHECK, CheckBounds, latest_evaluation
from ematix_dagster.dagster.pipeline import EmatixPipeline
from ematix_dagster.errors import ConfigError
from ematix_dagster.spark.batch.batch_report import BatchReport, WindowCounts
from tests.dagster_support import small_spec

PIPELINE = EmatixPipeline(small_spec(Path("/tmp/ematix-check-reports"), trigger="processing_time"))
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
BOUNDS = CheckBounds(max_watermark_lag_seconds=20, max_late_row_ratio=0.1, check_interval_seconds=5)
RUNNING = {LATE_ROW_RATIO_CHECK, WATERMARK_LAG_CHECK}


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def report(batch_id: int, rows: int, late: int, watermark_s: float) -> BatchReport:
    counts = WindowCounts(windows_emitted=1, corrections=0, early_rows=0, retractions=0, late_rows=late,
                          state_groups=1, windows_open=1)
    return BatchReport(batch_id=batch_id, batch_time=int(watermark_s * 1e6), rows_in=rows, rows_by_source={"a": rows},
                       dead_letter_rows=0, watermark=int(watermark_s * 1e6), source_watermarks={}, idle_sources=[],
                       seconds=0.1, counts=counts)


def materialize(instance: dg.DagsterInstance) -> int:
    """A materialization of the pipeline's asset (a batch's, or a run's final one); its storage id."""
    instance.report_runless_asset_event(dg.AssetMaterialization(PIPELINE.key))
    return instance.fetch_materializations(PIPELINE.key, limit=1).records[0].storage_id


def evaluation(instance: dg.DagsterInstance, name: str) -> dg.AssetCheckEvaluation | None:
    return latest_evaluation(instance, PIPELINE.check_key(name))


def test_a_stalled_input_fails_the_lag_check_on_time_without_a_batch(instance):
    clock = Clock(T0 + 5)
    checks = StepChecks(instance, PIPELINE, BOUNDS, RUNNING, set(), clock=clock)
    materialize(instance)
    list(checks.after_report(report(0, 10, 0, T0), None))  # the last batch: the input stops after it
    checks.evaluate_on_time()
    lag = evaluation(instance, WATERMARK_LAG_CHECK)
    assert lag is not None and lag.passed and lag.metadata["watermark_lag_seconds"].value == 5
    clock.now = T0 + 21  # past the bound, and no batch came: the timer's next evaluation fails
    checks.evaluate_on_time()
    lag = evaluation(instance, WATERMARK_LAG_CHECK)
    assert lag is not None and not lag.passed and lag.metadata["watermark_lag_seconds"].value == 21
    assert "after batch 0" in (lag.description or "")


def test_late_rows_of_a_batch_that_only_observed_are_checked_on_time(instance):
    checks = StepChecks(instance, PIPELINE, BOUNDS, RUNNING, set(), clock=Clock(T0))
    materialize(instance)
    list(checks.after_report(report(0, 10, 0, T0), None))
    list(checks.after_report(report(1, 30, 20, T0), None))  # an observation: no materialization to follow
    assert evaluation(instance, LATE_ROW_RATIO_CHECK) is None
    checks.evaluate_on_time()
    late = evaluation(instance, LATE_ROW_RATIO_CHECK)
    assert late is not None and not late.passed and late.metadata["late_rows"].value == 20
    assert late.metadata["rows_consumed"].value == 40


def test_a_failed_check_stands_for_the_final_materialization_after_a_stop(instance):
    checks = StepChecks(instance, PIPELINE, BOUNDS, RUNNING, set(), clock=Clock(T0 + 1))
    first = materialize(instance)
    list(checks.after_report(report(0, 9, 3, T0), dg.AssetMaterialization(PIPELINE.key)))  # 33 % late
    late = evaluation(instance, LATE_ROW_RATIO_CHECK)
    assert late is not None and not late.passed and late.target_materialization_data.storage_id == first
    final = materialize(instance)  # the run's closing result after a terminate: no check result of its own
    checks.repeat_latest()
    late = evaluation(instance, LATE_ROW_RATIO_CHECK)
    assert late is not None and not late.passed and late.target_materialization_data.storage_id == final
    lag = evaluation(instance, WATERMARK_LAG_CHECK)
    assert lag is not None and lag.passed and lag.target_materialization_data.storage_id == final


def test_a_step_whose_run_has_ended_reports_nothing_more(instance):
    active = [True]
    checks = StepChecks(instance, PIPELINE, BOUNDS, RUNNING, set(), active=lambda: active[0], clock=Clock(T0 + 60))
    materialize(instance)
    list(checks.after_report(report(0, 10, 0, T0), None))
    active[0] = False
    checks.evaluate_on_time()
    assert evaluation(instance, WATERMARK_LAG_CHECK) is None


def test_the_timer_evaluates_again_and_again_until_closed(instance):
    bounds = CheckBounds(max_watermark_lag_seconds=20, check_interval_seconds=0.05)
    checks = StepChecks(instance, PIPELINE, bounds, RUNNING, set(), clock=Clock(T0 + 1))
    materialize(instance)
    list(checks.after_report(report(0, 10, 0, T0), None))

    def evaluations() -> int:
        return len(instance.event_log_storage.get_asset_check_execution_history(
            PIPELINE.check_key(WATERMARK_LAG_CHECK), limit=100))

    timer = CheckTimer(checks).start()
    deadline = time.monotonic() + 30
    while evaluations() < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    timer.close()
    after_close = evaluations()
    assert after_close >= 3
    time.sleep(0.2)
    assert evaluations() == after_close


def test_the_interval_travels_with_the_asset_and_must_be_positive():
    asset_bounds = CheckBounds(max_watermark_lag_seconds=20, check_interval_seconds=5)
    from ematix_dagster.dagster import streaming_pipeline_asset

    asset = streaming_pipeline_asset(PIPELINE, checks=asset_bounds)
    assert CheckBounds.of_asset(asset) == asset_bounds
    descriptions = {spec.name: spec.description for spec in asset.check_specs}
    assert "at least every 5 s" in descriptions[WATERMARK_LAG_CHECK]
    with pytest.raises(ConfigError, match="check_interval_seconds: 0 is not > 0") as refused:
        CheckBounds(check_interval_seconds=0)
    assert refused.value.terminal
