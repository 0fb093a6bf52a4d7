"""Fixtures of the e2e tests beside those of ``tests/conftest.py``."""

from __future__ import annotations

# One Spark standalone cluster (a master and two workers) for every test of the session that asks
# for it: defined here, not imported into each module, so that the modules share one.
from tests.spark_cluster import spark_cluster_fixture  # noqa: F401 - a fixture
