"""From ``[state_store]`` to a StateStore, and the guarantee a pipeline gets (docs/contract/targets-and-guarantees.md)."""

from __future__ import annotations

from ematix_dagster.spec import PipelineSpec, StateStoreConfig
from state_store import create_store
from state_store.contract import StateStore

DEFAULT_SQLITE_PATH = ".ematix/state.db"


def make_store(cfg: StateStoreConfig) -> StateStore:
    """The configured store, not yet opened (opening connects; constructing does not).

    ``cfg`` comes from :meth:`PipelineSpec.resolved`: stores take URLs and paths as they are.
    """
    return create_store(cfg.kind, path=cfg.path or DEFAULT_SQLITE_PATH, url=cfg.url, schema=cfg.schema)


def guarantee(spec: PipelineSpec) -> str:
    store, target = spec.state_store, spec.target
    if not store.durable:
        return ("none across restarts: state is in memory, so a run refuses to resume an existing checkpoint "
                "(configure a durable [state_store])")
    if target.kind == "console":
        return "at-least-once: the console target prints replayed windows again"
    if store.kind == "postgres" and target.same_transaction:
        return "exactly-once: target rows, state and offsets commit in one PostgreSQL transaction"
    return (f"effectively-once: state and offsets commit per batch to the {store.kind} store; a replayed batch "
            f"rewrites identical {target.kind} rows")
