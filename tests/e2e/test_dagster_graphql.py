"""The example code location under a real ``dagster dev``, driven through Dagster's GraphQL API.

The test starts ``dagster dev`` on 127.0.0.1 (a free port, a temporary DAGSTER_HOME, its own
process group), finds every example asset, sensor, job and schedule by name, launches the
``processing_time`` clicks pipeline over bounded input plus a closing event, waits for per-batch
materializations, terminates the run (it must reach CANCELED within 60 s and read as a cancel: no
retry request, no step failure), launches it again, terminates it once its pipeline runs (the first run
may have written every window already) and checks that the Postgres target equals a pandas ground
truth: nothing lost, nothing counted twice.
"""

from __future__ import annotations

import pytest

from tests.dagster_support import (
    CLICKS_JOB,
    CLICKS_OP,
    LOCATION,
    Dagit,
    assert_reads_as_a_cancel,
    clicks_ground_truth,
    clicks_target,
    dagster_dev_env,
    drop_clicks_target,
    materializations,
    run_events,
    terminate,
    wait_for,
    write_click_inputs,
)


@pytest.mark.slow
def test_dagster_dev_launch_terminate_relaunch(tmp_path, pg_dsn):
    drop_clicks_target(pg_dsn)
    events = write_click_inputs(tmp_path / ".ematix" / "data" / "clicks")
    expected = clicks_ground_truth(events)
    dagit = Dagit(tmp_path, dagster_dev_env(tmp_path, pg_dsn))
    try:
        dagit.wait_ready()
        repo = dagit.repository()
        assert repo["location"]["name"] == LOCATION
        jobs = {j["name"] for j in repo["jobs"]}
        sensors = {s["name"] for s in repo["sensors"]}
        schedules = {s["name"] for s in repo["schedules"]}
        assets = {"/".join(a["assetKey"]["path"]) for a in repo["assetNodes"]}
        assert {"public/user_clicks_1min", "ematix/clicks-hopping-5min", "ematix/revenue-per-channel"} <= assets, assets
        assert {"clicks_per_minute_job", "clicks_hopping_5min_job", "revenue_per_channel_job",
                "ematix_state_migration_job", "ematix_validate_job", "ematix_checks_job"} <= jobs, jobs
        assert {"clicks_per_minute_keep_alive", "revenue_per_channel_keep_alive", "ematix_run_failure_sensor"} <= sensors, sensors
        assert {"clicks_hopping_5min_schedule", "ematix_state_migration_job_schedule",
                             "ematix_checks_job_schedule"} <= schedules, schedules

        run_config = {"ops": {CLICKS_OP: {"config": {"throttle_seconds": 0}}}}
        first = dagit.client.submit_job_execution(CLICKS_JOB, repository_location_name=LOCATION, run_config=run_config)
        wait_for(lambda: len(materializations(dagit, first)) >= 2, 240, "per-batch materializations")
        labels = {e["label"] for e in materializations(dagit, first)[0]["metadataEntries"]}
        assert {"batch_id", "rows_in", "windows_emitted", "watermark_lag_seconds"} <= labels, labels
        assert terminate(dagit, first) < 60
        assert_reads_as_a_cancel(dagit, first)

        second = dagit.client.submit_job_execution(CLICKS_JOB, repository_location_name=LOCATION, run_config=run_config)
        wait_for(lambda: clicks_target(pg_dsn) == expected or None, 240, "the target to hold every closed window")
        # The first run may have written every window already: terminate the second one only once its
        # pipeline runs (a run canceled before its step starts never reaches the pipeline's stop line).
        wait_for(lambda: any("] guarantee: " in (e.get("message") or "") for e in run_events(dagit, second)),
                 240, "the second run's pipeline to start")
        terminate(dagit, second)
        assert_reads_as_a_cancel(dagit, second)
        assert clicks_target(pg_dsn) == expected
    finally:
        dagit.stop()
    assert dagit.members() == [], "run workers or JVMs outlived dagster dev"
