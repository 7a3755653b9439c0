"""PostgreSQL driver errors as contextfold errors, and connection strings without their
passwords for the messages: shared by the journal's and the transcript's stores."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.errors import PipelineAborted
from psycopg_pool import PoolClosed, PoolTimeout

from ..errors import StorageFullError, StoreError, StoreUnavailableError

__all__ = ["driver_error", "redact_url"]

_DISK_FULL = "53100"  # SQLSTATE disk_full


def driver_error(exc: Exception, where: str, doing: str) -> StoreError:
    """The one place where PostgreSQL driver errors become contextfold errors (the journal
    and the transcript store both raise what this returns).

    StoreUnavailableError when the server is out of reach (no connection from the pool, an
    OS error, a lost connection or a server shutdown), StorageFullError when its disk is
    full, else StoreError. ``where`` is the redacted URL (:func:`redact_url`), ``doing``
    what was being done.
    """
    if isinstance(exc, (PoolTimeout, PoolClosed, OSError)) or _lost_connection(exc):
        return StoreUnavailableError(
            f"PostgreSQL at {where} is unavailable while {doing}: {exc}; "
            "check that the server is up and the URL is right, then retry"
        )
    if isinstance(exc, psycopg.Error) and exc.sqlstate == _DISK_FULL:
        return StorageFullError(
            f"PostgreSQL at {where} is out of disk space while {doing}: {exc}; nothing was "
            "written: free space on the database server, then retry"
        )
    return StoreError(f"PostgreSQL error at {where} while {doing}: {exc}")


def _lost_connection(exc: Exception) -> bool:
    """Whether a driver error means the server is out of reach (not a refused statement)."""
    if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, PipelineAborted):
        return False
    state = exc.sqlstate
    # No SQLSTATE: a client-side connection failure. 08: connection exception. 57P: shutdown.
    return state is None or state.startswith(("08", "57P"))


def redact_url(url: str) -> str:
    """A PostgreSQL URL or ``key=value`` connection string without its password, for
    messages."""
    if "://" not in url:
        try:
            info = conninfo_to_dict(url)
        except psycopg.Error:
            return "<unparsable connection string>"
        if "password" in info:
            info["password"] = "***"
        return make_conninfo("", **info)
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return "<unparsable URL>"
    if any(key == "password" for key, _ in query):
        masked = [(key, "***" if key == "password" else value) for key, value in query]
        parts = parts._replace(query=urlencode(masked, safe="*"))
    if parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = f"{parts.username}:***@" if parts.username else ":***@"
        parts = parts._replace(netloc=user + netloc)
    return urlunsplit(parts)
