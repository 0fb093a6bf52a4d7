"""``${NAME}`` placeholders: resolution at the point of use, and the warnings on the spec as written."""

from __future__ import annotations

import os
import re
from dataclasses import fields, is_dataclass, replace
from typing import Iterable, Iterator, TypeVar

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec.rules import _child, _fail

#: a ``${NAME}`` placeholder (the Redis reader, shipped to Spark's workers with this module, expands
#: its URL's with it too)
ENV_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_T = TypeVar("_T")


def resolve_env(value: str | None) -> str | None:
    """Expand ``${NAME}`` from the environment at the point of use."""
    if value is None:
        return None

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in os.environ:
            raise PipelineConfigError(f"${{{name}}}", "environment variable is not set", f"export {name}=...")
        return os.environ[name]

    return ENV_PLACEHOLDER.sub(sub, value)


def public_url(url: str) -> str:
    """``url`` without its user and password: what messages and Dagster's metadata may show. Here,
    below both, because the Redis reader's errors and the Dagster layer's lineage show the same
    address, and the lineage must not import the reader (it imports Spark)."""
    return re.sub(r"://[^/@]*@", "://", url)


def resolved_spec(spec: _T) -> _T:
    """``spec`` with every ``${NAME}`` expanded. All unset variables are named in one error, each
    with the TOML key that uses it, so the user fixes them in one go rather than one per run."""
    by_key: dict[str, list[str]] = {}
    for key, name in _unset(spec, ""):
        by_key.setdefault(key or "spec", []).append(f"${{{name}}}")
    if by_key:
        names = list(dict.fromkeys(use[2:-1] for uses in by_key.values() for use in uses))
        uses = "; ".join(f"{'' if i == 0 else key + ' '}uses {' and '.join(dict.fromkeys(found))}"
                         for i, (key, found) in enumerate(by_key.items()))
        plural = len(names) > 1
        _fail(next(iter(by_key)),
              f"{uses}, but the environment variable{'s' if plural else ''} {', '.join(names)} "
              f"{'are' if plural else 'is'} not set",
              " and ".join(f"export {name}=..." for name in names) + " where the pipeline is loaded and run")
    return _resolved(spec, "")


def _unset(obj: object, key: str) -> Iterator[tuple[str, str]]:
    """(TOML key, variable) for each unset ``${NAME}`` in ``obj``, in the spec's order."""
    if isinstance(obj, str):
        yield from ((key, name) for name in ENV_PLACEHOLDER.findall(obj) if name not in os.environ)
    elif isinstance(obj, tuple):
        for i, item in enumerate(obj):
            yield from _unset(item, f"{key}[{i}]")
    elif is_dataclass(obj) and not isinstance(obj, type):
        for f in fields(obj):
            value = getattr(obj, f.name)
            yield from _unset(value, _child(key, f.name, value))


def _resolved(obj: _T, key: str) -> _T:
    if isinstance(obj, str):
        return resolve_env(obj)  # type: ignore[return-value]
    if isinstance(obj, tuple):
        return tuple(_resolved(item, f"{key}[{i}]") for i, item in enumerate(obj))  # type: ignore[return-value]
    if is_dataclass(obj) and not isinstance(obj, type):
        # a field a source's reader expands itself (a Redis URL) stays as written: see Source.url
        return replace(obj, **{f.name: _resolved(getattr(obj, f.name), _child(key, f.name, getattr(obj, f.name)))
                               for f in fields(obj)
                               if not f.metadata.get("expanded_by_reader")})
    return obj


# Warnings: valid, but unwise

_URL_USERINFO = re.compile(r"://([^/?#@\s]*)@")
_QUERY_PASSWORD = re.compile(r"[?&]password=([^&#\s]*)", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def _literal_password(url: str) -> bool:
    """Whether ``url`` holds a password typed into the file (not only ``${NAME}`` placeholders)."""
    found = [m.group(1).partition(":")[2] for m in _URL_USERINFO.finditer(url)]
    found += [m.group(1) for m in _QUERY_PASSWORD.finditer(url)] + [m.group(1) for m in _KV_PASSWORD.finditer(url)]
    return any(ENV_PLACEHOLDER.sub("", password).strip("'") for password in found)


def password_warnings(urls: Iterable[tuple[str, str | None, str]]) -> list[str]:
    """One line per ``(key, url, variable)`` whose URL holds a password typed into the file (files
    are shared, versioned and printed); ``variable`` is the environment variable to suggest. The
    password is never shown."""
    return [f"{key}: the URL holds a password written in the pipeline file; move the password to an environment "
            f'variable, e.g. url = "{_example(url)}" (any string may use ${{NAME}}), '
            f'or the whole URL, e.g. url = "${{{variable}}}"'
            for key, url, variable in urls if url and _literal_password(url)]


def _example(url: str) -> str:
    """A URL of the same scheme with its password in a placeholder (a Redis URL: ``redis://``)."""
    if url.lower().startswith(("redis://", "rediss://")):
        return f"{url.split(':', 1)[0].lower()}://:${{REDIS_PASSWORD}}@host:6379/0"
    return "postgresql://user:${PGPASSWORD}@host/db"
