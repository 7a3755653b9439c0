"""The PostgreSQL transcript store: the same rows as SQLite, for many processes and hosts.

Rows live in ``cf_transcript_*`` tables with a ``namespace`` column isolating tenants.
``data`` holds the row's JSON as text, not JSONB: JSONB refuses an escaped NUL character,
and a model's output may contain one (cast to ``jsonb`` in ad-hoc queries). Writes to one
session take a transaction-scoped advisory lock, so the order numbers of a session's rows
are assigned in commit order and a reader paging with a cursor never skips a late commit.
Times and names compare in the "C" collation (code point order), as in SQLite and memory,
whatever the database's locale.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...errors import StoreUnavailableError
from ...journal.encode import check_namespace
from ...store._postgres_pool import DEFAULT_POOL_TIMEOUT, pool_options
from ...store.postgres import driver_error, redact_url
from ..parts import Message, Part, is_unfinished
from .base import (
    CleanupResult,
    CloseRows,
    SessionInfo,
    TranscriptStore,
    decode_message_row,
    decode_part_row,
)

__all__ = ["PostgresTranscriptStore"]

R = TypeVar("R")
_Pool = AsyncConnectionPool[psycopg.AsyncConnection[Any]]
# The tables a row is read from by id: formatted into SQL, so never anything else.
_RowTable = Literal["cf_transcript_messages", "cf_transcript_parts"]

_SCHEMA_LOCK = 0x63665F7478  # any constant: serialises concurrent schema creation
_SCHEMA = """
CREATE TABLE IF NOT EXISTS cf_transcript_sessions (
    namespace TEXT NOT NULL,
    id TEXT NOT NULL,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    PRIMARY KEY (namespace, id)
);
CREATE TABLE IF NOT EXISTS cf_transcript_messages (
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    namespace TEXT NOT NULL,
    session TEXT NOT NULL,
    id TEXT NOT NULL,
    role TEXT NOT NULL,
    open BOOLEAN NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (namespace, session, id)
);
CREATE UNIQUE INDEX IF NOT EXISTS cf_transcript_messages_order
    ON cf_transcript_messages (namespace, session, seq);
CREATE INDEX IF NOT EXISTS cf_transcript_messages_open
    ON cf_transcript_messages (namespace, session) WHERE open;
CREATE TABLE IF NOT EXISTS cf_transcript_parts (
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    namespace TEXT NOT NULL,
    session TEXT NOT NULL,
    message_id TEXT NOT NULL,
    id TEXT NOT NULL,
    kind TEXT NOT NULL,
    open BOOLEAN NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (namespace, session, id)
);
CREATE INDEX IF NOT EXISTS cf_transcript_parts_by_message
    ON cf_transcript_parts (namespace, session, message_id, seq);
CREATE INDEX IF NOT EXISTS cf_transcript_parts_open
    ON cf_transcript_parts (namespace, session) WHERE open;
