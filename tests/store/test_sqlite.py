"""SQLite-specific behaviour of SQLiteStore: lazy connecting, and read snapshots."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import contextfold as cf
from contextfold.errors import StoreUnavailableError
from contextfold.journal import Journal
from contextfold.store.sqlite import SQLiteStore


def raw(i: int) -> cf.RawEvent:
    return cf.RawEvent("note", {"i": i})


async def test_concurrent_first_calls_on_a_fresh_store(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "journal.db")
    try:
        calls = [store.version("default", "s") for _ in range(5)]
        assert await asyncio.gather(store.open(), *calls) == [None, 0, 0, 0, 0, 0]
    finally:
        await store.close()


async def test_a_failed_connect_is_retried_on_the_next_call(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the journal's directory should be")
    store = SQLiteStore(blocker / "journal.db")
    try:
        with pytest.raises(StoreUnavailableError, match="cannot open the journal"):
            await store.version("default", "s")
        blocker.unlink()
        assert await store.version("default", "s") == 0
    finally:
        await store.close()


async def test_a_read_sees_one_snapshot_across_a_delete_and_recreate(tmp_path: Path) -> None:
    """Another process deletes and recreates the stream between the cursor lookup and the
    page select: the page still comes from one history, never the old cursor's position
    continued into the new history without reset."""
    path = tmp_path / "journal.db"
    store = SQLiteStore(path)
    journal = Journal(store)
    try:
        await journal.append("s", [raw(1), raw(2), raw(3)])
        first = await journal.read("s", limit=2)
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        done: list[str] = []

        def recreate(statement: str) -> None:
            if done or not statement.startswith("SELECT global_position, position"):
                return
            try:  # sqlite3 swallows a callback's exception: keep it for the assertion
                _delete_and_recreate()
            except Exception as exc:
                done.append(repr(exc))
                raise
            done.append("ok")

        def _delete_and_recreate() -> None:
            other.execute("BEGIN IMMEDIATE")
            other.execute("DELETE FROM cf_events WHERE stream = 's'")
            other.executemany(
                "INSERT INTO cf_events (namespace, stream, position, type, data, event_id, time)"
                " VALUES ('default', 's', ?, 'note', ?, ?, 't')",
                [(p, f'{{"i": {10 + p}}}'.encode(), f"new-{p}") for p in range(1, 6)],
            )
            other.execute("UPDATE cf_streams SET version = 5 WHERE stream = 's'")
            other.execute("COMMIT")

        conn = store._db.connection
        assert conn is not None
        conn.set_trace_callback(recreate)
        page = await journal.read("s", after=first.cursor)
        conn.set_trace_callback(None)
        assert done == ["ok"], "the page select was not traced or the recreate failed"
        # The snapshot before the recreate: the old third event (a reset would be fine too,
        # continuing at position 3 of the new history is not).
        assert [e.payload for e in page.events] == [{"i": 3}] and not page.reset
        after = await journal.read("s", after=page.cursor)
        assert after.reset and [e.payload["i"] for e in after.events] == [11, 12, 13, 14, 15]
        other.close()
    finally:
        await journal.close()


async def test_a_payload_another_writer_stored_as_text_reads_as_bytes(tmp_path: Path) -> None:
    """Every reader takes ``data`` as bytes: a TEXT value written by a foreign tool (valid
    JSON or not) still comes back as bytes, so a bad one surfaces as a corrupt row."""
    path = tmp_path / "journal.db"
    async with Journal(SQLiteStore(path)) as journal:
        await journal.append("s", [raw(1), raw(2)])
        with sqlite3.connect(path) as other:
            other.execute("UPDATE cf_events SET data = '{\"i\": 7}' WHERE position = 1")
            other.execute("UPDATE cf_events SET data = 'not json' WHERE position = 2")
        other.close()
        first, second = (await journal.read("s")).events
        assert (first.data, first.payload) == (b'{"i": 7}', {"i": 7})
        assert second.data == b"not json"
        with pytest.raises(cf.CorruptEventError, match="stream 's' position 2"):
            _ = second.payload
        (newest,) = await journal.latest("s", ["note"])
        assert newest.data == b"not json"
