"""Every failure an operator meets is an EmatixError with the right ``terminal`` flag and its cause named.

One table row per failure: what is injected, for real (a port another socket holds, a lease another
store object holds, a role the server does not know, a port nothing listens on, stored state and
checkpoint files corrupted on disk after a real run, a Spark job that fails), the class expected,
whether it is terminal, and the words the message must contain (and the secret it must not).
Failures that must happen before Spark starts get a Spark factory that fails the test if called.
"""

from __future__ import annotations

import shutil
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pytest
from prometheus_client import CollectorRegistry

from ematix_dagster import errors
from ematix_dagster.cli import main
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.failures.classify import classify
from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spec import load_pipeline_str
from state_store.sqlite import SqliteStateStore
from tests.conftest import BatchFiles
from tests.e2e.lateness_helpers import at, row
from tests.pipeline_toml import postgres_store, postgres_target, windowed_pipeline_toml

SECRET = "s3cret-pw"


def _toml(tmp: Path, *, target: dict[str, Any] | None = None, state: dict[str, Any] | None = None,
          extra: dict[str, Any] | None = None) -> str:
    """A parquet target in ``tmp/out`` and a SQLite store in ``tmp/state.db`` unless given; count and avg."""
    aggregations = [{"agg": "count", "as": "n"}, {"agg": "avg", "column": "v", "as": "mean"}]
    return windowed_pipeline_toml("failures", tmp, aggregations=aggregations, target=target, state_store=state,
                                  extra=extra)


def _no_spark():
    pytest.fail("Spark was started although the run had to be refused before it")


def _runner(spec, spark=_no_spark, lines: list[str] | None = None) -> PipelineRunner:
    return PipelineRunner(spec, spark=spark, metrics=StreamingMetrics(CollectorRegistry()),
                          progress=(lines.append if lines is not None else (lambda _line: None)))


@pytest.fixture(scope="module")
def committed(tmp_path_factory, spark) -> Path:
    """A pipeline that ran two batches for real: its input, state store and checkpoint."""
    tmp = tmp_path_factory.mktemp("committed")
    files = BatchFiles(tmp / "in")
    for b in range(2):
        files.write([row(10 * b + i, f"k{i % 2}", i, at(b, 10 * i)) for i in range(4)])
    summary = _runner(load_pipeline_str(_toml(tmp)), spark=spark).run()
    assert summary.batches == 2
    return tmp


def _copy(committed: Path, tmp: Path) -> Path:
    """A copy of the committed pipeline whose paths point into ``tmp``."""
    for name in ("in", "cp", "state.db"):
        src = committed / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp / name)
    return tmp


def _sql(tmp: Path, statement: str) -> None:
    with sqlite3.connect(tmp / "state.db") as conn:
        conn.execute(statement)


@dataclass(frozen=True)
class Case:
    id: str
    inject: Callable[[Path, Path, object], Callable[[], object]]  # (tmp, committed, spark) -> failing call
    cls: type[errors.EmatixError]
    terminal: bool
    words: tuple[str, ...]


def _metrics_port_in_use(tmp, _committed, _spark):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    (tmp / "in").mkdir()
    spec = load_pipeline_str(_toml(tmp, extra={"metrics_port": port}))
    _metrics_port_in_use.port = port  # type: ignore[attr-defined]

    def call():
        try:
            return _runner(spec).run()
        finally:
            sock.close()
    return call


def _lease_held(tmp, _committed, _spark):
    (tmp / "in").mkdir()
    spec = load_pipeline_str(_toml(tmp))
    other = SqliteStateStore(str(tmp / "state.db"))
    other.open()
    other.acquire_lease("failures", "host=elsewhere pid=4242 run=first")

    def call():
        try:
            return _runner(spec).run()
        finally:
            other.close()
    return call


def _store_login_refused(tmp, _committed, _spark):
    (tmp / "in").mkdir()
    state = postgres_store(f"postgresql://nosuchrole:{SECRET}@127.0.0.1:5432/test")
    spec = load_pipeline_str(_toml(tmp, state=state))
    return lambda: _runner(spec).run()


