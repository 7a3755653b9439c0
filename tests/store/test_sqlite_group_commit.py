"""The SQLite append path: appends queued while the worker is busy share one commit, each
refused on its own; an append that would wait on another writer's lock waits on the
worker, never on the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import contextfold as cf
from contextfold.errors import StoreError, WrongExpectedVersionError
from contextfold.journal import Journal
from contextfold.store.sqlite import SQLiteStore
from tests.store.helpers import blocked, until


def raw(i: int) -> cf.RawEvent:
    return cf.RawEvent("note", {"i": i})


async def test_appends_queued_together_share_one_commit_and_fail_alone(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "journal.db")
    journal = Journal(store)
    try:
        await journal.append("a", raw(0))
        conn = store._db.connection
        assert conn is not None
        commits: list[str] = []
        conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
        blocker, release = await blocked(store._db)  # the thread is busy: appends queue
        appends = [
            asyncio.ensure_future(journal.append("a", raw(1))),
            asyncio.ensure_future(journal.append("b", raw(2))),
            asyncio.ensure_future(journal.append("a", raw(3), expected_version=0)),  # stale
            asyncio.ensure_future(journal.append("a", raw(4), expected_version=2)),
            asyncio.ensure_future(journal.append("b", [raw(5), raw(6)])),
        ]
        await until(lambda: len(store._db._pending) == len(appends))
        release.set()
        await blocker
        results = await asyncio.gather(*appends, return_exceptions=True)
        # The appends are answered from inside the worker's job, which then still runs
        # statements (and the trace callback): removing the callback meanwhile would wait
        # for the connection's mutex holding the GIL the callback needs. Let the job end.
        await store._db.run(lambda conn: None)
        conn.set_trace_callback(None)
        assert commits == ["COMMIT"]
        assert isinstance(results[2], WrongExpectedVersionError)
        done = [r for r in results if isinstance(r, cf.AppendResult)]
        assert [(r.stream, r.first_position, r.last_position) for r in done] == [
            ("a", 2, 2),
            ("b", 1, 1),
            ("a", 3, 3),
            ("b", 2, 3),
        ]
        page = await journal.read("a")
        assert [e.data for e in page.events] == [b'{"i":0}', b'{"i":1}', b'{"i":4}']
    finally:
        await journal.close()


async def test_an_append_behind_another_writers_lock_leaves_the_loop_running(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    store = SQLiteStore(path, busy_timeout=5.0)
    journal = Journal(store)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        await journal.append("s", raw(0))
        conn = store._db.connection
        assert conn is not None
        begun: list[str] = []
        conn.set_trace_callback(lambda sql: begun.append(sql) if sql.startswith("BEGIN") else None)
        other.execute("BEGIN IMMEDIATE")  # another process's write lock
        pending = asyncio.ensure_future(journal.append("s", raw(1)))
        # The loop runs on: the append waits on the worker, and this coroutine (on the same
        # loop) is the one that releases the lock.
        await until(lambda: begun and not pending.done())
        other.execute("COMMIT")
        result = await pending
        assert result.last_position == 2
        await store._db.run(lambda conn: None)  # the thread is idle: the callback can go
        conn.set_trace_callback(None)
    finally:
        other.close()
        await journal.close()


async def test_a_failed_commit_fails_every_append_it_held(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    store = SQLiteStore(path, busy_timeout=0.0)
    journal = Journal(store)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        await journal.append("s", raw(0))
        other.execute("BEGIN IMMEDIATE")
        results = await asyncio.gather(
            journal.append("s", raw(1)), journal.append("t", raw(2)), return_exceptions=True
        )
        other.execute("ROLLBACK")
        assert all(isinstance(r, StoreError) for r in results), results
        assert await journal.version("s") == 1 and await journal.version("t") == 0
        assert (await journal.append("s", raw(3))).last_position == 2
    finally:
        other.close()
        await journal.close()


async def test_a_closed_store_refuses_appends(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "journal.db")
    journal = Journal(store)
    await journal.append("s", raw(0))
    await journal.close()
    with pytest.raises(cf.StoreUnavailableError, match="closed"):
        await store.append("default", "s", (), expected_version=None, idempotency_key=None)
