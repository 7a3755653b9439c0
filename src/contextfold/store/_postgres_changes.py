"""The PostgreSQL store's listening connections: one of their own (not the pool's) that
LISTENs on :data:`NOTIFY_CHANNEL`, and the changes it hears as the store reports them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import psycopg

from ._postgres_sql import NOTIFY_CHANNEL
from ._postgres_wake import parse_wake
from .base import StreamChange

__all__ = ["change_feed", "listening"]

Fail = Callable[[Exception, str], NoReturn]
"""The store's translation of a driver error (its ``_fail``): raises a StoreError."""

_DOING = "listening for changes"


async def listening(url: str, timeout: float) -> psycopg.AsyncConnection[Any]:
    """A new connection listening on :data:`NOTIFY_CHANNEL`. Raises what the driver raises
    (psycopg.Error, OSError) when it cannot connect or listen."""
    conn = await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=max(1, int(timeout))
    )
    try:
        await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
    except BaseException:
        await conn.close()  # on a cancel too: nothing else holds this connection yet
        raise
    return conn


@contextlib.asynccontextmanager
async def change_feed(
    url: str, timeout: float, fail: Fail
) -> AsyncIterator[AsyncIterator[StreamChange]]:
    """``Store.listen_changes`` of the store at ``url``: entered once listening, closing its
    connection on exit; driver errors go through ``fail``."""
    try:
        conn = await listening(url, timeout)
    except (psycopg.Error, OSError) as exc:
        fail(exc, _DOING)
    try:
        yield _changes(conn, fail)
    finally:
        await conn.close()


async def _changes(conn: psycopg.AsyncConnection[Any], fail: Fail) -> AsyncIterator[StreamChange]:
    try:
        async for notify in conn.notifies():
            wake = parse_wake(notify.payload)
            yield StreamChange(wake.key, wake.version, wake.head)
    except (psycopg.Error, OSError) as exc:
        fail(exc, _DOING)
