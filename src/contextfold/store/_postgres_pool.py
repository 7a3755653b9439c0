"""The connection pool settings the PostgreSQL stores (the journal's and the transcript's)
share, so that a database outage is answered within the pool timeout and a database back
up is found by the next request.

psycopg_pool retries a connection it could not make with a backoff that doubles (1, 2,
4, … s) for ``reconnect_timeout`` (5 minutes by default): a request arriving after the
server came back waited for the next attempt, up to half a minute. Giving up after the
pool timeout instead keeps every wait between attempts under it, and once an attempt
gives up the next request starts a fresh one at once. A connect gets at most the pool
timeout too (libpq's own default is over two minutes: an unreachable host would hold
the attempt that long).
"""

from __future__ import annotations

import math
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = ["DEFAULT_POOL_TIMEOUT", "pool_options"]

DEFAULT_POOL_TIMEOUT = 5.0
"""Seconds a request waits for a pooled connection before the store says the database
is unavailable (``timeout=`` of the stores, ``pool_timeout=`` in the URL)."""

_MIN_CONNECT_TIMEOUT = 2  # libpq's floor: it reads anything lower as 2 s


def pool_options(dsn: str, timeout: float) -> dict[str, Any]:
    """Keyword arguments for ``AsyncConnectionPool`` (besides sizes and name): the acquire
    ``timeout``, a ``reconnect_timeout`` of the same seconds, autocommit connections and a
    ``connect_timeout`` of the same seconds (rounded up, at least 2) unless ``dsn`` sets
    one."""
    kwargs: dict[str, Any] = {"autocommit": True}
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.Error:
        given = {}  # the connect reports what is wrong with it, through the store's errors
    if "connect_timeout" not in given:
        kwargs["connect_timeout"] = max(_MIN_CONNECT_TIMEOUT, math.ceil(timeout))
    return {"timeout": timeout, "reconnect_timeout": timeout, "kwargs": kwargs}
