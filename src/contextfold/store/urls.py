"""Store URLs: the one parser that turns ``memory://``, ``sqlite:///…`` and ``postgresql://…``
into a backend kind and its target, for the journal and the transcript store alike, and
:func:`open_store`, the journal store a URL names.

A backend module is imported only when its scheme is asked for, so the PostgreSQL driver
stays optional and no backend imports this module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from ..errors import InvalidInputError
from .base import Store

__all__ = ["BACKENDS", "Scheme", "StoreURL", "open_store", "parse_store_url"]

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


def parse_store_url(url: object, *, what: str = "journal") -> StoreURL:
    """Parse ``url``; ``what`` names the store in error messages ("journal", "transcript").

    Raises InvalidInputError for a non-str, an SQLite URL naming no file, or another
    scheme (the message never repeats a password the URL holds).
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
        return StoreURL("postgresql", "postgresql://" + url.split("://", 1)[1])
    raise InvalidInputError(
        f"unknown {what} URL {_without_password(url)!r}: use memory://, sqlite:///path.db "
        "or postgresql://…"
    )


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
    return backend(parsed.target, **options)


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
