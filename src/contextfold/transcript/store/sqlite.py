"""The SQLite transcript store: session, message and part tables in one file (WAL).

It can share the journal's file. Statements run on one dedicated thread holding one
connection, so the event loop never waits on disk. Writes queued together share one
commit (``store._sqlite_thread``; other processes queue on the lock), and a write that
returned is committed in the WAL: it survives ``kill -9`` of the process, which is what
crash cleanup relies on.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from ...journal.encode import check_namespace
from ...store._sqlite_thread import SQLiteThread
from ..parts import Message, Part, is_unfinished
from .base import (
    CleanupResult,
    CloseRows,
    SessionInfo,
    TranscriptStore,
    decode_message_row,
    decode_part_row,
)

__all__ = ["SQLiteTranscriptStore"]

R = TypeVar("R")
# The tables a row is read from by id: formatted into SQL, so never anything else.
_RowTable = Literal["cf_transcript_messages", "cf_transcript_parts"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cf_transcript_sessions (
    namespace TEXT NOT NULL,
    id TEXT NOT NULL,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    PRIMARY KEY (namespace, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cf_transcript_messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL,
    session TEXT NOT NULL,
    id TEXT NOT NULL,
    role TEXT NOT NULL,
    open INTEGER NOT NULL,
    data TEXT NOT NULL,
    UNIQUE (namespace, session, id)
);
CREATE INDEX IF NOT EXISTS cf_transcript_messages_order
    ON cf_transcript_messages (namespace, session, seq);
CREATE INDEX IF NOT EXISTS cf_transcript_messages_open
    ON cf_transcript_messages (namespace, session) WHERE open = 1;
CREATE TABLE IF NOT EXISTS cf_transcript_parts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL,
    session TEXT NOT NULL,
    message_id TEXT NOT NULL,
    id TEXT NOT NULL,
    kind TEXT NOT NULL,
    open INTEGER NOT NULL,
    data TEXT NOT NULL,
    UNIQUE (namespace, session, id)
);
CREATE INDEX IF NOT EXISTS cf_transcript_parts_by_message
    ON cf_transcript_parts (namespace, session, message_id, seq);
CREATE INDEX IF NOT EXISTS cf_transcript_parts_open
    ON cf_transcript_parts (namespace, session) WHERE open = 1;
"""

_UPSERT_SESSION = (
    "INSERT INTO cf_transcript_sessions (namespace, id, created, updated) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (namespace, id) DO UPDATE SET updated = max(updated, excluded.updated)"
)
_UPSERT_MESSAGE = (
    "INSERT INTO cf_transcript_messages (namespace, session, id, role, open, data)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, session, id) DO UPDATE SET"
    " role = excluded.role, open = excluded.open, data = excluded.data"
)
_UPSERT_PART = (
    "INSERT INTO cf_transcript_parts (namespace, session, message_id, id, kind, open, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, session, id) DO UPDATE SET"
    " message_id = excluded.message_id, kind = excluded.kind, open = excluded.open,"
    " data = excluded.data"
)
_IN_CHUNK = 500  # stays far below SQLite's limit on bound variables


