"""The Airflow integration's parts without a running Airflow: the output position read from a real
SQLite store, credentials from a Connection, the Assets' URIs, the failure mapping, the lease take-over
rule, and the layering (nothing of ``ematix_dagster.dagster``)."""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from ematix_dagster.errors import LeaseHeld, LeaseLost, PipelineConfigError, StoreUnavailable
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.spec.emit import EmitRelease
from state_store.contract import BatchCommit, PendingRow, make_holder
from tests.dagster_support import commit_state, small_spec

ROOT = Path(__file__).resolve().parents[2]
MINUTE = 60_000_000


def test_position_of_a_windowed_pipeline_is_its_watermark(tmp_path: Path) -> None:
    from ematix_dagster.airflow.watermark import output_position

    spec = small_spec(tmp_path)
    assert output_position(spec).watermark is None
    assert not output_position(spec).complete_until(0)
    commit_state(spec, batch_id=4, watermark_us=10 * MINUTE)
    position = output_position(spec)
    assert (position.last_batch_id, position.watermark, position.output_watermark) == (4, 10 * MINUTE, 10 * MINUTE)
    assert position.complete_until(10 * MINUTE - 1) and not position.complete_until(10 * MINUTE)
    assert "source" in position.describe(11 * MINUTE) and "60.000 s behind" in position.describe(11 * MINUTE)


def test_rows_held_back_keep_the_stored_output_watermark_behind(tmp_path: Path) -> None:
    """The sensor reads the output watermark the commit stored (schema step 11): with a row held from 6 min
    the record's watermark (10 min) is not enough; once the row is released it is."""
    from ematix_dagster.airflow.watermark import output_position
    from ematix_dagster.stores import make_store

    spec = dataclasses.replace(small_spec(tmp_path), emit=EmitRelease(sql="SELECT * FROM windows"))
    commit_state(spec, batch_id=2, watermark_us=10 * MINUTE)
    held = PendingRow(release_us=70 * MINUTE, arrival_batch=3, seq=0, event_ts=6 * MINUTE, payload=b"x")

    def commit(batch_id: int, **changes: list) -> None:
        store = make_store(spec.state_store)
        with store:
            store.acquire_lease(spec.pipeline_name, make_holder("test"))
            record = store.load(spec.pipeline_name, groups=False).record
            assert record is not None
            record.last_batch_id = batch_id
            store.commit(BatchCommit(record=record, **changes))
            store.release_lease(spec.pipeline_name)

    commit(3, pending_inserts=[held])
    position = output_position(spec)
    assert (position.last_batch_id, position.watermark, position.output_watermark) == (3, 10 * MINUTE, 6 * MINUTE)
    assert position.held_back and position.complete_until(6 * MINUTE - 1)
    assert not position.complete_until(6 * MINUTE)  # the held window ends there: not in the target yet
    assert "held back in the state store" in position.describe(8 * MINUTE)
    assert position.as_dict()["output_watermark"].startswith("1970-01-01T00:06:00")
    commit(4, pending_released=[held.key])
    assert output_position(spec).output_watermark == 10 * MINUTE and output_position(spec).complete_until(8 * MINUTE)


def test_connection_url_and_a_pipeline_loaded_with_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ematix_dagster.airflow.connection import load_with_values, postgres_url

    conn = SimpleNamespace(login="etl", password='p@ss "word', host="db.local", port=5433, schema="analytics",
                           extra_dejson={"sslmode": "require"})
    url = postgres_url(conn)
    assert url == "postgresql://etl:p%40ss%20%22word@db.local:5433/analytics?sslmode=require"
    monkeypatch.delenv("EMATIX_PG_URL", raising=False)
    path = ROOT / "pipelines" / "clicks_per_minute.toml"
    spec = load_with_values(path, {"EMATIX_PG_URL": url})
    assert spec.target.url == url and "EMATIX_PG_URL" not in os.environ
    with pytest.raises(PipelineConfigError, match="EMATIX_PG_URL"):
        load_with_values(path, {})


def test_asset_uris_name_no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ematix_dagster.airflow.assets import read_doc, source_uris, target_uri

    path = ROOT / "pipelines" / "clicks_per_minute.toml"
    monkeypatch.delenv("EMATIX_PG_URL", raising=False)
    assert target_uri(read_doc(path)) == "postgres://ematix/clicks-per-minute/public/user_clicks_1min"
    monkeypatch.setenv("EMATIX_PG_URL", "postgresql://etl:secret@db.local:5433/analytics")
    assert target_uri(read_doc(path)) == "postgres://db.local:5433/analytics/public/user_clicks_1min"
    assert source_uris(read_doc(path), ROOT) == [(ROOT / ".ematix/data/clicks").as_uri()]
    spec = small_spec(tmp_path)
    assert target_uri(spec) == (tmp_path / "out").as_uri()


