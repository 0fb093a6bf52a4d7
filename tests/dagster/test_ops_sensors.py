"""Asset checks, ops and sensors on constructed good and bad states (real SQLite / PostgreSQL, no Spark)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from dagster._core.test_utils import create_run_for_test
from psycopg import sql

from ematix_dagster.dagster import (
    CODE_VERSION_TAG,
    FAILURE_TAG,
    PIPELINE_TAG,
    TERMINATED_BY_TAG,
    CheckBounds,
    EmatixPipeline,
    EmatixSparkResource,
    MetricsResource,
    StateStoreResource,
    checks_job,
    keep_alive_sensor,
    maintenance_job,
    pipeline_job,
    run_failure_sensor,
    state_migration_job,
    streaming_pipeline_asset,
)
from ematix_dagster.dagster.sensors import failure_log_level
from ematix_dagster.spec import StateStoreConfig, Target
from ematix_dagster.stores import make_store
from state_store import codec
from tests.dagster_support import HeldLease, commit_state, latest_check_evaluations, small_spec

FIXTURES = Path(__file__).parent.parent / "fixtures" / "state_v1"
_INSTANCES: list[dg.DagsterInstance] = []


@pytest.fixture(autouse=True)
def _dispose_instances():
    yield
    while _INSTANCES:
        _INSTANCES.pop().dispose()


class Location:
    """One pipeline with its asset, checks, jobs and sensor, in an ephemeral instance."""

    def __init__(self, tmp_path: Path, *, target: Target | None = None, store: StateStoreConfig | None = None,
                 name: str = "tiny-clicks", backoff: float = 3600.0) -> None:
        self.spec = small_spec(tmp_path, name, target=target, store=store, trigger="processing_time")
        self.asset = streaming_pipeline_asset(self.spec, checks=CheckBounds(max_watermark_lag_seconds=60,
                                                                            max_late_row_ratio=0.1))
        self.pipeline = EmatixPipeline.from_asset(self.asset)
        self.job = pipeline_job(self.asset)
        self.sensor = keep_alive_sensor(self.asset, self.job, backoff_base_seconds=backoff)
        self.store = StateStoreResource()  # keeps the spec's own [state_store]
        self.resources = {"spark": EmatixSparkResource(), "state_store": self.store,
                          "metrics": MetricsResource(enabled=False)}
        self.defs = dg.Definitions(assets=[self.asset],
                                   jobs=[self.job, checks_job([self.asset])], sensors=[self.sensor],
                                   resources=self.resources)
        self.instance = dg.DagsterInstance.ephemeral()
        _INSTANCES.append(self.instance)

    def run_checks(self) -> dict[str, dg.AssetCheckEvaluation]:
        """The checks job's run, then each check's latest evaluation (runless: the job reports them)."""
        result = self.defs.resolve_job_def("ematix_checks_job").execute_in_process(instance=self.instance)
        assert result.success
        return latest_check_evaluations(self.instance, self.asset.key)

    def sense(self, cursor: str | None = None, store: StateStoreResource | None = None):
        context = dg.build_sensor_context(instance=self.instance, cursor=cursor,
                                          resources={"state_store": store or self.store}, definitions=self.defs)
        return self.sensor.evaluate_tick(context)

    def add_run(self, status: dg.DagsterRunStatus, **tags: str):
        return create_run_for_test(self.instance, job_name=self.pipeline.job_name, status=status,
                                   tags={PIPELINE_TAG: self.spec.pipeline_name, **tags})


def skip_text(data) -> str:
    assert not data.run_requests, data.run_requests
    assert data.skip_message
    return data.skip_message


# ---------------------------------------------------------------------------------------------
# Asset checks


def test_checks_pass_on_a_fresh_pipeline_and_fail_on_a_bad_stored_state(tmp_path):
    loc = Location(tmp_path)
    fresh = loc.run_checks()
    # a pipeline that never ran has no lag and no late rows to measure: skipped, not passed
    assert set(fresh) == {"checkpoint_consistency", "idempotent_target"}
    assert all(e.passed for e in fresh.values()), {k: e.description for k, e in fresh.items()}
    history = loc.instance.event_log_storage.get_asset_check_execution_history
    before = len(history(loc.pipeline.check_key("checkpoint_consistency"), limit=10))
    loc.run_checks()  # passed on the same stored batch: not evaluated again
    assert len(history(loc.pipeline.check_key("checkpoint_consistency"), limit=10)) == before == 1

    # the store says batch 3 but there is no checkpoint; the watermark is an hour old; 20 % late rows
    commit_state(loc.spec, batch_id=3, watermark_us=int((time.time() - 3600) * 1e6),
                 counters={"rows_consumed:clicks": 100, "late_rows_dropped": 20})
    bad = loc.run_checks()
    assert not bad["checkpoint_consistency"].passed
    assert bad["checkpoint_consistency"].severity == dg.AssetCheckSeverity.ERROR
    assert "checkpoint_missing" in bad["checkpoint_consistency"].description
    assert not bad["watermark_lag"].passed and bad["watermark_lag"].severity == dg.AssetCheckSeverity.WARN
    assert bad["watermark_lag"].metadata["watermark_lag_seconds"].value >= 3600
    assert not bad["late_row_ratio"].passed and bad["late_row_ratio"].severity == dg.AssetCheckSeverity.WARN
    assert bad["late_row_ratio"].metadata["late_row_ratio"].value == pytest.approx(0.2)
    assert bad["idempotent_target"].passed

    # a recent watermark and 5 % late rows are within the bounds
    commit_state(loc.spec, batch_id=4, watermark_us=int((time.time() - 5) * 1e6),
                 counters={"rows_consumed:clicks": 100, "late_rows_dropped": 5})
    better = loc.run_checks()
    assert better["watermark_lag"].passed and better["late_row_ratio"].passed
    assert not better["checkpoint_consistency"].passed

    # while the checkpoint check fails, the keep-alive sensor does not restart the pipeline
    text = skip_text(loc.sense())
    assert "checkpoint_consistency" in text and "checkpoint_missing" in text


def test_idempotent_target_check_warns_for_console_and_postgres_tables_without_a_natural_key(tmp_path, pg_dsn,
                                                                                            pg_schema):
    console = Location(tmp_path / "console", target=Target(kind="console"), name="console-clicks").run_checks()
    assert not console["idempotent_target"].passed
    assert console["idempotent_target"].severity == dg.AssetCheckSeverity.WARN
    assert "console" in console["idempotent_target"].description

    def postgres(name: str, table: str, create: bool) -> dg.AssetCheckEvaluation:
        loc = Location(tmp_path / name, name=name,
                       target=Target(kind="postgres", url=pg_dsn, table=f"{pg_schema}.{table}", create_table=create))
        return loc.run_checks()["idempotent_target"]

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {}.no_key (window_start timestamptz, window_end timestamptz, "
                             "user_id bigint, clicks bigint)").format(sql.Identifier(pg_schema)))
        conn.execute(sql.SQL("CREATE TABLE {}.keyed (window_start timestamptz, window_end timestamptz, "
                             "user_id bigint, clicks bigint, UNIQUE NULLS NOT DISTINCT (window_start, user_id))")
                     .format(sql.Identifier(pg_schema)))
        # an early trigger's table keeps _emit_kind (docs/contract/targets-and-guarantees.md)
        conn.execute(sql.SQL("CREATE TABLE {}.keyed_kind (window_start timestamptz, window_end timestamptz, "
                             "user_id bigint, clicks bigint, _emit_kind text, "
                             "UNIQUE NULLS NOT DISTINCT (window_start, user_id))").format(sql.Identifier(pg_schema)))
    no_key = postgres("pg-no-key", "no_key", False)
    assert not no_key.passed and "no unique key" in no_key.description and "user_id" in no_key.description
    assert postgres("pg-keyed", "keyed", False).passed
    assert postgres("pg-keyed-kind", "keyed_kind", False).passed
    assert postgres("pg-created-at-start", "not_yet", True).passed
    missing = postgres("pg-missing", "missing", False)
    assert not missing.passed and "does not exist" in missing.description


# ---------------------------------------------------------------------------------------------
# Ops


def test_validate_checkpoint_and_check_idempotent_target_ops(tmp_path):
    good = EmatixPipeline.load(small_spec(tmp_path / "good", "good-clicks"))
    console = EmatixPipeline.load(small_spec(tmp_path / "console", "console-clicks", target=Target(kind="console")))
    bad = EmatixPipeline.load(small_spec(tmp_path / "bad", "bad-clicks"))
    commit_state(bad.spec, batch_id=2)
    job = maintenance_job([good, console, bad])
    resources = {"state_store": StateStoreResource()}

    def run(validate: list[str], idempotent: list[str], fail_on_warning: bool = False):
        config = {"ops": {"validate_checkpoint": {"config": {"pipelines": validate}},
                          "check_idempotent_target": {"config": {"pipelines": idempotent,
                                                                 "fail_on_warning": fail_on_warning}}}}
        return job.execute_in_process(run_config=config, resources=resources, raise_on_error=False)

    ok = run(["good-clicks", "console-clicks"], ["good-clicks"])
    assert ok.success
    assert ok.output_for_node("check_idempotent_target") == []

    warned = run(["good-clicks"], ["good-clicks", "console-clicks"])
    assert warned.success  # a warning, not a failure
    assert len(warned.output_for_node("check_idempotent_target")) == 1
    assert "console" in warned.output_for_node("check_idempotent_target")[0]

    strict = run(["good-clicks"], ["console-clicks"], fail_on_warning=True)
    assert not strict.success
    assert [e.step_key for e in strict.get_step_failure_events()] == ["check_idempotent_target"]

    failed = run(["bad-clicks"], ["good-clicks"])
    assert not failed.success
    failure = failed.get_step_failure_events()[0]
    assert failure.step_key == "validate_checkpoint"
    text = failure.step_failure_data.user_failure_data.description
    assert "bad-clicks" in text and "checkpoint_missing" in text and "Way out" in text


def test_migrate_state_op_migrates_free_pipelines_records_pending_for_running_ones_and_fails_on_bad_stores(tmp_path):
    old = EmatixPipeline.load(small_spec(tmp_path / "old", "old-clicks"))
    running = EmatixPipeline.load(small_spec(tmp_path / "running", "running-clicks"))
    v1 = (FIXTURES / "counts.state.bin").read_bytes()
    assert v1[0] < codec.STATE_VERSION
    for p in (old, running):
        commit_state(p.spec, batch_id=1,
                     rows=[(0, p.spec.window.duration_ms * 1_000, codec.encode_key(("counts",)), v1)])
    job = state_migration_job([old, running])
    resources = {"state_store": StateStoreResource()}

    def stored_versions(p: EmatixPipeline) -> list[int]:
        store = make_store(p.spec.state_store)
        store.open()
        try:
            if store.kind == "sqlite":  # read the raw rows: load() brings blobs forward in memory
                from state_store.migrations import sqlite_names

                rows = store._db().execute(f"SELECT state_blob FROM {sqlite_names()['state']} "
                                           "WHERE pipeline_name = ?", (p.name,)).fetchall()
                return [bytes(r[0])[0] for r in rows]
            raise AssertionError(store.kind)
        finally:
            store.close()

    instance = dg.DagsterInstance.ephemeral()
    _INSTANCES.append(instance)
    with HeldLease(running.spec, "cli run"):
        dry = job.execute_in_process(run_config={"ops": {"migrate_state": {"config": {"dry_run": True}}}},
                                     resources=resources, instance=instance)
        assert dry.success and stored_versions(old) == [v1[0]]
        result = job.execute_in_process(resources=resources, instance=instance)
    assert result.success
    assert stored_versions(old) == [codec.STATE_VERSION]
    assert stored_versions(running) == [v1[0]]  # its lease was held: pending, untouched
    output = result.output_for_node("migrate_state")
    assert output == {"migrated": {"old-clicks": 1}, "pending": ["running-clicks"]}
    observations = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert len(observations) == 1
    assert observations[0].asset_key == running.key

    unreachable = StateStoreResource(kind="postgres", url="postgresql://postgres@127.0.0.1:1/test")
    broken = job.execute_in_process(resources={"state_store": unreachable}, raise_on_error=False,
                                    run_config={"ops": {"migrate_state": {"config": {"pipelines": ["old-clicks"]}}}})
    assert not broken.success
    text = broken.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert "old-clicks" in text and "StoreUnavailable" in text


def test_migrate_state_with_restart_running_terminates_the_run_waits_for_the_lease_and_migrates(tmp_path):
    import threading

    p = EmatixPipeline.load(small_spec(tmp_path, "busy-clicks"))
    v1 = (FIXTURES / "counts.state.bin").read_bytes()
    commit_state(p.spec, batch_id=1,
                 rows=[(0, p.spec.window.duration_ms * 1_000, codec.encode_key(("counts",)), v1)])
    instance = dg.DagsterInstance.ephemeral()
    _INSTANCES.append(instance)
    active = create_run_for_test(instance, job_name=p.job_name, status=dg.DagsterRunStatus.STARTED,
                                 tags={PIPELINE_TAG: p.name})
    lease = HeldLease(p.spec, f"dagster:{active.run_id}").__enter__()
    # the "run" ends (and frees its lease) a moment after it is told to stop
    threading.Timer(1.5, lease.__exit__).start()
    result = state_migration_job([p]).execute_in_process(
        instance=instance, resources={"state_store": StateStoreResource()},
        run_config={"ops": {"migrate_state": {"config": {"restart_running": True, "lease_wait_seconds": 30}}}})
    assert result.success
    assert result.output_for_node("migrate_state") == {"migrated": {"busy-clicks": 1}, "pending": []}
    assert instance.get_run_by_id(active.run_id).tags[TERMINATED_BY_TAG] == "migrate_state"


# ---------------------------------------------------------------------------------------------
# Sensors


def test_keep_alive_sensor_restarts_a_pipeline_whose_lease_an_ended_runs_orphan_still_holds(tmp_path):
    loc = Location(tmp_path)
    ended = loc.add_run(dg.DagsterRunStatus.CANCELED, **{TERMINATED_BY_TAG: "ematix_state_migration_job"})
    with HeldLease(loc.spec, f"dagster:{ended.run_id}"):  # its step has not noticed yet: the next run fences it
        assert loc.sense().run_requests
    with HeldLease(loc.spec, "dagster:a-run-of-another-deployment"):
        assert "lease is held by" in skip_text(loc.sense())


def test_keep_alive_sensor_requests_a_run_only_when_nothing_runs_and_the_lease_is_free(tmp_path):
    loc = Location(tmp_path)
    first = loc.sense()
    assert [r.run_key for r in first.run_requests] == ["tiny-clicks:1"]
    assert first.run_requests[0].tags[PIPELINE_TAG] == "tiny-clicks"
    assert json.loads(first.cursor) == {"generation": 1}
    assert [r.run_key for r in loc.sense(cursor=first.cursor).run_requests] == ["tiny-clicks:2"]

    with HeldLease(loc.spec, "cli run"):
        text = skip_text(loc.sense())
        assert "lease is held by" in text and "run=cli run" in text
    assert loc.sense().run_requests

    active = loc.add_run(dg.DagsterRunStatus.STARTED)
    assert active.run_id in skip_text(loc.sense())
    loc.instance.report_run_canceled(active)  # (not by an operator of the migration job: stays canceled)

    # a run launched from the UI's "Materialize" has no tag yet, but selects the asset
    ui = create_run_for_test(loc.instance, job_name="__ASSET_JOB", status=dg.DagsterRunStatus.STARTING,
                             asset_selection=frozenset({loc.pipeline.key}))
    assert ui.run_id in skip_text(loc.sense())


def test_keep_alive_sensor_after_failures_cancellations_and_store_trouble(tmp_path):
    loc = Location(tmp_path)
    cv = loc.pipeline.code_version

    loc.add_run(dg.DagsterRunStatus.FAILURE, **{FAILURE_TAG: "transient", CODE_VERSION_TAG: cv})
    assert "backing off after 1 transient failure" in skip_text(loc.sense())
    loc.add_run(dg.DagsterRunStatus.FAILURE, **{FAILURE_TAG: "transient", CODE_VERSION_TAG: cv})
    assert "backing off after 2 transient failure" in skip_text(loc.sense())
    no_wait = keep_alive_sensor(loc.asset, loc.job, backoff_base_seconds=0, name="no_wait")
    context = dg.build_sensor_context(instance=loc.instance, resources={"state_store": loc.store},
                                      definitions=loc.defs)
    assert no_wait.evaluate_tick(context).run_requests

    loc.add_run(dg.DagsterRunStatus.FAILURE, **{FAILURE_TAG: "lease_held"})  # ignored: another run was active
    loc.add_run(dg.DagsterRunStatus.CANCELED, **{CODE_VERSION_TAG: cv})
    assert "canceled by an operator" in skip_text(loc.sense())
    loc.add_run(dg.DagsterRunStatus.CANCELED, **{TERMINATED_BY_TAG: "migrate_state"})
    assert loc.sense().run_requests  # the migration job terminated it: restart

    loc.add_run(dg.DagsterRunStatus.FAILURE, **{FAILURE_TAG: "terminal", CODE_VERSION_TAG: "an-older-spec"})
    assert loc.sense().run_requests  # the spec changed since: the operator acted

    unreachable = StateStoreResource(kind="postgres", url="postgresql://postgres@127.0.0.1:1/test")
    assert "cannot ask the state store" in skip_text(loc.sense(store=unreachable))


def test_a_terminal_failure_stops_the_keep_alive_sensor_and_is_reported_not_restarted(tmp_path):
    loc = Location(tmp_path)
    # A real run that fails terminally before Spark starts: an invalid store configuration.
    bad_resources = {**loc.resources, "state_store": StateStoreResource(kind="bogus")}
    failed = dg.materialize([loc.asset], instance=loc.instance, resources=bad_resources, raise_on_error=False)
    assert not failed.success
    run = loc.instance.get_run_by_id(failed.run_id)
    assert run.tags[PIPELINE_TAG] == "tiny-clicks" and run.tags[FAILURE_TAG] == "terminal"
    assert run.tags[CODE_VERSION_TAG] == loc.pipeline.code_version
    assert len(failed.get_step_failure_events()) == 1  # no retries for a terminal failure

    text = skip_text(loc.sense())
    assert "failed terminally" in text and "PipelineConfigError" in text and "operator" in text

    reports: list[str] = []
    sensor = run_failure_sensor(report=reports.append)
    failure = loc.instance.all_logs(failed.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)[0].dagster_event
    context = dg.build_run_status_sensor_context(sensor_name=sensor.name, dagster_event=failure,
                                                 dagster_instance=loc.instance, dagster_run=run).for_run_failure()
    assert sensor(context) is None  # it reports, it never requests a run
    assert len(reports) == 1
    assert "tiny-clicks" in reports[0] and "(terminal)" in reports[0] and "state store" in reports[0]
    assert failure_log_level(run) == logging.ERROR  # the operator must act

    # a second run while the lease is held fails fast (before Spark) and does not block the sensor
    with HeldLease(loc.spec, "cli run"):
        held = dg.materialize([loc.asset], instance=loc.instance, resources=loc.resources, raise_on_error=False)
    assert not held.success
    assert loc.instance.get_run_by_id(held.run_id).tags[FAILURE_TAG] == "lease_held"
    assert "failed terminally" in skip_text(loc.sense())  # still the terminal one before it


def test_a_run_that_failed_outside_its_step_is_tagged_transient_by_the_failure_sensor(tmp_path):
    from dagster._core.events import JobFailureData, RunFailureReason

    loc = Location(tmp_path)
    run = loc.add_run(dg.DagsterRunStatus.STARTED)
    # what the code server writes when a run worker is killed: no step failure, no ematix class
    failure = loc.instance.report_run_failed(run, "run worker exited", JobFailureData(
        error=None, failure_reason=RunFailureReason.UNEXPECTED_TERMINATION))
    run = loc.instance.get_run_by_id(run.run_id)
    assert FAILURE_TAG not in run.tags
    reports: list[str] = []
    sensor = run_failure_sensor(report=reports.append)
    context = dg.build_run_status_sensor_context(sensor_name=sensor.name, dagster_event=failure,
                                                 dagster_instance=loc.instance, dagster_run=run).for_run_failure()
    assert sensor(context) is None
    tags = loc.instance.get_run_by_id(run.run_id).tags
    assert (tags[FAILURE_TAG], tags["ematix/error"]) == ("transient", "UNEXPECTED_TERMINATION")
    assert "(transient)" in reports[0] and "restarts it after its backoff" in reports[0]
    assert failure_log_level(loc.instance.get_run_by_id(run.run_id)) == logging.WARNING  # restarted: a warning
    assert failure_log_level(run) == logging.ERROR  # before the sensor classified it
    assert "backing off after 1 transient failure" in skip_text(loc.sense())


def test_a_failing_blocking_check_stops_the_start_with_its_explanation(tmp_path):
    loc = Location(tmp_path)
    # the store says batch 3, its watermark an hour old, but there is no checkpoint
    commit_state(loc.spec, batch_id=3, watermark_us=int((time.time() - 3600) * 1e6),
                 counters={"rows_consumed:clicks": 100, "late_rows_dropped": 0})
    result = dg.materialize([loc.asset], instance=loc.instance, resources=loc.resources, raise_on_error=False)
    assert not result.success
    # every check was evaluated from the store before the start: none is left planned ("Running")
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {"checkpoint_consistency", "idempotent_target", "late_row_ratio", "watermark_lag"}
    assert not evaluations["checkpoint_consistency"].passed
    assert "checkpoint_missing" in evaluations["checkpoint_consistency"].description
    assert evaluations["late_row_ratio"].passed and not evaluations["watermark_lag"].passed
    # the step failed terminally, with the check's explanation, and was not retried
    failures = result.get_step_failure_events()
    assert len(failures) == 1
    text = failures[0].step_failure_data.user_failure_data.description
    assert "the checkpoint_consistency check failed, so the pipeline does not start" in text
    assert "checkpoint_missing" in text and "(terminal: the operator must act" in text
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert loc.instance.get_run_by_id(result.run_id).tags[FAILURE_TAG] == "terminal"
    assert result.asset_materializations_for_node(loc.asset.op.name) == []
