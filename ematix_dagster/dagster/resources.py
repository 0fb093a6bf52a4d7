"""Dagster resources: Spark, the state store and metrics (docs/dagster.md, docs/contract/operations.md).

Constructing or loading these resources starts no Spark session and opens no database
connection: the Spark session is created when a step first asks for it, and the store is opened
by the pipeline run (or by a sensor, check or op) only for the moment it needs it.

This module must not use ``from __future__ import annotations``: Dagster resolves the
annotations of ``Config`` / ``ConfigurableResource`` fields at class creation.
"""

import logging
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr

from ematix_dagster.spec import STATE_STORE_KINDS, PipelineSpec, StateStoreConfig, with_overrides

log = logging.getLogger("ematix_dagster")

#: Resource keys the pipeline assets, checks, sensors and ops expect.
SPARK_KEY = "spark"
STATE_STORE_KEY = "state_store"
METRICS_KEY = "metrics"


class EmatixSparkResource(LazyPySparkResource):
    """dagster-pyspark's ``LazyPySparkResource`` with local, loopback-bound defaults and a real teardown.

    As in ``LazyPySparkResource``, the session is created on the first access to
    :attr:`spark_session` inside a step (so a checks or migration run never starts a JVM); this
    resource builds it with ematix's settings (:func:`ematix_dagster.spark.spark_session.get_spark`).
    When a SparkSession is already active in the process (a test session, a notebook) it is reused
    and never stopped. A session this resource created is stopped after the step, together with
    any streaming query still active in it (dagster-pyspark never stops its session).

    >>> EmatixSparkResource().master
    'local[2]'
    """

    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra Spark settings; they override ematix's defaults (driver bound to 127.0.0.1, UI off, "
                    "UTC, 2 shuffle partitions).",
    )
    master: str = Field(default="local[2]", description="Spark master URL for a session this resource creates.")
    app_name: str = Field(default="ematix-dagster", description="Spark application name.")

    _created: bool = PrivateAttr(default=False)

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    def _init_session(self) -> None:
        if self._spark_session is not None:
            return
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        existing = SparkSession.getActiveSession()
        if existing is None and SparkContext._active_spark_context is not None:
            existing = SparkSession.builder.getOrCreate()  # no options: returns the running session
        if existing is not None:
            self._spark_session, self._created = existing, False
        else:
            from ematix_dagster.spark.spark_session import get_spark

            self._spark_session = get_spark(self.app_name, self.master, dict(self.spark_config))
            self._created = True

    @property
    def created_session(self) -> bool:
        """True when this resource started the session (and so will stop it)."""
        return self._created

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        session, created = self._spark_session, self._created
        self._spark_session, self._created = None, False
        if session is None or not created:
            return
        for query in list(session.streams.active):
            try:
                query.stop()
            except Exception as exc:  # noqa: BLE001 - stopping the session below ends it anyway
                log.warning("stopping streaming query %s failed: %s", query.name, exc)
        session.stop()


class StateStoreResource(dg.ConfigurableResource):
    """Where window state lives; overrides a pipeline's ``[state_store]`` when ``kind`` is set.

    ``kind = None`` keeps each pipeline's own ``[state_store]``. PostgreSQL for production
    (``url`` from ``dg.EnvVar``, never logged: only the store's ``description`` is shown), SQLite
    and in-memory for local use. One store may hold many pipelines (rows are keyed by name).

    >>> StateStoreResource(kind="sqlite", path=".ematix/state.db").state_store_spec()
    StateStoreConfig(kind='sqlite', path='.ematix/state.db', schema=None, checkpoint_interval_ms=None)
    """

    kind: Optional[str] = Field(default=None, description="in_memory | sqlite | postgres; None keeps the spec's")
    path: Optional[str] = Field(default=None, description="SQLite database file")
    url: Optional[str] = Field(default=None, description="PostgreSQL URL; pass dg.EnvVar('EMATIX_STATE_URL')")
    db_schema: Optional[str] = Field(default=None, description="PostgreSQL schema (default ematix)")

    def state_store_spec(self) -> Optional[StateStoreConfig]:
        """The ``[state_store]`` dataclass this resource stands for (None: keep the spec's)."""
        if self.kind is None:
            return None
        if self.kind not in STATE_STORE_KINDS:
            from ematix_dagster.errors import PipelineConfigError

            raise PipelineConfigError("resources.state_store.kind", f"unknown state store {self.kind!r}",
                                      'use "in_memory", "sqlite" or "postgres"')
        cfg = StateStoreConfig(kind=self.kind,
                               path=(self.path or ".ematix/state.db") if self.kind == "sqlite" else None,
                               url=self.url if self.kind == "postgres" else None,
                               schema=self.db_schema if self.kind == "postgres" else None)
        cfg.validate("resources.state_store")
        return cfg

    def apply(self, spec: PipelineSpec) -> PipelineSpec:
        """``spec`` with this resource's store in place of its ``[state_store]``."""
        cfg = self.state_store_spec()
        return spec if cfg is None or cfg == spec.state_store else with_overrides(spec, state_store=cfg)

    @contextmanager
    def open_store(self, spec: PipelineSpec) -> Iterator[Any]:
        """The opened store of ``spec`` (as loaded; after :meth:`apply`), closed on exit."""
        from ematix_dagster.stores import make_store

        store = make_store(self.apply(spec).resolved().state_store)
        store.open()
        try:
            yield store
        finally:
            store.close()

    def lease_holder(self, spec: PipelineSpec) -> Optional[str]:
        """Who holds the pipeline's lease (None: free). The lease is the truth for "is it running"."""
        with self.open_store(spec) as store:
            return store.lease_holder(spec.pipeline_name)

    def description(self, spec: PipelineSpec) -> str:
        from ematix_dagster.stores import make_store

        return make_store(self.apply(spec).resolved().state_store).description


class MetricsResource(dg.ConfigurableResource):
    """Prometheus metrics of pipeline runs: served on 127.0.0.1:``port``, or kept off.

    ``enabled = False`` records into a private registry that nothing serves (and ignores a
    pipeline's ``metrics_port``); ``port = None`` keeps the pipeline's own ``metrics_port``.
    """

    enabled: bool = Field(default=True, description="False: no Prometheus endpoint")
    port: Optional[int] = Field(default=None, description="Port on 127.0.0.1; None keeps the spec's metrics_port")

    def apply(self, spec: PipelineSpec) -> PipelineSpec:
        if not self.enabled:
            return spec if spec.metrics_port is None else with_overrides(spec, metrics_port=None)
        if self.port is not None and self.port != spec.metrics_port:
            return with_overrides(spec, metrics_port=self.port)
        return spec

    def streaming_metrics(self) -> Any:
        from ematix_dagster.metrics import StreamingMetrics, default_metrics

        if not self.enabled:
            from prometheus_client import CollectorRegistry

            return StreamingMetrics(CollectorRegistry())
        return default_metrics()


__all__ = ["EmatixSparkResource", "METRICS_KEY", "MetricsResource", "SPARK_KEY", "STATE_STORE_KEY",
           "StateStoreResource"]
