"""Where a pipeline reads and writes, as Dagster sees it: upstream assets and credential-free addresses.

A pipeline's sources become upstream assets: an external ``AssetSpec`` per input (a files path, a
Kafka topic, Redis streams; a ``rate`` source generates its rows and has none), keyed by where the data is, not by
the source's name, so pipelines reading the same directory share one upstream asset. The asset graph
labels a node with its key's last part only, so a topic's and a stream's last part names its kind
(``clicks-topic``, ``clicks-stream``): a directory ``clicks`` and a Redis stream ``ematix:clicks``
would otherwise be two nodes both labelled ``clicks``. A source that
reads what another pipeline of the same location writes (its Parquet directory) is that pipeline's
asset instead: the reading pipeline is downstream of it.

Addresses are for the UI (``dagster/uri``): a path, a topic, Redis streams, or a PostgreSQL host, port
and database. They never hold a user name or password. The output's columns
(``dagster/column_schema``) are known only once Spark has analysed the pipeline's SQL, so they come
with the materializations rather than with the definition.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Optional

import dagster as dg

from ematix_dagster.errors import EmatixError, PipelineConfigError
from ematix_dagster.spec import Source, Target
from ematix_dagster.spec.environment import public_url, resolve_env
from state_store.pg_url import server_address

log = logging.getLogger("ematix_dagster")


def files_uri(path: str) -> str:
    """A local path as a ``file://`` URI (relative paths resolve against the working directory)."""
    return path if "://" in path else Path(path).resolve().as_uri()


def _key_parts(text: str) -> list[str]:
    return [re.sub(r"[^A-Za-z0-9_-]", "_", part) for part in re.split(r"[/:]+", text) if part.strip(".")]


def default_source_key(source: Source) -> Optional[dg.AssetKey]:
    """``files`` + the path's parts (``.ematix/data/clicks`` -> ``files/ematix/data/clicks``),
    ``kafka`` + the topic + ``-topic`` (``shop.orders`` -> ``kafka/shop_orders-topic``), ``redis`` + the
    streams + ``-stream`` (``ematix:clicks`` -> ``redis/ematix/clicks-stream``); None for a ``rate`` source."""
    if source.kind == "files" and source.path:
        return dg.AssetKey(["files", *_key_parts(source.path.strip().lstrip("."))])
    if source.kind == "kafka" and source.topic:
        return dg.AssetKey(["kafka", *_labelled(_key_parts(source.topic), "topic")])
    if source.kind == "redis_stream" and source.streams:
        return dg.AssetKey(["redis", *_labelled(_key_parts("+".join(source.streams)), "stream")])
    return None


def _labelled(parts: list[str], kind: str) -> list[str]:
    """``parts`` with ``kind`` on the last one, the part the asset graph shows as the node's label."""
    return [*parts[:-1], f"{parts[-1]}-{kind}"] if parts else [kind]


def source_uri(source: Source) -> Optional[str]:
    if source.kind == "files" and source.path:
        return files_uri(source.path)
    if source.kind == "kafka" and source.topic:
        servers = (source.bootstrap_servers or "").split(",")[0].strip()
        return f"kafka://{servers}/{source.topic}"
    if source.kind == "redis_stream" and source.url:
        try:  # the reader expands the URL itself (its password must not reach Spark): so does this
            resolved = resolve_env(source.url) or ""
        except PipelineConfigError:
            return None
        return f"{public_url(resolved).rstrip('/')}/{','.join(source.streams)}"
    return None


def postgres_uri(url: Optional[str]) -> Optional[str]:
    """``postgresql://host:port/database`` of a target URL (resolved from the environment), or None
    when it names an unset variable or does not parse. User and password are left out."""
    try:
        resolved = resolve_env(url)
    except PipelineConfigError:
        return None
    return server_address(resolved) if resolved else None


def target_uri(target: Target) -> Optional[str]:
    if target.kind == "parquet" and target.path:
        return files_uri(target.path)
    if target.kind == "postgres":
        return postgres_uri(target.url)
    return None


def target_metadata(target: Target) -> dict[str, Any]:
    """``dagster/table_name`` and ``dagster/uri`` of a target, for every asset that writes it (a
    pipeline's and its backfill's), so the UI shows both on the same table."""
    meta: dict[str, Any] = {}
    if target.kind == "postgres" and target.table:
        meta["dagster/table_name"] = target.table
    uri = target_uri(target)
    if uri is not None:
        meta["dagster/uri"] = uri
    return meta


def _where(path: str) -> str:
    return path if "://" in path else os.path.normpath(os.path.abspath(path))


def source_location(source: Source) -> Optional[str]:
    """What a source reads, comparable with :func:`target_location` (a pipeline reading another's output)."""
    return _where(source.path) if source.kind == "files" and source.path else None


def target_location(target: Target) -> Optional[str]:
    return _where(target.path) if target.kind == "parquet" and target.path else None


def output_schema_metadata(step: Any) -> dict[str, Any]:
    """``dagster/column_schema``: the rows the runner's step (:attr:`PipelineRunner.step`) sends to
    the target, once the query has started and Spark has analysed its SQL (empty before)."""
    schema = getattr(step, "schema", None)
    if schema is None:
        return {}
    columns = [dg.TableColumn(name=f.name, type=str(f.type)) for f in schema]
    return {"dagster/column_schema": dg.TableSchema(columns=columns)}


def table_size_metadata(step: Any) -> dict[str, Any]:
    """``dagster/row_count``: the target table's size, from the count the target keeps with each
    commit (none for targets that keep none, before the query started, or when it cannot be read:
    a materialization never fails for it)."""
    try:
        rows = step.target_row_count() if step is not None else None
    except EmatixError as exc:
        log.warning("could not read the target's row count: %s", exc)
        return {}
    return {} if rows is None else {"dagster/row_count": int(rows)}


__all__ = ["default_source_key", "files_uri", "output_schema_metadata", "postgres_uri", "source_location", "source_uri",
           "table_size_metadata", "target_location", "target_metadata", "target_uri"]
