"""Shared fixtures: one local SparkSession per test session, a real PostgreSQL, file helpers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pytest

from tests.jvm_options import ClassArchive
from tests.pg import drop_schema, ensure_postgres, fresh_schema

_ARCHIVE = pytest.StashKey[ClassArchive]()


def pytest_configure(config: pytest.Config) -> None:
    """The JVM options of every Spark driver the tests start (``tests/jvm_options.py``); xdist's workers
    inherit the controller's."""
    if "SPARK_SUBMIT_OPTS" not in os.environ:
        archive = config.stash[_ARCHIVE] = ClassArchive()
        os.environ["SPARK_SUBMIT_OPTS"] = archive.spark_submit_opts()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _ARCHIVE in config.stash:
        config.stash[_ARCHIVE].close()


#: Modules that share one server, one fixed table or a costly start, so that their tests run on one worker
SHARED_GROUPS = {
    "tests/e2e/test_spark_cluster.py": "spark_cluster",  # spark_cluster_fixture: one cluster per session
    "tests/e2e/test_executor_state_on_cluster.py": "spark_cluster",
    "tests/e2e/test_dagster_graphql.py": "clicks_table",  # both write the example's public.user_clicks_1min
    "tests/e2e/test_dagster_crash_restart.py": "clicks_table",
    # Spark starts its Python workers for the redis_stream source once per driver (8 s on 2 cores)
    "tests/e2e/test_redis_failures.py": "redis_source",
    "tests/e2e/test_redis_stream.py": "redis_source",
    "tests/e2e/test_redis_resume.py": "redis_source",
}


#: The modules (or groups) of over 10 s with few tests, longest first (a whole run on two workers: 299 s
#: for the first). They start first, so that short modules, not one long module, end the run.
LONGEST_FIRST = (
    "tests/airflow/test_airflow_server.py",
    "tests/e2e/test_crash_recovery.py",
    "clicks_table",
    "spark_cluster",
    "tests/e2e/test_row_crashes.py",
    "tests/e2e/test_executor_crashes.py",
    "tests/e2e/test_pg_outage.py",
    "tests/spark/test_executor_plan.py",
    "tests/e2e/test_emit_sql_crashes.py",
    "tests/e2e/test_emit_trigger_crashes.py",
    "redis_source",
    "tests/e2e/test_redis_crash.py",
    "tests/spark/test_executor_state_spike.py",
    "tests/e2e/test_quiet_cli.py",
    "tests/spark/test_executor_input.py",
    "tests/e2e/test_backfill.py",
    "tests/e2e/test_executor_mode.py",
)


def _scope(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return SHARED_GROUPS.get(module, module)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``LONGEST_FIRST`` first, then the other modules by their number of tests (xdist's own order)."""
    sizes: dict[str, int] = {}
    for item in items:
        sizes[_scope(item.nodeid)] = sizes.get(_scope(item.nodeid), 0) + 1

    def rank(item: pytest.Item) -> tuple[int, int]:
        scope = _scope(item.nodeid)
        return (LONGEST_FIRST.index(scope) if scope in LONGEST_FIRST else len(LONGEST_FIRST), -sizes[scope])

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist (``scripts/test.sh`` runs three workers) hands out whole modules, each to one worker.

    A module's module-scoped fixtures (a pipeline run, a server) then run once and not once per
    worker, and its tests keep their order; ``SHARED_GROUPS`` joins the modules that share more.
    Modules go out in collection order (``pytest_collection_modifyitems``): xdist's own order (the most
    tests first) alone left the long whole-process modules, a few tests each, to the end.
    """
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return ModuleScheduling(config, log)


@pytest.fixture(scope="session")
def spark():
    from ematix_dagster.spark.spark_session import get_spark

    session = get_spark("ematix-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The machine's Redis when it answers, else a server of the test session's own."""
    from tests.redis_server import MACHINE_URL, OwnRedis, answers

    if answers(MACHINE_URL):
        yield MACHINE_URL
        return
    server = OwnRedis().start()
    yield server.url
    server.close()


@pytest.fixture
def own_redis() -> Iterator:
    """A Redis server the test may stop, restart or give a password (``own_redis(password=...)``)."""
    from tests.redis_server import OwnRedis

    servers: list[OwnRedis] = []

    def make(password: str | None = None) -> OwnRedis:
        servers.append(OwnRedis(password).start())
        return servers[-1]

    yield make
    for server in servers:
        server.close()


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    return ensure_postgres()


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    name = fresh_schema(pg_dsn, "t")
    yield name
    drop_schema(pg_dsn, name)


class BatchFiles:
    """Writes one file per intended micro-batch, atomically and with strictly increasing mtimes.

    Spark's file source orders files by modification time, so with ``max_files_per_trigger = 1``
    file i is exactly micro-batch i (checked against the checkpoint's ``sources/`` log in tests).
    """

    def __init__(self, directory: Path, fmt: str = "parquet") -> None:
        self.directory = directory
        self.fmt = fmt
        self.count = 0
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, rows: list[dict] | pa.Table | str, schema: pa.Schema | None = None) -> Path:
        name = f"part-{self.count:05d}.{self.fmt}"
        tmp = self.directory / f".{name}.tmp"
        final = self.directory / name
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows, schema=schema)
            pq.write_table(table, tmp)
        else:
            assert isinstance(rows, str), "json/csv batches are given as raw text"
            tmp.write_text(rows)
        os.replace(tmp, final)
        mtime = 1_700_000_000 + self.count
        os.utime(final, (mtime, mtime))
        self.count += 1
        return final


@pytest.fixture
def batch_files(tmp_path: Path):
    def make(name: str = "in", fmt: str = "parquet") -> BatchFiles:
        return BatchFiles(tmp_path / name, fmt)

    return make
