"""Helpers for the Dagster tests: small specs and hand-built states in a real SQLite store."""

from __future__ import annotations

from pathlib import Path

from ematix_dagster.fingerprint import fingerprint, fingerprint_doc
from ematix_dagster.spec import Aggregation, PipelineSpec, Run, Source, StateStore, Target, Window
from ematix_dagster.stores import make_store
from state_store.base import BatchCommit, PipelineRecord, SourceProgress, make_holder
from state_store.codec import STATE_VERSION


def small_spec(tmp_path: Path, name: str = "tiny-clicks", *, target: Target | None = None,
               trigger: str = "available_now", store: StateStore | None = None) -> PipelineSpec:
    """A one-source tumbling pipeline whose every path lives under ``tmp_path``."""
    (tmp_path / "in").mkdir(parents=True, exist_ok=True)
    return PipelineSpec(
        pipeline_name=name,
        sources=(Source(name="clicks", kind="files", format="parquet", path=str(tmp_path / "in"),
                        schema="user_id BIGINT, amount DOUBLE, ts TIMESTAMP", event_time_column="ts",
                        max_files_per_trigger=1),),
        window=Window(kind="tumbling", duration_ms=60_000, group_by=("user_id",), max_groups_per_window=1_000,
                      aggregations=(Aggregation(agg="count", as_="clicks"),)),
        target=target or Target(kind="parquet", path=str(tmp_path / "out")),
        state_store=store or StateStore(kind="sqlite", path=str(tmp_path / "state.db")),
        run=Run(trigger=trigger, checkpoint_location=str(tmp_path / "checkpoint")),
    ).validate()


def commit_state(spec: PipelineSpec, *, batch_id: int = 3, watermark_us: int | None = None,
                 counters: dict[str, int] | None = None, upserts: list[tuple[int, bytes, bytes]] | None = None,
                 state_version: int = STATE_VERSION) -> None:
    """Write one committed batch for ``spec`` straight into its store (no Spark)."""
    doc = fingerprint_doc(spec)
    record = PipelineRecord(
        pipeline=spec.pipeline_name, state_version=state_version, query_id="query-0", last_batch_id=batch_id,
        fingerprint=fingerprint(doc), fingerprint_doc=doc, watermark=watermark_us,
        sources={"clicks": SourceProgress(max_event_ts=watermark_us, last_arrival=watermark_us)},
        counters=dict(counters or {}), emitted=[], offsets={"clicks": '{"logOffset": %d}' % batch_id})
    store = make_store(spec.state_store)
    store.open()
    try:
        store.acquire_lease(spec.pipeline_name, make_holder("test setup"))
        store.commit(BatchCommit(record=record, upserts=list(upserts or [])))
        store.release_lease(spec.pipeline_name)
    finally:
        store.close()


class HeldLease:
    """Holds a pipeline's lease from another store object (as a run outside Dagster would)."""

    def __init__(self, spec: PipelineSpec, label: str = "cli run") -> None:
        self.spec = spec
        self.store = make_store(spec.state_store)
        self.label = label

    def __enter__(self) -> "HeldLease":
        self.store.open()
        self.store.acquire_lease(self.spec.pipeline_name, make_holder(self.label))
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()
