"""SQLiteThread, the plumbing under both SQLite stores: one connection on one thread,
opened lazily, a failed job rolled back, sqlite3 errors translated. (A failed open being
retried is tested through each store: tests/store/test_sqlite.py, tests/transcript.)"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from contextfold.errors import StorageFullError, StoreError, StoreUnavailableError
from contextfold.store._sqlite_thread import SQLiteThread
from tests.store.helpers import blocked, until

SCHEMA = "CREATE TABLE IF NOT EXISTS t (x INTEGER NOT NULL);"


def thread_at(path: Path | str) -> SQLiteThread:
    return SQLiteThread(str(path), schema=SCHEMA, what="the test db", thread_name="cf-test")


def test_an_unknown_synchronous_is_refused() -> None:
    with pytest.raises(ValueError, match="synchronous must be"):
        SQLiteThread(":memory:", schema=SCHEMA, what="x", thread_name="x", synchronous="fast")


async def test_jobs_run_in_order_on_one_worker_thread_with_one_connection(tmp_path: Path) -> None:
    db = thread_at(tmp_path / "sub" / "t.db")
    assert db.connection is None  # nothing opens before the first job
    try:

        def where(conn: sqlite3.Connection) -> tuple[str, int]:
            return threading.current_thread().name, id(conn)

        seen = await asyncio.gather(*(db.run(where) for _ in range(5)))
        assert len(set(seen)) == 1
        assert seen[0][0].startswith("cf-test") and seen[0][0] != threading.current_thread().name
        mode = await db.run(lambda conn: conn.execute("PRAGMA journal_mode").fetchone()[0])
        assert mode == "wal"
        assert await db.run(lambda conn: conn.execute("SELECT count(*) FROM t").fetchone()[0]) == 0
    finally:
        await db.close()


async def test_jobs_run_in_the_order_asked_and_writes_queued_together_share_a_commit(
    tmp_path: Path,
) -> None:
    db = thread_at(tmp_path / "t.db")
    try:
        await db.open()
        assert db.connection is not None
        commits: list[str] = []
        db.connection.set_trace_callback(
            lambda sql: commits.append(sql) if sql == "COMMIT" else None
        )

        def count(conn: sqlite3.Connection) -> int:
            return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])

        def insert(conn: sqlite3.Connection) -> int:
            return conn.execute("INSERT INTO t VALUES (1)").rowcount

        # Asked in one step: neither read overtakes a write asked before it, and the writes
        # queued between them share a commit.
        seen = await asyncio.gather(
            db.run(count), db.write(insert), db.write(insert), db.run(count)
        )
        assert list(seen) == [0, 1, 1, 2]
        await db.run(lambda conn: None)  # the thread is idle: the callback can go
        db.connection.set_trace_callback(None)
        assert commits == ["COMMIT"]
    finally:
        await db.close()


def insert_then_fail(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t VALUES (1)")
    raise KeyError("not an sqlite3 error")


def insert_then_violate(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.execute("INSERT INTO t VALUES (NULL)")  # NOT NULL


async def test_a_failed_job_is_rolled_back_and_sqlite_errors_translated(tmp_path: Path) -> None:
    db = thread_at(tmp_path / "t.db")
    try:
        with pytest.raises(StoreError, match="SQLite error on the test db at sqlite:///") as err:
            await db.run(insert_then_violate)
        assert isinstance(err.value.__cause__, sqlite3.IntegrityError)
        with pytest.raises(KeyError):
            await db.run(insert_then_fail)
        assert await db.run(lambda conn: conn.in_transaction) is False
        assert await db.run(lambda conn: conn.execute("SELECT count(*) FROM t").fetchone()[0]) == 0
    finally:
        await db.close()


def insert_then_fill_the_disk(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO t VALUES (2)")
    conn.execute("ROLLBACK")  # as SQLite may on SQLITE_FULL: the whole transaction is gone
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL
    raise full


async def test_a_full_disk_that_rolls_back_a_shared_commit_fails_each_write_as_full(
    tmp_path: Path,
) -> None:
    db = thread_at(tmp_path / "t.db")
    try:
        await db.open()
        blocker, release = await blocked(db)  # the writes queue behind it, to share a commit
        writes = asyncio.gather(
            db.write(lambda conn: conn.execute("INSERT INTO t VALUES (1)").rowcount),
            db.write(insert_then_fill_the_disk),
            return_exceptions=True,
        )
        await until(lambda: len(db._pending) == 2)
        release.set()
        await blocker
        written = await writes
        assert all(isinstance(each, StorageFullError) for each in written), written
        assert "disk is full" in str(written[1]) and "nothing was written" in str(written[1])
        assert await db.run(lambda conn: conn.in_transaction) is False
        assert await db.run(lambda conn: conn.execute("SELECT count(*) FROM t").fetchone()[0]) == 0
        assert await db.write(lambda conn: conn.execute("INSERT INTO t VALUES (3)").rowcount) == 1
    finally:
        await db.close()


async def test_close_closes_the_connection_and_later_calls_fail(tmp_path: Path) -> None:
    db = thread_at(tmp_path / "t.db")
    await db.open()
    conn = db.connection
    assert conn is not None
    await db.close()
    await db.close()  # idempotent
    assert db.connection is None
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")  # closed
    with pytest.raises(StoreUnavailableError, match=r"the test db at .* is closed"):
        await db.run(lambda conn: None)


async def test_close_before_any_job_starts_no_thread() -> None:
    db = thread_at(":memory:")
    await db.close()
    with pytest.raises(StoreUnavailableError, match="is closed"):
        await db.open()


async def test_a_cancelled_close_still_disconnects_and_stops_the_worker(tmp_path: Path) -> None:
    db = thread_at(tmp_path / "t.db")
    worker = await db.run(lambda conn: threading.current_thread())
    conn = db.connection
    assert conn is not None
    started, release = threading.Event(), threading.Event()

    def busy(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(30)

    job = asyncio.ensure_future(db.run(busy))
    assert await asyncio.to_thread(started.wait, 30)
    closing = asyncio.ensure_future(db.close())
    await asyncio.sleep(0)  # close has queued its disconnect behind the busy job
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    release.set()
    await job
    await asyncio.to_thread(worker.join, 10)
    assert not worker.is_alive(), "the worker thread outlived a cancelled close"
    assert db.connection is None
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")  # closed
