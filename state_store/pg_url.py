"""PostgreSQL connection URLs: parsing, the ``user@host:port/db`` description, password redaction.

A URL may hold a password. It never appears in a description, a log line or an error message:

* ``parse_url`` reads a URL (``postgresql://...`` or ``key=value`` conninfo) and registers its
  password, so ``redact`` removes it from any text afterwards, whatever produced that text;
* ``redact`` also removes passwords written in URL, query-string and ``password=`` form;
* a log filter on the ``psycopg``, ``psycopg.pool`` and ``state_store.postgres_store`` loggers redacts
  every record once a password is known;
* ``describe`` names the server without the password (and without details when the URL does not
  parse: psycopg's text may echo it); ``server_address`` without the user either (Dagster metadata).

``access_denied`` says whether a driver error means the server refused the login itself (the
same settings will be refused again: terminal); ``store_error`` turns a driver error into the
store's error (``StoreUnavailable``, ``StoreAccessDenied``, ``StorePermissionError``) with a text
that holds no password. The Dagster layer uses these for its targets and
its failure texts; this module imports nothing of it.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolTimeout

from state_store.errors import EmatixError, StoreAccessDenied, StoreConfigError, StorePermissionError, StoreUnavailable

_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*):[^@\s]*@")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&\s]*", re.IGNORECASE)

#: The loggers whose records are redacted (the driver's, its pool's and the store's).
REDACTED_LOGGERS = ("psycopg", "psycopg.pool", "state_store.postgres_store")


#: a password this short cannot be cut out of a text without garbling it: the text is withheld
_SHORTEST_REPLACEABLE = 4
WITHHELD = "(details withheld: they may contain the password)"


def redact(text: str) -> str:
    """``text`` without any password this process has seen in a URL (or in ``PGPASSWORD``), nor
    DSN passwords; withheld whole when a password too short to replace occurs in it."""
    with _SECRETS_LOCK:
        secrets = set(_SECRETS)
    if os.environ.get("PGPASSWORD"):
        secrets.add(os.environ["PGPASSWORD"])
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            if len(secret) < _SHORTEST_REPLACEABLE:
                return WITHHELD
            text = text.replace(secret, "***")
    text = _URL_PASSWORD.sub(r"\1:***@", text)
    text = _QUERY_PASSWORD.sub(r"\1***", text)
    return _KV_PASSWORD.sub(r"\1***", text)


def one_line(text: str) -> str:
    """``text`` with its whitespace runs (driver messages span lines) collapsed to single spaces."""
    return " ".join(text.split())


def error_text(exc: BaseException) -> str:
    """An exception's text on one line, without passwords: what an error message may quote.

    PostgreSQL's own primary message is preferred when the driver has one (its ``str`` adds
    context lines that say the same again)."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    return redact(one_line(primary or str(exc) or type(exc).__name__))


class _RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if _SECRETS:
            message = record.getMessage()
            clean = redact(message)
            if clean != message:
                record.msg, record.args = clean, None
        return True


_FILTER = _RedactFilter()
for _name in REDACTED_LOGGERS:
    logging.getLogger(_name).addFilter(_FILTER)


def _params(url: str) -> dict[str, Any] | None:
    try:
        return conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - its text may echo the password: neither shown nor chained
        return None


def parse_url(url: str, key: str = "state_store.url") -> dict[str, Any]:
    """The connection parameters of ``url``; its password (if any) is redacted from then on.

    Raises ``StoreConfigError`` naming ``key`` (without the URL or the driver's text, which may
    hold the password) when ``url`` does not parse.
    """
    params = _params(url)
    if params is None:
        raise StoreConfigError(
            key, "is not a valid PostgreSQL connection URL",
            "use postgresql://user@host:port/database with the password in the environment")
    password = params.get("password")
    if password:
        with _SECRETS_LOCK:
            _SECRETS.add(str(password))
    return params


def server_address(url: str) -> str | None:
    """``postgresql://host:port/db`` for ``url`` (no user, no password), or None when it does not parse."""
    params = _params(url)
    if params is None:
        return None
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or params.get("user") or "postgres"
    return f"postgresql://{host}:{port}/{dbname}"


def describe(url: str) -> str:
    """``postgresql://user@host:port/db`` for ``url`` (no password), or ``<unparseable URL>``."""
    address = server_address(url)
    if address is None:
        return "<unparseable URL>"
    user = (_params(url) or {}).get("user")
    return address.replace("://", f"://{user}@", 1) if user else address


# libpq reports a refused login as text only (no SQLSTATE on a failed connection).
_ACCESS_DENIED = re.compile(
    r"password authentication failed|no password supplied|role \S+ does not exist|database \S+ does not exist"
    r"|no pg_hba\.conf entry|authentication failed|permission denied for database", re.IGNORECASE)


def access_denied(exc: BaseException) -> bool:
    """True when the server refused the login itself: the same settings will be refused again."""
    if isinstance(exc, psycopg.errors.InvalidAuthorizationSpecification | psycopg.errors.InvalidPassword
                  | psycopg.errors.InvalidCatalogName):
        return True
    return isinstance(exc, psycopg.OperationalError) and bool(_ACCESS_DENIED.search(str(exc)))


def store_error(exc: BaseException, failed: str, *, schema: str, connect_timeout: float) -> EmatixError | None:
    """The store's error for the driver's ``exc``, its text starting with ``failed`` (``"<action>
    failed for <pipeline and store>"``); ``None`` for an ``EmatixError`` or another exception that
    holds no password (the caller re-raises it as it is)."""
    if isinstance(exc, PoolTimeout):
        return StoreUnavailable(f"{failed}: no database connection within {connect_timeout} s ({error_text(exc)})")
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return StorePermissionError(
            f"{failed}: {error_text(exc)} (grant the store's role USAGE and CREATE on schema {schema}, or let "
            "an administrator create the tables, and SELECT/INSERT/UPDATE/DELETE on them)")
    if access_denied(exc):
        return StoreAccessDenied(
            f"{failed}: {error_text(exc)} (the server refused the login: fix the user, password or database "
            "name in state_store.url or its environment variable)")
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return StoreUnavailable(f"{failed}: {error_text(exc)}")
    if isinstance(exc, EmatixError):
        return None
    if isinstance(exc, psycopg.Error):  # keep the type, lose the password (if a message had one)
        text = str(exc)
        clean = redact(text)
        if clean != text:
            return StoreUnavailable(f"{failed}: {one_line(clean)}")
    return None


__all__ = ["REDACTED_LOGGERS", "access_denied", "describe", "error_text", "one_line", "parse_url", "redact",
           "store_error"]