class SQLiteTranscriptStore(TranscriptStore):
    """Transcript rows in one SQLite file (``":memory:"`` for a private in-memory database).

    ``synchronous="NORMAL"`` (default) survives a killed process, ``"FULL"`` also a power cut.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        namespace: str = "default",
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
        _db: SQLiteThread | None = None,
    ) -> None:
        self._db = _db or SQLiteThread(
            str(path),
            schema=_SCHEMA,
            what="the transcript store",
            thread_name="cf-transcript",
            synchronous=synchronous,
            busy_timeout=busy_timeout,
        )
        self.namespace = check_namespace(namespace)
        self.path = self._db.path
        self.url = self._db.url

    def with_namespace(self, namespace: str) -> SQLiteTranscriptStore:
        """The same database, scoped to another namespace (closing either closes both)."""
        return SQLiteTranscriptStore(self.path, namespace=namespace, _db=self._db)

    async def open(self) -> None:
        await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    # -- writing ------------------------------------------------------------------------

    def _upsert(
        self, conn: sqlite3.Connection, messages: Sequence[Message], parts: Sequence[Part]
    ) -> None:
        ns = self.namespace
        for m in messages:
            conn.execute(_UPSERT_SESSION, (ns, m.session, m.created, m.completed or m.created))
            conn.execute(
                _UPSERT_MESSAGE,
                (ns, m.session, m.id, m.role, int(m.completed is None), m.model_dump_json()),
            )
        conn.executemany(
            _UPSERT_PART,
            [
                (
                    ns,
                    p.session,
                    p.message_id,
                    p.id,
                    p.kind,
                    int(is_unfinished(p)),
                    p.model_dump_json(),
                )
                for p in parts
            ],
        )

    async def _write_rows(self, messages: tuple[Message, ...], parts: tuple[Part, ...]) -> None:
        await self._db.write(lambda conn: self._upsert(conn, messages, parts))

    async def _close_unfinished(self, session: str, close: CloseRows) -> CleanupResult:
        def work(conn: sqlite3.Connection) -> CleanupResult:
            closed = close(*self._unfinished(conn, session))
            self._upsert(conn, closed.messages, closed.parts)
            return closed

        return await self._db.write(work)

    # -- reading ------------------------------------------------------------------------

    async def _read_message(self, session: str, message_id: str) -> Message | None:
        return await self._get("cf_transcript_messages", session, message_id, decode_message_row)

    async def _read_part(self, session: str, part_id: str) -> Part | None:
        return await self._get("cf_transcript_parts", session, part_id, decode_part_row)

    async def _get(
        self, table: _RowTable, session: str, row_id: str, decode: Callable[[Any, str], R]
    ) -> R | None:
        def work(conn: sqlite3.Connection) -> R | None:
            row = conn.execute(
                f"SELECT data FROM {table} WHERE namespace = ? AND session = ? AND id = ?",
                (self.namespace, session, row_id),
            ).fetchone()
            return None if row is None else decode(row[0], session)

        return await self._db.run(work)

    async def _read_page(
        self, session: str, after: int, limit: int
    ) -> Sequence[tuple[int, Message]]:
        def work(conn: sqlite3.Connection) -> tuple[tuple[int, Message], ...]:
            rows = conn.execute(
                "SELECT seq, data FROM cf_transcript_messages"
                " WHERE namespace = ? AND session = ? AND seq > ? ORDER BY seq LIMIT ?",
                (self.namespace, session, after, limit),
            )
            return tuple((seq, decode_message_row(data, session)) for seq, data in rows)

        return await self._db.run(work)

    async def _read_parts(
        self, session: str, message_ids: tuple[str, ...]
    ) -> Mapping[str, Sequence[Part]]:
        def work(conn: sqlite3.Connection) -> dict[str, list[Part]]:
            found: dict[str, list[Part]] = {i: [] for i in message_ids}
            for start in range(0, len(message_ids), _IN_CHUNK):
                chunk = message_ids[start : start + _IN_CHUNK]
                rows = conn.execute(
                    "SELECT message_id, data FROM cf_transcript_parts"
                    " WHERE namespace = ? AND session = ?"
                    f" AND message_id IN ({','.join('?' * len(chunk))}) ORDER BY seq",
                    (self.namespace, session, *chunk),
                )
                for message_id, data in rows:
                    found[message_id].append(decode_part_row(data, session))
            return found

        return await self._db.run(work)

    def _unfinished(
        self, conn: sqlite3.Connection, session: str
    ) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
        args = (self.namespace, session)
        messages = conn.execute(
            "SELECT data FROM cf_transcript_messages"
            " WHERE namespace = ? AND session = ? AND open = 1 ORDER BY seq",
            args,
        ).fetchall()
        parts = conn.execute(
            "SELECT data FROM cf_transcript_parts"
            " WHERE namespace = ? AND session = ? AND open = 1 ORDER BY seq",
            args,
        ).fetchall()
        return (
            tuple(decode_message_row(r[0], session) for r in messages),
            tuple(decode_part_row(r[0], session) for r in parts),
        )

    async def _read_unfinished(self, session: str) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
        return await self._db.run(lambda conn: self._unfinished(conn, session))

    async def _read_sessions(self, limit: int | None) -> Sequence[SessionInfo]:
        def work(conn: sqlite3.Connection) -> tuple[SessionInfo, ...]:
            sql = "SELECT id, created, updated FROM cf_transcript_sessions WHERE namespace = ?"
            sql += " ORDER BY created, id LIMIT ?"
            rows = conn.execute(sql, (self.namespace, -1 if limit is None else limit))
            return tuple(SessionInfo(*row) for row in rows)

        return await self._db.run(work)
