"""SQLite reads without the thread hop: a short read with the connection idle runs on the
caller's thread; a long one, one behind a queued write or a busy worker, and a failing one
run on the worker, with the same answers and errors as before."""

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
from contextfold.store import _sqlite_thread
from contextfold.store._sqlite_thread import SQLiteThread
from contextfold.store.base import ReadResult
from contextfold.store.sqlite import SQLiteStore
from tests.store.helpers import until

SCHEMA = "CREATE TABLE IF NOT EXISTS t (x INTEGER NOT NULL);"


def where(conn: sqlite3.Connection) -> str:
    return threading.current_thread().name


async def test_a_short_read_runs_on_the_callers_thread_once_connected(tmp_path: Path) -> None:
    db = SQLiteThread(str(tmp_path / "t.db"), schema=SCHEMA, what="the db", thread_name="cf-t")
    try:
        assert (await db.read(where)).startswith("cf-t")  # the first job connects, on the worker
        assert await db.read(where) == threading.current_thread().name
        timeout = await db.read(lambda conn: conn.execute("PRAGMA busy_timeout").fetchone()[0])
        assert timeout == 0  # no busy wait on the event loop's thread...
        assert await db.run(lambda conn: conn.execute("PRAGMA busy_timeout").fetchone()[0]) > 0
    finally:
        await db.close()  # ...and the worker's is restored


async def test_a_long_read_moves_to_the_worker_with_the_same_answer(tmp_path: Path) -> None:
    db = SQLiteThread(str(tmp_path / "t.db"), schema=SCHEMA, what="the db", thread_name="cf-t")
    try:
        await db.run(lambda conn: conn.executemany("INSERT INTO t VALUES (?)", [(1,)] * 20_000))
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


async def test_a_read_behind_a_busy_worker_or_a_queued_write_waits_its_turn(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "journal.db")
    journal = Journal(store)
    try:
        await journal.append("a", cf.RawEvent("note", {"i": 0}))
        started, release = threading.Event(), threading.Event()

        def busy(conn: sqlite3.Connection) -> None:
            started.set()
            release.wait(30)

        blocker = asyncio.ensure_future(store._db.run(busy))
        assert await asyncio.to_thread(started.wait, 30)
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


async def test_a_failing_read_fails_as_on_the_worker(tmp_path: Path) -> None:
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
def test_inline_and_worker_reads_give_the_same_pages(
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
                inline = await journal.read("s", after=cursor)
                assert inline == await _on_worker(store, cursor)
                assert len(inline.events) == count
                assert await journal.version("s") == total
                cursor = inline.cursor
        finally:
            await journal.close()

    asyncio.run(run())


async def _on_worker(store: SQLiteStore, cursor: str | None) -> ReadResult:
    """The same read with the inline path closed off (the worker answers)."""
    here = store._db.read_here
    store._db.read_here = lambda fn: []  # type: ignore[method-assign]
    try:
        return await store.read("default", "s", after=cursor, types=None, limit=None)
    finally:
        store._db.read_here = here  # type: ignore[method-assign]


async def test_the_connection_rests_without_waits_and_the_worker_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(tmp_path / "journal.db", busy_timeout=7.0)
    journal = Journal(store)
    db = store._db
    try:
        await journal.append("a", cf.RawEvent("note", {"i": 0}))  # connects on the worker

        def settings(conn: sqlite3.Connection) -> tuple[int, int]:
            busy = conn.execute("PRAGMA busy_timeout").fetchone()[0]
            return busy, conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]

        assert await db.read(settings) == (0, 0)  # on this thread: nothing waits
        assert await db.run(settings) == (7000, 1000)  # a worker job may wait and checkpoint
        assert await db.read(settings) == (0, 0)  # and the connection rests again after it
        checkpoints: list[str] = []
        checkpoint = db._checkpoint

        def counting() -> None:
            checkpoints.append(threading.current_thread().name)
            checkpoint()

        monkeypatch.setattr(db, "_checkpoint", counting)
        every = _sqlite_thread._CHECKPOINT_EVERY
        for i in range(4 * every):  # most run here (one meeting a checkpoint job does not)
            await journal.append("a", cf.RawEvent("note", {"i": i}))
            if db._inline_commits == 2 * every:
                break
        assert db._inline_commits == 2 * every
        await until(lambda: len(checkpoints) == 2)
        assert all(name.startswith("contextfold-sqlite") for name in checkpoints)
    finally:
        await journal.close()


async def test_a_checkpoint_leaves_the_connection_to_the_callers_thread(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    store = SQLiteStore(path)
    journal = Journal(store)
    db = store._db
    try:
        for i in range(20):
            await journal.append("a", cf.RawEvent("note", {"i": i}))
        before = path.stat().st_size  # what the appends wrote is in the WAL
        with db._busy:  # the connection in use: the checkpoint does not wait for it
            await asyncio.wait_for(asyncio.to_thread(db._checkpoint), 30)
        assert path.stat().st_size > before  # copied into the database file
        page = await journal.read("a")
        assert len(page.events) == 20
    finally:
        await journal.close()
    assert db._checkpointer is None  # closed with the connection