def test_failures_map_onto_airflow_outcomes() -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

    from ematix_dagster.airflow.operators import failure

    held = LeaseHeld("lease held")
    held.holder = "host=h pid=1 run=cli since=now"
    skipped = failure(held, "p")
    assert isinstance(skipped, AirflowSkipException) and "run=cli" in str(skipped)
    assert isinstance(failure(LeaseLost("taken"), "p"), AirflowFailException)
    bad = failure(PipelineConfigError("transform.window.lateness_ms", "-5 is negative", "use >= 0"), "p")
    assert isinstance(bad, AirflowFailException) and "transform.window.lateness_ms" in str(bad)
    transient = failure(StoreUnavailable("database restarting"), "p")
    assert type(transient) is AirflowException and "transient" in str(transient)


def test_a_retry_takes_the_lease_over_from_an_earlier_try_only() -> None:
    from ematix_dagster.airflow.operators import earlier_try, lease_label

    def context(try_number: int, run_id: str = "manual__1") -> dict:
        return {"ti": SimpleNamespace(dag_id="d", task_id="t", run_id=run_id, try_number=try_number)}

    old = make_holder(lease_label(context(1)))
    assert earlier_try(context(2))(old)
    assert not earlier_try(context(1))(old)  # itself, or a concurrent duplicate: refused
    assert not earlier_try(context(2, "manual__2"))(old)  # another DAG run
    assert not earlier_try(context(2))(make_holder("cli run")) and not earlier_try(context(2))(None)


def test_airflow_package_imports_nothing_of_the_dagster_integration() -> None:
    for path in (ROOT / "ematix_dagster" / "airflow").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("ematix_dagster.dagster", "dagster")), f"{path.name} imports {name}"


def test_sensor_parses_rendered_interval_ends() -> None:
    from ematix_dagster.airflow.sensors import until_us

    assert until_us("1970-01-01 00:01:00+00:00") == MINUTE
    assert until_us("1970-01-01T01:00:00+01:00") == 0
    assert until_us("1970-01-01T00:00:01") == 1_000_000


def _toml(tmp_path: Path) -> tuple[Path, PipelineSpec]:
    from ematix_dagster.spec import dump_pipeline

    spec = small_spec(tmp_path)
    path = tmp_path / "pipeline.toml"
    path.write_text(dump_pipeline(spec))
    return path, spec


def _context(try_number: int = 1) -> dict:
    return {"ti": SimpleNamespace(dag_id="d", task_id="t", run_id="manual__1", try_number=try_number)}


def test_check_operator_reports_each_check_and_fails_on_a_diverged_checkpoint(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from ematix_dagster.airflow import EmatixCheckOperator

    path, spec = _toml(tmp_path)
    op = EmatixCheckOperator(task_id="check", pipeline=str(path), max_watermark_lag_seconds=600)
    results = op.execute(_context())
    assert results["checkpoint_consistency"]["passed"] and results["late_row_ratio"]["passed"]
    assert not results["watermark_lag"]["passed"]  # no watermark stored yet: a warning, not a failure
    commit_state(spec, batch_id=3, watermark_us=10 * MINUTE,
                 counters={"rows_consumed:clicks": 100, "late_rows_dropped": 5})
    with pytest.raises(AirflowFailException, match="checkpoint_consistency"):
        op.execute(_context())


def test_a_held_lease_skips_the_run_and_the_migration_naming_the_holder(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from ematix_dagster.airflow import EmatixMigrateOperator, EmatixRunOperator
    from tests.dagster_support import HeldLease

    path, spec = _toml(tmp_path)
    with HeldLease(spec, "cli run"):
        for op in (EmatixRunOperator(task_id="run", pipeline=str(path)),
                   EmatixMigrateOperator(task_id="migrate", pipeline=str(path))):
            with pytest.raises(AirflowSkipException, match="run=cli run"):
                op.execute(_context(2))


def test_backfill_operator_refuses_an_empty_interval(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from ematix_dagster.airflow import EmatixBackfillOperator

    path, _ = _toml(tmp_path)
    op = EmatixBackfillOperator(task_id="backfill", pipeline=str(path), start="2026-01-02 00:00:00+00:00",
                                end="2026-01-02T00:00:00+00:00")
    with pytest.raises(AirflowFailException, match="CronDataIntervalTimetable"):
        op.execute(_context())
