"""Fixtures of the transcript tests: a store on each backend, and a raw view of its tables."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contextfold.transcript import SQLiteTranscriptStore, TranscriptStore


@dataclass(frozen=True)
class RawRow:
    """One row as it sits in a table, read without the store's code."""

    table: str
    id: str
    open: bool
    data: dict[str, Any]


RawRows = Callable[[TranscriptStore], Awaitable[list[RawRow]]]

_QUERY = (
    "SELECT 'messages', id, open, data FROM cf_transcript_messages WHERE namespace = {p}"
    " UNION ALL SELECT 'parts', id, open, data FROM cf_transcript_parts WHERE namespace = {p}"
)


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _make(request: pytest.FixtureRequest, tmp_path: Path) -> TranscriptStore:
    if request.param == "sqlite":
        return SQLiteTranscriptStore(tmp_path / "transcript.db")
    dsn = request.getfixturevalue("pg_dsn")  # skips first when PostgreSQL is not there
    from contextfold.transcript.store.postgres import PostgresTranscriptStore

    return PostgresTranscriptStore(dsn)


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TranscriptStore]:
    """An open transcript store on a real SQLite file or a fresh PostgreSQL database."""
    backend = _make(request, tmp_path)
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture(params=BACKENDS)
async def unopened_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[TranscriptStore]:
    """Like ``store``, but not opened yet: the first call connects."""
    backend = _make(request, tmp_path)
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture
def raw_rows() -> RawRows:
    """Every message and part row of the store's namespace, straight from the tables."""

    async def read(store: TranscriptStore) -> list[RawRow]:
        if isinstance(store, SQLiteTranscriptStore):
            with sqlite3.connect(store.path) as conn:
                rows = conn.execute(_QUERY.format(p="?"), (store.namespace,) * 2).fetchall()
            conn.close()
        else:
            import psycopg

            from contextfold.transcript.store.postgres import PostgresTranscriptStore

            assert isinstance(store, PostgresTranscriptStore)
            async with await psycopg.AsyncConnection.connect(store.dsn) as aconn:
                cur = await aconn.execute(_QUERY.format(p="%s"), (store.namespace,) * 2)
                rows = list(await cur.fetchall())
        return sorted(
            (RawRow(t, i, bool(o), json.loads(d)) for t, i, o, d in rows),
            key=lambda r: (r.table, r.id),
        )

    return read