def _store_unreachable(tmp, _committed, _spark):
    (tmp / "in").mkdir()
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    state = postgres_store(f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/test?connect_timeout=2")
    spec = load_pipeline_str(_toml(tmp, state=state))
    return lambda: _runner(spec).run()


def _target_login_refused(tmp, committed, spark):
    _copy(committed, tmp)
    target = postgres_target(f"postgresql://nosuchrole:{SECRET}@127.0.0.1:5432/test", "public.failures_target")
    spec = load_pipeline_str(_toml(tmp, target=target))
    return lambda: _runner(spec, spark=spark).run()


def _blob_wrong_shape(tmp, committed, spark):
    _copy(committed, tmp)
    from state_store.segments import decode_segment, encode_segment

    with sqlite3.connect(tmp / "state.db") as conn:
        seq, blob = conn.execute("SELECT seq, blob FROM ematix_streaming_segments ORDER BY seq LIMIT 1").fetchone()
        segment = decode_segment(blob, "the committed run's base segment")
        assert len(segment.keys), "the committed run keeps an open window"
        bad = replace(segment, accs=[["not a count"] * len(segment.keys), [(1.0,)] * len(segment.keys)])
        conn.execute("UPDATE ematix_streaming_segments SET blob = ? WHERE seq = ?",  # decodes, but no (count, avg) state
                     (encode_segment(bad), seq))
    # The shape depends on Spark's column types (integer or float sums): checked once the query is analysed.
    return lambda: _runner(load_pipeline_str(_toml(tmp)), spark=spark).run()


def _counters_not_json(tmp, committed, _spark):
    _copy(committed, tmp)
    _sql(tmp, "UPDATE ematix_streaming_pipelines SET counters = '{not json'")
    return lambda: _runner(load_pipeline_str(_toml(tmp))).run()


def _offsets_garbage(tmp, committed, _spark):
    _copy(committed, tmp)
    (tmp / "cp" / "offsets" / "1").write_text("garbage\n")
    return lambda: _runner(load_pipeline_str(_toml(tmp))).run()


def _spark_job_fails(_tmp, _committed, spark):
    def call():
        try:
            spark.sql("SELECT CAST('abc' AS BIGINT) AS x").collect()
        except Exception as exc:  # noqa: BLE001 - the real Spark error is what is classified
            raise classify(exc, "failures") from exc
    return call


def _unknown_error(_tmp, _committed, _spark):
    def call():
        try:
            {}["missing"]
        except KeyError as exc:
            raise classify(exc, "failures") from exc
    return call


CASES = [
    Case("metrics-port-in-use", _metrics_port_in_use, errors.PipelineConfigError, True,
         ("metrics_port", "127.0.0.1:", "pick a free port")),
    Case("lease-held-before-spark", _lease_held, errors.LeaseHeld, True, ("failures", "pid=4242")),
    Case("state-store-login-refused", _store_login_refused, errors.StoreAccessDenied, True,
         ("127.0.0.1:5432/test", "nosuchrole", "refused the login")),
    Case("state-store-unreachable", _store_unreachable, errors.StoreUnavailable, False, ("127.0.0.1:",)),
    Case("target-login-refused", _target_login_refused, errors.TargetError, True,
         ("failures_target", "127.0.0.1:5432/test", "nosuchrole")),
    Case("state-blob-wrong-shape", _blob_wrong_shape, errors.CorruptState, True, ("failures", "window")),
    Case("counters-not-json", _counters_not_json, errors.CorruptState, True, ("failures", "counters")),
    Case("offsets-garbage", _offsets_garbage, errors.CorruptCheckpoint, True, ("offsets", "reset")),
    Case("spark-job-fails", _spark_job_fails, errors.SparkQueryFailed, False, ("CAST_INVALID_INPUT",)),
    Case("unexpected-error", _unknown_error, errors.UnexpectedError, True, ("KeyError", "missing")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_failure_is_classified_and_names_its_cause(case: Case, tmp_path, committed, spark):
    call = case.inject(tmp_path, committed, spark)
    with pytest.raises(errors.EmatixError) as info:
        call()
    exc = info.value
    assert type(exc) is case.cls, f"{type(exc).__name__}: {exc}"
    assert exc.terminal is case.terminal
    text = str(exc)
    for word in case.words:
        assert word in text, f"{word!r} missing from: {text}"
    if case.id == "metrics-port-in-use":
        assert str(_metrics_port_in_use.port) in text  # type: ignore[attr-defined]
    assert SECRET not in text


def test_password_written_in_the_toml_is_warned_about_without_showing_it(tmp_path, pg_schema, spark, capsys):
    (tmp_path / "in").mkdir()
    state = postgres_store(f"postgresql://postgres:{SECRET}@127.0.0.1:5432/test", pg_schema)
    toml = tmp_path / "p.toml"
    toml.write_text(_toml(tmp_path, state=state))
    assert main(["validate", str(toml)]) == 0
    err = capsys.readouterr().err
    assert "warning: state_store.url" in err and "environment variable" in err, err
    assert SECRET not in err


def test_cleanup_errors_never_replace_the_original(tmp_path):
    """The runner closes what it opened after a failure; a failing close is a warning, not the error."""
    (tmp_path / "in").mkdir()
    spec = load_pipeline_str(_toml(tmp_path))

    def broken(_pipeline: str) -> None:
        raise OSError("the database went away too")

    for failure in (errors.TargetError("the commit failed"), None):
        lines: list[str] = []
        runner = _runner(spec, lines=lines)
        runner._preflight()
        store = runner.store
        release = store.release_lease
        store.release_lease = broken  # the store is real; only its release fails, as with a dropped server
        try:
            if failure is not None:
                runner._close_resources(failure=failure)
                assert any("cleanup after the error failed too" in line and "went away" in line for line in lines)
            else:  # without an original error, a cleanup failure is reported as itself
                with pytest.raises(OSError, match="went away"):
                    runner._close_resources()
        finally:
            store.open()
            release("failures")
            store.close()


def test_a_run_whose_lease_is_taken_over_stops_without_committing(tmp_path, spark, monkeypatch):
    """A replacement run fences this one while its batch 1 is between the target write and the commit:
    the commit is refused whole, the run ends with that LeaseLost (not wrapped), and says so in one line."""
    tmp = tmp_path
    files = BatchFiles(tmp / "in")
    for b in range(2):
        files.write([row(10 * b + i, f"k{i % 2}", i, at(b, 10 * i)) for i in range(4)])
    monkeypatch.setenv("EMATIX_FAULT_DIR", str(tmp / "faults"))
    monkeypatch.setenv("EMATIX_FAULT_PAUSE", "target_write:1")
    lines: list[str] = []
    runner = _runner(load_pipeline_str(_toml(tmp)), spark=spark, lines=lines)
    ended: list[BaseException] = []

    def run() -> None:
        try:
            runner.run()
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            ended.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    paused, deadline = tmp / "faults" / "target_write-1.paused", time.monotonic() + 120
    while not paused.exists():
        assert thread.is_alive() and time.monotonic() < deadline, ended
        time.sleep(0.1)
    taker = SqliteStateStore(str(tmp / "state.db"))
    try:
        with pytest.raises(errors.LeaseHeld, match="fenced at epoch 2"):  # the paused run keeps its lock
            taker.acquire_lease("failures", "host=elsewhere pid=4242 run=replacement", take_over=lambda _h: True,
                                take_over_wait_s=0.1)
        (tmp / "faults" / "target_write-1.resume").write_text("")
        thread.join(120)
        assert not thread.is_alive()
        [lost] = ended
        assert type(lost) is errors.LeaseLost and lost.terminal and lost.batch == 1, repr(lost)
        assert "run=replacement" in str(lost) and "batch 1 was not committed" in str(lost)
        assert classify(lost, "failures") is lost
        assert [line for line in lines if "lease was taken over" in line] == [
            "[failures] the lease was taken over by host=elsewhere pid=4242 run=replacement: this run stops "
            "without committing batch 1"]
        assert taker.load("failures").record.last_batch_id == 0
        taker.acquire_lease("failures", "host=elsewhere pid=4242 run=replacement")  # the stopped run let go
        assert taker.lease_epoch("failures") == 3
    finally:
        taker.close()
