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


async def test_a_small_batch_is_one_insert_and_a_large_one_asks_for_its_last_rowid(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "journal.db")
    async with Journal(store) as journal:
        await journal.append("s", raw(0))
        conn = store._db.connection
        assert conn is not None
        for size, rowid_asked in ((2, False), (16, False), (17, True)):
            statements: list[str] = []
            conn.set_trace_callback(statements.append)
            done = await journal.append("s", [raw(i) for i in range(size)])
            conn.set_trace_callback(None)
            inserts = [s for s in statements if s.startswith("INSERT INTO cf_events")]
            assert len(inserts) == (size if rowid_asked else 1)
            assert any("last_insert_rowid" in s for s in statements) == rowid_asked
            page = await journal.read("s", limit=100)
            mine = [e for e in page.events if e.position >= done.first_position]
            assert [e.position for e in mine] == list(
                range(done.first_position, done.last_position + 1)
            )
            assert [e.payload["i"] for e in mine] == list(range(size))
            assert mine[-1].cursor == done.cursor
            assert [int(e.cursor) for e in mine] == list(
                range(int(mine[0].cursor), int(done.cursor) + 1)
            )
