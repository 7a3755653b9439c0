"""Store URLs: the one parser that turns ``memory://``, ``sqlite:///…`` and ``postgresql://…``
into a backend kind and its target, for the journal and the transcript store alike, and
:func:`open_store`, the journal store a URL names.

A backend module is imported only when its scheme is asked for, so the PostgreSQL driver
stays optional (the SQLite backends use :func:`sqlite_path_hint` for their messages, this
module imports no backend at its top). A PostgreSQL URL may carry
``pool_timeout=<seconds>`` in its query (contextfold's, taken out before libpq sees the
URL): the most a request waits for a pooled connection, :func:`backend_options` hands it
to the backend as its ``timeout``.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from ..errors import InvalidInputError
from .base import Store

__all__ = [
    "BACKENDS",
    "POOL_TIMEOUT_PARAMETER",
    "Scheme",
    "StoreURL",
    "backend_options",
    "open_store",
    "parse_store_url",
    "sqlite_path_hint",
]

POOL_TIMEOUT_PARAMETER = "pool_timeout"
"""The query parameter of a PostgreSQL URL giving the pool's acquire timeout in seconds."""

Scheme = Literal["memory", "sqlite", "postgresql"]

_MEMORY = ("memory://", "memory:")
_SQLITE = "sqlite:///"
_POSTGRES = ("postgresql://", "postgres://", "postgresql+psycopg://")


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL.

    ``target`` is what the backend opens: empty for memory, the file path for SQLite
    (``:memory:`` for a private in-memory database), a libpq ``postgresql://`` URL for
    PostgreSQL (a ``postgresql+psycopg://`` prefix is rewritten to it).
    """

    scheme: Scheme
    target: str
    pool_timeout: float | None = None
    """PostgreSQL: the URL's ``pool_timeout`` (seconds), None when it gives none."""


def parse_store_url(url: object, *, what: str = "journal") -> StoreURL:
    """Parse ``url``; ``what`` names the store in error messages ("journal", "transcript").

    Raises InvalidInputError for a non-str, an SQLite URL naming no file, another scheme
    (the message never repeats a password the URL holds), or a PostgreSQL ``pool_timeout``
    that is not one positive number of seconds.
    """
    if not isinstance(url, str):
        raise InvalidInputError(f"{what} URL must be a str, got {type(url).__name__}")
    if url in _MEMORY:
        return StoreURL("memory", "")
    if url.startswith(_SQLITE):
        path = url[len(_SQLITE) :]
        if not path:
            raise InvalidInputError(f"{url!r} names no file: use sqlite:///path/to/{what}.db")
        return StoreURL("sqlite", path)
    if url.startswith(_POSTGRES):
        target, pool_timeout = _pool_timeout("postgresql://" + url.split("://", 1)[1], what)
        return StoreURL("postgresql", target, pool_timeout)
    raise InvalidInputError(
        f"unknown {what} URL {_without_password(url)!r}: use memory://, sqlite:///path.db "
        "or postgresql://…"
    )


def _pool_timeout(url: str, what: str) -> tuple[str, float | None]:
    """``url`` without its ``pool_timeout`` parameter, and the seconds it gave. The other
    parameters are left byte for byte as they were (libpq reads them)."""
    base, mark, query = url.partition("?")
    kept: list[str] = []
    found: list[str] = []
    for item in query.split("&") if mark else ():
        key, _, value = item.partition("=")
        if unquote(key) == POOL_TIMEOUT_PARAMETER:
            found.append(unquote(value))
        else:
            kept.append(item)
    if not found:
        return url, None
    if len(found) > 1:
        raise InvalidInputError(
            f"the {what} URL gives {POOL_TIMEOUT_PARAMETER} {len(found)} times: give it once"
        )
    try:
        seconds = float(found[0])
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise InvalidInputError(
            f"{POOL_TIMEOUT_PARAMETER}={found[0][:40]!r} in the {what} URL must be a positive "
            "number of seconds (the most a request waits for a connection), e.g. 5"
        )
    return base + ("?" + "&".join(kept) if kept else ""), seconds


def backend_options(parsed: StoreURL, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` for the backend of ``parsed``, with the URL's ``pool_timeout`` as the
    backend's ``timeout``; InvalidInputError when both give one and they differ."""
    chosen = dict(options)
    if parsed.pool_timeout is not None:
        given = chosen.get("timeout")
        if given is not None and given != parsed.pool_timeout:
            raise InvalidInputError(
                f"the URL says {POOL_TIMEOUT_PARAMETER}={parsed.pool_timeout:g} and the "
                f"timeout option {given!r}: give the pool timeout once"
            )
        chosen["timeout"] = parsed.pool_timeout
    return chosen


def sqlite_path_hint(path: str) -> str:
    """What to add to a message about the SQLite file at ``path`` that could not be found
    or opened: for a relative path (``sqlite:///data/x.db``), the file it names from the
    working directory and, when the absolute path's folder exists, the URL of that path
    (``sqlite:////data/x.db``). Empty for an absolute path."""
    if path in ("", ":memory:") or os.path.isabs(path):
        return ""
    hint = f" ({path} is relative to the working directory: {os.path.abspath(path)}"
    absolute = "/" + path
    if os.path.isdir(os.path.dirname(absolute)):
        hint += f"; for the absolute path {absolute} write sqlite:///{absolute}"
    return hint + ")"


BACKENDS: Mapping[Scheme, tuple[str, str]] = {
    "memory": (".memory", "MemoryStore"),
    "sqlite": (".sqlite", "SQLiteStore"),
    "postgresql": (".postgres", "PostgresStore"),
}
"""Scheme -> (module relative to this package, class name) of the journal backend."""


def open_store(url: str, **options: Any) -> Store:
    """The journal store for ``memory://``, ``sqlite:///relative.db``, ``sqlite:////abs.db``,
    ``sqlite:///:memory:`` or ``postgresql://…``; it connects on first use. ``options`` go
    to the backend (``synchronous`` for SQLite, ``min_size`` for PostgreSQL, …; none for
    memory). Raises InvalidInputError for another URL, an option the memory store does not
    take, or PostgreSQL without its extra installed."""
    parsed = parse_store_url(url, what="journal")
    module_name, class_name = BACKENDS[parsed.scheme]
    try:
        module = importlib.import_module(module_name, __package__)
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        if parsed.scheme != "postgresql":
            raise
        raise InvalidInputError(
            "PostgreSQL support needs the postgres extra: pip install 'contextfold[postgres]'"
        ) from exc
    backend: Callable[..., Store] = getattr(module, class_name)
    if parsed.scheme == "memory":
        if options:
            raise InvalidInputError(
                f"the memory store takes no options, got {', '.join(sorted(options))}"
            )
        return backend()
    return backend(parsed.target, **backend_options(parsed, options))


def _without_password(url: str) -> str:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>"
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()
