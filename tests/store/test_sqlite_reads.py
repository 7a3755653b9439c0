"""SQLite reads run in the order they were asked for: a read asked after a write sees it,
and another connection's write lock does not hold one up. A short read with the connection
idle runs on the caller's thread; a long one, one behind a queued job or a busy thread,
and a failing one run on the store's thread, with the same answers and errors."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.errors import StoreError
from contextfold.journal import Journal
from contextfold.store._sqlite_thread import SQLiteThread
from contextfold.store.base import ReadResult
from contextfold.store.sqlite import SQLiteStore
from tests.store.helpers import blocked, until

SCHEMA = "CREATE TABLE IF NOT EXISTS t (x INTEGER NOT NULL);"


def where(conn: sqlite3.Connection) -> str:
    return threading.current_thread().name


async def test_a_short_read_runs_on_the_callers_thread_once_connected(tmp_path: Path) -> None:
    db = SQLiteThread(str(tmp_path / "t.db"), schema=SCHEMA, what="the db", thread_name="cf-t")
    try:
        assert (await db.read(where)).startswith("cf-t")  # the first job connects, on the thread
        assert await db.read(where) == threading.current_thread().name
        timeout = await db.read(lambda conn: conn.execute("PRAGMA busy_timeout").fetchone()[0])
        assert timeout == 0  # no busy wait on the event loop's thread
    finally:
        await db.close()


async def test_a_long_read_moves_to_the_thread_with_the_same_answer(tmp_path: Path) -> None:
    db = SQLiteThread(str(tmp_path / "t.db"), schema=SCHEMA, what="the db", thread_name="cf-t")
    try:
        await db.write(lambda conn: conn.executemany("INSERT INTO t VALUES (?)", [(1,)] * 20_000))
        threads: list[str] = []

        def total(conn: sqlite3.Connection) -> int:
            threads.append(threading.current_thread().name)
            return int(conn.execute("SELECT sum(x) FROM t").fetchone()[0])

        assert await db.read(total) == 20_000
        here = threading.current_thread().name
        assert threads[0] == here and threads[-1].startswith("cf-t")  # tried, then moved
        assert await db.read(lambda conn: conn.in_transaction) is False
    finally:
        await db.close()


async def test_a_failing_read_fails_as_on_the_thread(tmp_path: Path) -> None:
    db = SQLiteThread(str(tmp_path / "t.db"), schema=SCHEMA, what="the db", thread_name="cf-t")
    try:
        await db.open()
        with pytest.raises(StoreError, match="SQLite error on the db") as err:
            await db.read(lambda conn: conn.execute("SELECT * FROM missing").fetchall())
        assert isinstance(err.value.__cause__, sqlite3.OperationalError)

        def fails(conn: sqlite3.Connection) -> None:
            raise KeyError("not an sqlite3 error")

        with pytest.raises(KeyError):
            await db.read(fails)
        assert await db.read(lambda conn: conn.in_transaction) is False
    finally:
        await db.close()


async def test_a_read_behind_a_busy_worker_or_a_queued_write_waits_its_turn(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "journal.db")
    journal = Journal(store)
    try:
        await journal.append("a", cf.RawEvent("note", {"i": 0}))
        blocker, release = await blocked(store._db)
        appended = asyncio.ensure_future(journal.append("a", cf.RawEvent("note", {"i": 1})))
        await until(lambda: len(store._db._pending) == 1)
        read = asyncio.ensure_future(journal.read("a"))
        await asyncio.sleep(0)
        assert not read.done()  # it does not overtake the write queued before it
        release.set()
        await blocker
        await appended
        page = await read
        assert [e.data for e in page.events] == [b'{"i":0}', b'{"i":1}']
    finally:
        await journal.close()


async def test_a_read_during_another_connections_write_lock_still_answers(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(SQLiteStore(path))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        await journal.append("a", cf.RawEvent("note", {"i": 0}))
        other.execute("BEGIN IMMEDIATE")
        other.execute("DELETE FROM cf_events")  # uncommitted: WAL readers see the old rows
        page = await journal.read("a")
        assert [e.data for e in page.events] == [b'{"i":0}']
        assert await journal.version("a") == 1
    finally:
        other.execute("ROLLBACK")
        other.close()
        await journal.close()


@settings(max_examples=25, deadline=None)
@given(counts=st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=4))
def test_reads_here_and_on_the_thread_give_the_same_pages(
    tmp_path_factory: pytest.TempPathFactory, counts: list[int]
) -> None:
    async def run() -> None:
        store = SQLiteStore(tmp_path_factory.mktemp("reads") / "journal.db")
        journal = Journal(store)
        try:
            cursor, total = None, 0
            for count in counts:
                if count:
                    await journal.append("s", [cf.RawEvent("n", {"i": i}) for i in range(count)])
                total += count
                here = await journal.read("s", after=cursor)
                assert here == await _on_the_thread(store, cursor)
                assert len(here.events) == count
                assert await journal.version("s") == total
                cursor = here.cursor
        finally:
            await journal.close()

    asyncio.run(run())


async def _on_the_thread(store: SQLiteStore, cursor: str | None) -> ReadResult:
    """The same read with the shortcut closed off (the store's thread answers)."""
    read = store._db.read
    store._db.read = store._db.run  # type: ignore[method-assign]
    try:
        return await store.read("default", "s", after=cursor, types=None, limit=None)
    finally:
        store._db.read = read  # type: ignore[method-assign]
