"""A SQLite journal whose file is moved, deleted or replaced while it is open.

The open connection keeps writing to the file it holds, which nobody can open again by
its path: every write is refused with StoreFileMovedError instead, and nothing of it is
acknowledged or stored. The HTTP service answers it with 503.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

import contextfold as cf
from contextfold.errors import StoreError, StoreFileMovedError
from contextfold.journal import Journal
from contextfold.store.sqlite import SQLiteStore


def raw(i: int) -> cf.RawEvent:
    return cf.RawEvent("note", {"i": i})


def _delete(path: Path) -> Path | None:
    path.unlink()
    return None


def _rename(path: Path) -> Path | None:
    moved = path.with_name("moved.db")
    path.rename(moved)
    return moved


def _rename_with_companions(path: Path) -> Path | None:
    moved = path.with_name("moved.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").rename(f"{moved}{suffix}")
    return moved


def _replace(path: Path) -> Path | None:
    other = path.with_name("other.db")
    with cf.open_journal_sync(f"sqlite:///{other}") as journal:
        journal.append("other", raw(99))
    os.replace(other, path)
    return None


def _companion(suffix: str, replace: bool) -> Callable[[Path], Path | None]:
    def move(path: Path) -> Path | None:
        companion = Path(f"{path}{suffix}")
        assert companion.exists(), f"WAL mode keeps {companion.name} while open"
        companion.unlink()
        if replace:
            companion.write_bytes(b"")
        return None

    return move


MOVES: dict[str, Callable[[Path], Path | None]] = {
    "delete": _delete,
    "rename": _rename,
    "rename-with-wal-and-shm": _rename_with_companions,
    "replace": _replace,
    "delete-wal": _companion("-wal", replace=False),
    "replace-wal": _companion("-wal", replace=True),
    "delete-shm": _companion("-shm", replace=False),
}


def _events(path: Path, stream: str) -> list[int]:
    with cf.open_journal_sync(f"sqlite:///{path}") as journal:
        return [e.payload["i"] for e in journal.read(stream).events]


@pytest.mark.parametrize("how", sorted(MOVES))
async def test_writes_after_the_file_moved_are_refused_and_nothing_is_stored(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(SQLiteStore(path))
    try:
        await journal.append("s", [raw(1), raw(2)])
        moved = MOVES[how](path)
        with pytest.raises(StoreFileMovedError) as info:
            await journal.append("s", raw(3))
        assert info.value.path == str(path)
        message = str(info.value)
        assert f"the journal file {path} was moved or deleted while open" in message
        assert "nothing was written" in message and "reopen" in message
        with pytest.raises(StoreFileMovedError):  # every write, not only the first
            await journal.append("s", raw(4), idempotency_key="k")
        with pytest.raises(StoreFileMovedError):
            await journal.delete_stream("s")
        # The refused writes were rolled back in the file the connection holds.
        assert [e.payload["i"] for e in (await journal.read("s")).events] == [1, 2]
    finally:
        await journal.close()
    if how == "replace":  # the file put in its place is left as it was
        with cf.open_journal_sync(f"sqlite:///{path}") as reopened:
            assert [i.stream for i in reopened.list_streams()] == ["other"]
            assert [e.payload["i"] for e in reopened.read("other").events] == [99]
    elif how == "delete":  # a new journal: nothing of the deleted one replayed into it
        assert _events(path, "s") == []
    else:  # the file the connection held keeps exactly what was acknowledged, on its own
        assert _events(moved or path, "s") == [1, 2]
    # Reopening the path gives a working journal again.
    async with cf.open_journal(f"sqlite:///{path}") as again:
        done = await again.append("s", raw(5))
        assert (await again.read("s", after=done.cursor)).events == ()


async def test_a_file_moved_back_before_the_write_is_accepted(tmp_path: Path) -> None:
    """The check compares files, not events: the same file back under its path is fine."""
    path = tmp_path / "journal.db"
    journal = Journal(SQLiteStore(path))
    try:
        await journal.append("s", raw(1))
        aside = tmp_path / "aside.db"
        path.rename(aside)
        aside.rename(path)
        assert (await journal.append("s", raw(2))).last_position == 2
    finally:
        await journal.close()
    assert _events(path, "s") == [1, 2]


async def test_a_relative_path_stays_the_same_file_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    journal = Journal(SQLiteStore("journal.db"))
    try:
        await journal.append("s", raw(1))
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        monkeypatch.chdir(elsewhere)
        assert (await journal.append("s", raw(2))).last_position == 2
    finally:
        await journal.close()
    assert _events(tmp_path / "journal.db", "s") == [1, 2]


async def test_other_connections_checkpointing_and_closing_are_no_move(tmp_path: Path) -> None:
    """Another connection writing, truncating the WAL and closing keeps the same files."""
    path = tmp_path / "journal.db"
    journal = Journal(SQLiteStore(path))
    try:
        await journal.append("s", raw(1))
        for i in range(2, 5):
            async with Journal(SQLiteStore(path)) as other:
                await other.append("s", raw(i))
            with sqlite3.connect(path) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
        assert (await journal.append("s", raw(5))).last_position == 5
    finally:
        await journal.close()
    assert _events(path, "s") == [1, 2, 3, 4, 5]


async def test_an_in_memory_database_has_no_file_to_watch() -> None:
    async with Journal(SQLiteStore(":memory:")) as journal:
        assert (await journal.append("s", raw(1))).last_position == 1
        assert await journal.delete_stream("s")


def test_the_error_is_a_store_error_from_the_tree() -> None:
    assert issubclass(StoreFileMovedError, StoreError)
    assert cf.StoreFileMovedError is StoreFileMovedError


@asynccontextmanager
async def _served(journal: Journal) -> AsyncIterator[httpx.AsyncClient]:
    import asyncio

    import uvicorn

    from contextfold.server import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(journal), lifespan="off", log_config=None)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "uvicorn stopped before it started"
            await asyncio.sleep(0.01)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        await task
        sock.close()


async def test_the_http_service_answers_a_moved_file_with_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.db"
    body = {"events": [{"type": "note", "payload": {"i": 1}}]}
    async with cf.open_journal(f"sqlite:///{path}") as journal, _served(journal) as client:
        assert (await client.post("/v1/streams/s/events", json=body)).status_code == 201
        path.unlink()
        refused = await client.post("/v1/streams/s/events", json=body)
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["type"] == "StoreFileMovedError" and str(path) in error["message"]
        page = await client.get("/v1/streams/s/events")
        assert [e["payload"] for e in page.json()["events"]] == [{"i": 1}]
