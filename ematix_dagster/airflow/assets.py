"""A pipeline's Airflow Assets: its target as the outlet, its inputs as inlets.

A DAG scheduled on :func:`pipeline_asset` runs after every task that ran the pipeline and
succeeded (Airflow records an asset event for each outlet of a successful task). URIs name where the
data is and never a user or password: ``postgres://host:port/database/schema/table`` for a
PostgreSQL target (the form of Airflow's postgres provider), ``file://`` + the absolute path of a
Parquet target or a files source, ``kafka://server/topic``. A PostgreSQL URL that is a placeholder
not set where the DAG is parsed (it comes from a Connection when the task runs) gives
``postgres://ematix/<pipeline>/schema/table``: stable, and the same for the producer and every
consumer that names the asset through :func:`pipeline_asset`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import PipelineSpec
from ematix_dagster.spec.environment import resolve_env
from state_store.pg_url import server_address


def _file_uri(path: str, base: Path | None) -> str:
    if "://" in path:
        return path
    p = Path(path)
    return ((base / p) if base is not None and not p.is_absolute() else p).resolve().as_uri()


def target_uri(spec: Any, base: Path | None = None) -> str:
    """The URI of the pipeline's target (relative paths resolve against ``base``, else the working
    directory). ``spec``: a :class:`PipelineSpec` or the pipeline file's TOML document (:func:`read_doc`)."""
    doc = _as_doc(spec)
    target, name = doc.get("target", {}), doc.get("pipeline_name", "pipeline")
    kind = target.get("kind")
    if kind == "parquet" and target.get("path"):
        return _file_uri(target["path"], base)
    if kind == "postgres" and target.get("table"):
        schema, _, table = str(target["table"]).rpartition(".")
        try:
            resolved = resolve_env(target["url"]) if target.get("url") else None
        except PipelineConfigError:
            resolved = None
        address = server_address(resolved) if resolved else None
        where = address.removeprefix("postgresql://") if address else f"ematix/{name}"
        return f"postgres://{where}/{schema or 'public'}/{table}"
    return f"ematix://{name}/{kind}"


def source_uris(spec: Any, base: Path | None = None) -> list[str]:
    """The URIs of the pipeline's inputs that have an address (a ``rate`` source and Redis streams, whose URL
    may hold a password, have none here)."""
    found = []
    for source in _as_doc(spec).get("sources", []):
        if source.get("kind") == "files" and source.get("path"):
            found.append(_file_uri(source["path"], base))
        elif source.get("kind") == "kafka" and source.get("topic"):
            server = str(source.get("bootstrap_servers") or "").split(",")[0].strip()
            found.append(f"kafka://{server}/{source['topic']}")
    return list(dict.fromkeys(found))


def pipeline_asset(pipeline: Any, working_dir: str | Path | None = None) -> Any:
    """The Asset of a pipeline's target (``pipeline``: a TOML path or a spec); schedule a DAG on it."""
    from airflow.sdk import Asset

    doc, base = _doc(pipeline, working_dir)
    return Asset(uri=target_uri(doc, base), extra={"pipeline": doc.get("pipeline_name", "")})


def source_assets(pipeline: Any, working_dir: str | Path | None = None) -> list[Any]:
    from airflow.sdk import Asset

    doc, base = _doc(pipeline, working_dir)
    return [Asset(uri=uri) for uri in source_uris(doc, base)]


def read_doc(path: str | Path) -> dict[str, Any]:
    """A pipeline file's TOML as written: where a DAG is parsed, the file is read for its Assets alone, not
    validated (its ``${NAME}`` values come with the task; a bad setting fails the task, naming the key)."""
    import tomllib

    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PipelineConfigError("path", f"cannot read the pipeline file {str(path)!r}: {exc}",
                                  "pass the path of a pipeline TOML file") from None


def _as_doc(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, PipelineSpec):
        return spec
    return {"pipeline_name": spec.pipeline_name,
            "target": {"kind": spec.target.kind, "path": spec.target.path, "table": spec.target.table,
                       "url": spec.target.url},
            "sources": [{"kind": s.kind, "path": s.path, "topic": s.topic,
                         "bootstrap_servers": s.bootstrap_servers} for s in spec.sources]}


def _doc(pipeline: Any, working_dir: str | Path | None) -> tuple[dict[str, Any], Path | None]:
    base = Path(working_dir) if working_dir is not None else None
    if isinstance(pipeline, PipelineSpec):
        return _as_doc(pipeline), base
    path = Path(pipeline)
    if base is not None and not path.is_absolute():
        path = base / path
    return read_doc(path), base


__all__ = ["pipeline_asset", "read_doc", "source_assets", "source_uris", "target_uri"]
