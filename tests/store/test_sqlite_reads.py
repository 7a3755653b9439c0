"""SQLite reads run on the store's thread in the order they were asked for: a read asked
after a write sees it, and another connection's write lock does not hold a read up."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import contextfold as cf
from contextfold.journal import Journal
from contextfold.store.sqlite import SQLiteStore
from tests.store.helpers import blocked, until


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
