"""A read-only SQLite journal: it must exist, it sees what writers append, and opening,
reading and closing it creates and changes nothing; a write through it is refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import contextfold as cf
from contextfold.errors import StoreError, StoreUnavailableError


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


async def test_a_missing_file_is_unavailable_and_nothing_is_created(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no' / 'such.db'}"
    with pytest.raises(StoreUnavailableError, match=r"such\.db does not exist"):
        async with cf.open_journal(url, read_only=True):
            pass
    assert list(tmp_path.iterdir()) == []


async def test_reads_see_appends_and_leave_the_files_as_they_were(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    async with cf.open_journal(url) as writer:
        await writer.append("s", cf.RawEvent("note", {"i": 1}))
        before = _files(tmp_path)
        async with cf.open_journal(url, read_only=True) as reader:
            assert [e.payload for e in (await reader.read("s")).events] == [{"i": 1}]
            await writer.append("s", cf.RawEvent("note", {"i": 2}))
            assert await reader.version("s") == 2
            with pytest.raises(StoreError, match="readonly"):
                await reader.append("s", cf.RawEvent("note", {"i": 3}))
        assert await writer.version("s") == 2
    after = _files(tmp_path)
    assert set(after) == {"j.db"} and set(before) <= {"j.db", "j.db-wal", "j.db-shm"}


async def test_a_file_without_the_journal_tables_is_not_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    with pytest.raises(StoreUnavailableError, match="has no cf_events table"):
        async with cf.open_journal(f"sqlite:///{path}", read_only=True):
            pass
    assert path.read_bytes() == b""
