"""Store URLs: the one parser that turns ``memory://``, ``sqlite:///…`` and ``postgresql://…``
into a backend kind and its target, for the journal and the transcript store alike.

It only reads the string: choosing and importing a backend is the caller's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from ..errors import InvalidInputError

__all__ = ["Scheme", "StoreURL", "parse_store_url"]

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
