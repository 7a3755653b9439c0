"""The SQLite store's periodic WAL checkpoint under a steady stream of appends."""

from __future__ import annotations

import os
from pathlib import Path

import contextfold as cf
from contextfold.journal import Journal
from contextfold.store import _sqlite_thread
from contextfold.store.sqlite import SQLiteStore

_WAL_HEADER, _FRAME_HEADER, _PAGE = 32, 24, 4096


def _frames(path: Path) -> int:
    """How many frames the WAL file has room for (its size never shrinks on a restart)."""
    return (os.path.getsize(f"{path}-wal") - _WAL_HEADER) // (_FRAME_HEADER + _PAGE)


async def test_a_steady_stream_of_appends_starts_the_wal_over_after_each_checkpoint(
    tmp_path: Path,
) -> None:
    """Each checkpoint copies the whole WAL while appends keep coming, so the next append
    writes the WAL from its start again: it stays as long as the appends between two
    checkpoints, instead of growing with every append ever made."""
    path = tmp_path / "journal.db"
    journal = Journal(SQLiteStore(path))
    every = _sqlite_thread._CHECKPOINT_EVERY
    try:
        await journal.append("s", cf.RawEvent("note", {"i": 0}))
        start = _frames(path)
        for i in range(10):
            await journal.append("s", cf.RawEvent("note", {"i": i}))
        per_append = (_frames(path) - start) / 10
        assert per_append >= 1
        for i in range(8 * every):
            await journal.append("s", cf.RawEvent("note", {"i": i}))
        assert _frames(path) < 3 * every * per_append
    finally:
        await journal.close()
