"""The SQLite transcript store: session, message and part tables in one file (WAL).

It can share the journal's file. Statements run on one dedicated thread holding one
connection, so the event loop never waits on disk. Writes take ``BEGIN IMMEDIATE`` (other
processes queue on the lock), and a write that returned is committed in the WAL: it
survives ``kill -9`` of the process, which is what crash cleanup relies on.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from ..store._sqlite_thread import SQLiteThread
from ..store.base import check_namespace
from .parts import Message, Part, is_unfinished
from .persist import (
    DEFAULT_PAGE_SIZE,
    CleanupResult,
    MessagePage,
    SessionInfo,
    TranscriptStore,
    check_limit,
    check_rows,
    check_session,
    close_rows,
    decode_message_row,
    decode_part_row,
    format_cursor,
    parse_cursor,
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

    async def write(self, *, messages: Sequence[Message] = (), parts: Sequence[Part] = ()) -> None:
        messages, parts = tuple(messages), tuple(parts)
        check_rows(messages, parts)
        if not messages and not parts:
            return

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            self._upsert(conn, messages, parts)
            conn.execute("COMMIT")

        await self._db.run(work)

    async def cleanup_unfinished(
        self, session: str, confirmed: Mapping[str, str] | None = None, *, now: str | None = None
    ) -> CleanupResult:
        check_session(session)
        confirmed = dict(confirmed or {})

        def work(conn: sqlite3.Connection) -> CleanupResult:
            conn.execute("BEGIN IMMEDIATE")
            messages, parts = self._unfinished(conn, session)
            closed = close_rows(messages, parts, confirmed, now)
            self._upsert(conn, closed.messages, closed.parts)
            conn.execute("COMMIT")
            return closed

        return await self._db.run(work)

    # -- reading ------------------------------------------------------------------------

    async def get_message(self, session: str, message_id: str) -> Message | None:
        return await self._get("cf_transcript_messages", session, message_id, decode_message_row)

    async def get_part(self, session: str, part_id: str) -> Part | None:
        return await self._get("cf_transcript_parts", session, part_id, decode_part_row)

    async def _get(
        self, table: _RowTable, session: str, row_id: str, decode: Callable[[Any, str], R]
    ) -> R | None:
        check_session(session)

        def work(conn: sqlite3.Connection) -> R | None:
            row = conn.execute(
                f"SELECT data FROM {table} WHERE namespace = ? AND session = ? AND id = ?",
                (self.namespace, session, row_id),
            ).fetchone()
            return None if row is None else decode(row[0], session)

        return await self._db.run(work)

    async def page_messages(
        self, session: str, *, after: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> MessagePage:
        check_session(session)
        check_limit(limit)
        start = parse_cursor(after)

        def work(conn: sqlite3.Connection) -> MessagePage:
            rows = conn.execute(
                "SELECT seq, data FROM cf_transcript_messages"
                " WHERE namespace = ? AND session = ? AND seq > ? ORDER BY seq, id LIMIT ?",
                (self.namespace, session, start, limit + 1),
            ).fetchall()
            more = len(rows) > limit
            rows = rows[:limit]
            cursor = format_cursor(rows[-1][0]) if rows else after
            return MessagePage(
                tuple(decode_message_row(data, session) for _, data in rows), cursor, more
            )

        return await self._db.run(work)

    async def parts_of(
        self, session: str, message_ids: Sequence[str]
    ) -> Mapping[str, tuple[Part, ...]]:
        check_session(session)
        ids = list(dict.fromkeys(message_ids))

        def work(conn: sqlite3.Connection) -> dict[str, tuple[Part, ...]]:
            found: dict[str, list[Part]] = {i: [] for i in ids}
            for start in range(0, len(ids), _IN_CHUNK):
                chunk = ids[start : start + _IN_CHUNK]
                rows = conn.execute(
                    "SELECT message_id, data FROM cf_transcript_parts"
                    " WHERE namespace = ? AND session = ?"
                    f" AND message_id IN ({','.join('?' * len(chunk))}) ORDER BY seq",
                    (self.namespace, session, *chunk),
                )
                for message_id, data in rows:
                    found[message_id].append(decode_part_row(data, session))
            return {i: tuple(found[i]) for i in ids}

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

    async def unfinished(self, session: str) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
        check_session(session)
        return await self._db.run(lambda conn: self._unfinished(conn, session))

    async def sessions(self, *, limit: int | None = None) -> tuple[SessionInfo, ...]:
        def work(conn: sqlite3.Connection) -> tuple[SessionInfo, ...]:
            sql = "SELECT id, created, updated FROM cf_transcript_sessions WHERE namespace = ?"
            sql += " ORDER BY created, id"
            args: list[Any] = [self.namespace]
            if limit is not None:
                sql += " LIMIT ?"
                args.append(check_limit(limit))
            return tuple(SessionInfo(*row) for row in conn.execute(sql, args))

        return await self._db.run(work)