"""

_UPSERT_SESSION = (
    "INSERT INTO cf_transcript_sessions (namespace, id, created, updated) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (namespace, id) DO UPDATE"
    ' SET updated = GREATEST(cf_transcript_sessions.updated COLLATE "C", EXCLUDED.updated)'
)
_UPSERT_MESSAGE = (
    "INSERT INTO cf_transcript_messages (namespace, session, id, role, open, data)"
    " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (namespace, session, id) DO UPDATE SET"
    " role = EXCLUDED.role, open = EXCLUDED.open, data = EXCLUDED.data"
)
_UPSERT_PART = (
    "INSERT INTO cf_transcript_parts (namespace, session, message_id, id, kind, open, data)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (namespace, session, id) DO UPDATE SET"
    " message_id = EXCLUDED.message_id, kind = EXCLUDED.kind, open = EXCLUDED.open,"
    " data = EXCLUDED.data"
)
_LOCK_SESSION = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


class PostgresTranscriptStore(TranscriptStore):
    """Transcript rows in PostgreSQL, reached through a psycopg connection pool.

    ``timeout`` (seconds) bounds the wait for a connection, with the journal's pool
    settings (``contextfold.store._postgres_pool``). Driver errors are translated like the
    journal's (``contextfold.store.postgres.driver_error``): StoreUnavailableError when the
    server cannot be reached, StoreError otherwise.
    """

    def __init__(
        self,
        dsn: str,
        *,
        namespace: str = "default",
        min_size: int = 1,
        max_size: int = 4,
        timeout: float = DEFAULT_POOL_TIMEOUT,
        _pool: _Pool | None = None,
    ) -> None:
        self.namespace = check_namespace(namespace)
        self.dsn = dsn
        self.url = redact_url(dsn)
        self._min_size = min_size
        self._max_size = max_size
        self._timeout = timeout
        self._shared: dict[str, Any] = {"pool": _pool, "closed": False, "lock": asyncio.Lock()}

    def with_namespace(self, namespace: str) -> PostgresTranscriptStore:
        """The same database and pool, scoped to another namespace (closing either closes both)."""
        view = PostgresTranscriptStore(self.dsn, namespace=namespace, timeout=self._timeout)
        view._shared = self._shared
        return view

    async def open(self) -> None:
        await self._pool()

    async def close(self) -> None:
        if self._shared["closed"]:
            return
        self._shared["closed"] = True
        # A first open still in flight closes the pool it makes itself (see _pool).
        pool: _Pool | None = self._shared["pool"]
        if pool is not None:
            await pool.close()

    async def _pool(self) -> _Pool:
        if self._shared["closed"]:
            raise StoreUnavailableError(f"the transcript store at {self.url} is closed")
        pool: _Pool | None = self._shared["pool"]
        if pool is not None:
            return pool
        async with self._shared["lock"]:  # concurrent first calls open one pool
            if self._shared["closed"]:  # closed while this waited for the lock
                raise StoreUnavailableError(f"the transcript store at {self.url} is closed")
            if self._shared["pool"] is None:
                pool = await self._open_pool()
                if self._shared["closed"]:  # closed while this opened: nothing may outlive it
                    await asyncio.shield(pool.close())
                    raise StoreUnavailableError(f"the transcript store at {self.url} is closed")
                self._shared["pool"] = pool
        opened: _Pool = self._shared["pool"]
        return opened

    async def _open_pool(self) -> _Pool:
        pool: _Pool = AsyncConnectionPool(
            self.dsn,
            min_size=self._min_size,
            max_size=self._max_size,
            open=False,
            **pool_options(self.dsn, self._timeout),
        )
        try:
            await pool.open(wait=True, timeout=self._timeout)
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                await conn.execute(_SCHEMA)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, (psycopg.Error, OSError)):
                raise driver_error(exc, self.url, "opening the transcript store") from exc
            raise
        return pool

    @asynccontextmanager
    async def _conn(
        self, doing: str, *, transaction: bool = False
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        pool = await self._pool()
        try:
            async with pool.connection() as conn:
                if transaction:
                    async with conn.transaction():
                        yield conn
                else:
                    yield conn
        except (psycopg.Error, OSError) as exc:
            raise driver_error(exc, self.url, doing) from exc

    # -- writing ------------------------------------------------------------------------

    async def _lock(self, conn: psycopg.AsyncConnection[Any], sessions: Sequence[str]) -> None:
        # Sorted, so two writers touching the same sessions never deadlock.
        for session in sorted(set(sessions)):
            await conn.execute(_LOCK_SESSION, (f"{self.namespace}\x1f{session}",))

    async def _upsert(
        self, conn: psycopg.AsyncConnection[Any], messages: Sequence[Message], parts: Sequence[Part]
    ) -> None:
        ns = self.namespace
        async with conn.cursor() as cur:
            if messages:
                await cur.executemany(
                    _UPSERT_SESSION,
                    [(ns, m.session, m.created, m.completed or m.created) for m in messages],
                )
                await cur.executemany(
                    _UPSERT_MESSAGE,
                    [
                        (
                            ns,
                            m.session,
                            m.id,
                            m.role,
                            m.completed is None,
                            m.model_dump_json(),
                        )
                        for m in messages
                    ],
                )
            if parts:
                await cur.executemany(
                    _UPSERT_PART,
                    [
                        (
                            ns,
                            p.session,
                            p.message_id,
                            p.id,
                            p.kind,
                            is_unfinished(p),
                            p.model_dump_json(),
                        )
                        for p in parts
                    ],
                )

    async def _write_rows(self, messages: tuple[Message, ...], parts: tuple[Part, ...]) -> None:
        async with self._conn("writing transcript rows", transaction=True) as conn:
            await self._lock(conn, [m.session for m in messages] + [p.session for p in parts])
            await self._upsert(conn, messages, parts)

    async def _close_unfinished(self, session: str, close: CloseRows) -> CleanupResult:
        async with self._conn(f"cleaning up session {session!r}", transaction=True) as conn:
            await self._lock(conn, [session])
            closed = close(*await self._unfinished(conn, session))
            await self._upsert(conn, closed.messages, closed.parts)
        return closed

    # -- reading ------------------------------------------------------------------------

    async def _read_message(self, session: str, message_id: str) -> Message | None:
        return await self._get("cf_transcript_messages", session, message_id, decode_message_row)

    async def _read_part(self, session: str, part_id: str) -> Part | None:
        return await self._get("cf_transcript_parts", session, part_id, decode_part_row)

    async def _get(
        self, table: _RowTable, session: str, row_id: str, decode: Callable[[Any, str], R]
    ) -> R | None:
        async with self._conn(f"reading session {session!r}") as conn:
            cur = await conn.execute(
                f"SELECT data FROM {table} WHERE namespace = %s AND session = %s AND id = %s",
                (self.namespace, session, row_id),
            )
            row = await cur.fetchone()
        return None if row is None else decode(row[0], session)

    async def _read_page(
        self, session: str, after: int, limit: int
    ) -> Sequence[tuple[int, Message]]:
        async with self._conn(f"paging session {session!r}") as conn:
            cur = await conn.execute(
                "SELECT seq, data FROM cf_transcript_messages"
                " WHERE namespace = %s AND session = %s AND seq > %s ORDER BY seq LIMIT %s",
                (self.namespace, session, after, limit),
            )
            rows = await cur.fetchall()
        return tuple((seq, decode_message_row(data, session)) for seq, data in rows)

    async def _read_parts(
        self, session: str, message_ids: tuple[str, ...]
    ) -> Mapping[str, Sequence[Part]]:
        found: dict[str, list[Part]] = {i: [] for i in message_ids}
        async with self._conn(f"reading parts of session {session!r}") as conn:
            cur = await conn.execute(
                "SELECT message_id, data FROM cf_transcript_parts"
                " WHERE namespace = %s AND session = %s AND message_id = ANY(%s) ORDER BY seq",
                (self.namespace, session, list(message_ids)),
            )
            for message_id, data in await cur.fetchall():
                found[message_id].append(decode_part_row(data, session))
        return found

    async def _unfinished(
        self, conn: psycopg.AsyncConnection[Any], session: str
    ) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
        args = (self.namespace, session)
        cur = await conn.execute(
            "SELECT data FROM cf_transcript_messages"
            " WHERE namespace = %s AND session = %s AND open ORDER BY seq",
            args,
        )
        messages = tuple(decode_message_row(r[0], session) for r in await cur.fetchall())
        cur = await conn.execute(
            "SELECT data FROM cf_transcript_parts"
            " WHERE namespace = %s AND session = %s AND open ORDER BY seq",
            args,
        )
        parts = tuple(decode_part_row(r[0], session) for r in await cur.fetchall())
        return messages, parts

    async def _read_unfinished(self, session: str) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
        async with self._conn(f"reading unfinished rows of session {session!r}") as conn:
            return await self._unfinished(conn, session)

    async def _read_sessions(self, limit: int | None) -> Sequence[SessionInfo]:
        async with self._conn("listing sessions") as conn:
            cur = await conn.execute(
                "SELECT id, created, updated FROM cf_transcript_sessions WHERE namespace = %s"
                ' ORDER BY created COLLATE "C", id COLLATE "C" LIMIT %s',
                (self.namespace, limit),
            )
            rows = await cur.fetchall()
        return tuple(SessionInfo(*row) for row in rows)
