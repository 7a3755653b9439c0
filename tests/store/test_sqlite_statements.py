"""What one SQLite append asks of SQLite: the statements a single-event append runs."""

from __future__ import annotations

from pathlib import Path

import contextfold as cf
from contextfold.journal import Journal
from contextfold.store.sqlite import SQLiteStore


def raw(i: int) -> cf.RawEvent:
    return cf.RawEvent("note", {"i": i})


async def test_a_single_event_append_takes_its_cursor_from_the_insert(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "journal.db")
    async with Journal(store) as journal:
        await journal.append("s", raw(1))
        conn = store._db.connection
        assert conn is not None
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        done = await journal.append("s", raw(2))
        conn.set_trace_callback(None)
        assert [s.split(" ", 2)[:2] for s in statements] == [
            ["BEGIN", "IMMEDIATE"],
            ["SELECT", "version"],
            ["INSERT", "INTO"],  # the event: its rowid is the cursor
            ["INSERT", "INTO"],  # the stream's version
            ["COMMIT"],
        ]
        (stored,) = (
            await journal.read("s", after=(await journal.read("s", limit=1)).cursor)
        ).events
        assert done.cursor == stored.cursor and stored.payload == {"i": 2}
