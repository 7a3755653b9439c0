"""Helpers of the store tests."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

from contextfold.store._sqlite_thread import SQLiteThread

__all__ = ["blocked", "until"]


async def until(condition: object) -> None:
    """Yield to the loop until ``condition()`` holds (no timing: each turn lets the worker
    and the loop's callbacks run)."""
    assert callable(condition)
    for _ in range(20_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


async def blocked(db: SQLiteThread) -> tuple[asyncio.Future[None], threading.Event]:
    """A job holding a SQLite store's connection on its thread until the event is set (then
    await the future): the jobs asked for meanwhile queue behind it."""
    started, release = threading.Event(), threading.Event()

    def busy(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(30)

    blocker = asyncio.ensure_future(db.run(busy))
    assert await asyncio.to_thread(started.wait, 30), "the blocking job never started"
    return blocker, release
