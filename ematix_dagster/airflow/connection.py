"""Credentials from an Airflow Connection: a PostgreSQL URL handed to a pipeline's ``${NAME}`` placeholder.

A pipeline file names its database as ``url = "${EMATIX_PG_URL}"``; a task given ``conn_id`` builds that
URL from the Connection when it runs and puts it where the placeholder is read (the task process's
environment), so the password is in no pipeline file, no template field, no XCom value and no command
line. The trigger of the watermark sensor runs in the shared triggerer process: it expands the
placeholders in the pipeline file as it loads it instead (:func:`load_with_values`), never touching
that process's environment.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote, urlencode

from ematix_dagster.spec import PipelineSpec
from ematix_dagster.spec.environment import ENV_PLACEHOLDER

#: the placeholder the example pipelines use for their PostgreSQL URL
DEFAULT_URL_VARIABLE = "EMATIX_PG_URL"


def postgres_url(conn: Any) -> str:
    """``postgresql://user:password@host:port/database?extra`` from an Airflow Connection's fields."""
    user = quote(conn.login or "", safe="")
    password = quote(conn.password or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = conn.host or "localhost"
    port = f":{conn.port}" if conn.port else ""
    database = quote(conn.schema or "", safe="")
    extra = conn.extra_dejson if isinstance(getattr(conn, "extra_dejson", None), dict) else {}
    query = urlencode({k: v for k, v in extra.items() if isinstance(v, (str, int))})
    return f"postgresql://{auth}{host}{port}/{database}" + (f"?{query}" if query else "")


def connection_url(conn_id: str) -> str:
    """The PostgreSQL URL of Connection ``conn_id``; its password is registered with Airflow's log masker."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    url = postgres_url(conn)
    _mask(url, conn.password)
    return url


async def aconnection_url(conn_id: str) -> str:
    """:func:`connection_url` from a trigger's event loop."""
    from airflow.sdk import BaseHook

    getter = getattr(BaseHook, "aget_connection", None)
    if getter is not None:
        conn = await getter(conn_id)
    else:  # pragma: no cover - task SDKs without the async lookup
        from asgiref.sync import sync_to_async

        conn = await sync_to_async(BaseHook.get_connection)(conn_id)
    url = postgres_url(conn)
    _mask(url, conn.password)
    return url


def _mask(*secrets: str | None) -> None:
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older task SDKs
        from airflow.sdk.execution_time.secrets_masker import mask_secret  # type: ignore[no-redef]
    for secret in secrets:
        if secret:
            mask_secret(secret)


def export_url(conn_id: str | None, variable: str = DEFAULT_URL_VARIABLE) -> None:
    """In a task process: set ``variable`` to Connection ``conn_id``'s URL (nothing without a conn_id)."""
    if conn_id:
        os.environ[variable] = connection_url(conn_id)


def load_with_values(path: str | os.PathLike[str], values: Mapping[str, str]) -> PipelineSpec:
    """Load a pipeline file with the placeholders named in ``values`` replaced by them (the rest read from
    the environment, as :func:`~ematix_dagster.spec.load_pipeline` does). For a process whose environment
    is shared (the triggerer): the values never enter it. The spec holds them as written values, so it is
    used and dropped, never dumped or logged."""
    from ematix_dagster.spec import load_pipeline, load_pipeline_str

    if not values:
        return load_pipeline(path)
    text = Path(path).read_text()

    def toml_escaped(match: re.Match[str]) -> str:
        value = values.get(match.group(1))
        return match.group(0) if value is None else value.replace("\\", "\\\\").replace('"', '\\"')

    return load_pipeline_str(ENV_PLACEHOLDER.sub(toml_escaped, text))


__all__ = ["DEFAULT_URL_VARIABLE", "aconnection_url", "connection_url", "export_url", "load_with_values", "postgres_url"]
