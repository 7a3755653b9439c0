"""The SQLite store: the embedded default. One file, WAL mode, zero set-up.

Statements run on one dedicated thread holding one connection, so the event loop never
waits on a lock or a sync; the first statement connects, and a failed connect is retried
by the next call. An append that cannot wait on anything and a short read skip the
thread hop, and appends queued together share one commit (``_sqlite_thread``). Appends
take ``BEGIN IMMEDIATE``: writers from other processes queue on SQLite's lock
(``busy_timeout``) instead of failing, and positions are computed inside the write
transaction, so concurrent processes never produce a gap or duplicate. An append that
returned is committed in the WAL and survives ``kill -9`` of the process.

Heads and ``latest`` results the connection read or wrote are answered again without a
query while ``PRAGMA data_version`` shows that no other connection committed
(``_sqlite_known``); so is a read after the head, which finds nothing new.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import StoreError
from ..events import NewEvent, StoredEvent
from ._sqlite_known import UNKNOWN, Known
from ._sqlite_thread import SQLiteThread
from .base import (
    AppendResult,
    ReadResult,
    Store,
    StreamInfo,
    TailReset,
    batch_digest,
    idempotency_conflict,
    parse_cursor,
    poll_subscribe,
    wrong_version,
)

__all__ = ["SQLiteStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cf_events (
    global_position INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL,
    stream TEXT NOT NULL,
    position INTEGER NOT NULL,
    type TEXT NOT NULL,
    data BLOB NOT NULL,
    event_id TEXT NOT NULL,
    time TEXT NOT NULL,
    run_id TEXT,
    actor TEXT,
    idempotency_key TEXT,
    channels TEXT NOT NULL DEFAULT '',
    UNIQUE (namespace, stream, position)
);
CREATE INDEX IF NOT EXISTS cf_events_by_type ON cf_events (namespace, stream, type, position);
CREATE TABLE IF NOT EXISTS cf_streams (
    namespace TEXT NOT NULL,
    stream TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (namespace, stream)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cf_idempotency (
    namespace TEXT NOT NULL,
    stream TEXT NOT NULL,
    key TEXT NOT NULL,
    digest TEXT NOT NULL,
    first_position INTEGER NOT NULL,
    last_position INTEGER NOT NULL,
    last_global INTEGER NOT NULL,
    PRIMARY KEY (namespace, stream, key)
) WITHOUT ROWID;
"""

# CAST: a payload some other writer stored as TEXT still reads as bytes (a corrupt row
# must surface as invalid JSON, not as a str where every reader expects bytes).
_COLUMNS = (
    "global_position, position, type, CAST(data AS BLOB), event_id, time, run_id, actor,"
    " idempotency_key, channels"
)
_CHANNEL_SEP = "\x1f"
_SEEN = (
    "SELECT digest, first_position, last_position, last_global FROM cf_idempotency"
    " WHERE namespace = ? AND stream = ? AND key = ?"
)
_HEAD = (
    "SELECT global_position FROM cf_events WHERE namespace = ? AND stream = ?"
    " ORDER BY position DESC LIMIT 1"
)
_VERSION = "SELECT version FROM cf_streams WHERE namespace = ? AND stream = ?"
_BUMP = (
    "INSERT INTO cf_streams (namespace, stream, version) VALUES (?, ?, ?)"
    " ON CONFLICT (namespace, stream) DO UPDATE SET version = excluded.version"
)
_INSERT = (
    "INSERT INTO cf_events (namespace, stream, position, type, data, event_id, time, run_id,"
    " actor, idempotency_key, channels) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# Batches up to this size insert in one statement of as many rows, whose rowid is the last
# row's (a statement per size, all in the connection's statement cache); larger ones run
# executemany and ask for last_insert_rowid().
_ONE_STATEMENT = 16
_INSERTS = {
    n: _INSERT + ", (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" * (n - 1)
    for n in range(1, _ONE_STATEMENT + 1)
}


def _row(namespace: str, stream: str, position: int, e: NewEvent) -> tuple[Any, ...]:
    meta = e.meta
    return (
        namespace,
        stream,
        position,
        e.type,
        e.data,
        meta.event_id,
        meta.time,
        meta.run_id,
        meta.actor,
        meta.idempotency_key,
        _CHANNEL_SEP.join(meta.channels),
    )


def _values(namespace: str, stream: str, first: int, events: Sequence[NewEvent]) -> list[Any]:
    """The :func:`_row` of each event, one after another: the parameters of one insert of
    them all (without a call and an 11-step loop per event)."""
    values: list[Any] = []
    join = _CHANNEL_SEP.join
    for position, (type_name, data, meta) in enumerate(events, first):
        values += (namespace, stream, position, type_name, data)
        values += meta[:5]  # event_id, time, run_id, actor, idempotency_key: column order
        values.append(join(meta.channels))
    return values


class SQLiteStore(Store):
    """A store in one SQLite file (WAL). ``synchronous`` trades power-loss safety for speed:
    ``"NORMAL"`` (default) survives a killed process, ``"FULL"`` also a power cut.
    ``read_only``: the file must already hold a journal; nothing is created and every write
    is refused (StoreUnavailableError when it is missing, StoreError on a write)."""

    consecutive_globals = True  # one write transaction at a time, AUTOINCREMENT in one

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
        read_only: bool = False,
    ):
        self._db = SQLiteThread(
            str(path),
            schema=_SCHEMA,
            what="the journal",
            thread_name="contextfold-sqlite",
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            read_only=read_only,
            required_table="cf_events",
        )
        self.path = self._db.path
        self.url = self._db.url
        self._known = Known()  # used only holding the connection, as its jobs do

    async def open(self) -> None:
        await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    def subscribe(
        self, namespace: str, stream: str, *, after: str | None, poll_interval: float = 0.05
    ) -> AsyncIterator[StoredEvent | TailReset]:
        """The default live tail, refused (StoreError) on a file opened as immutable (on
        read-only media), which would never see a later write."""
        return self._follow(namespace, stream, after=after, poll_interval=poll_interval)

    async def _follow(
        self, namespace: str, stream: str, *, after: str | None, poll_interval: float
    ) -> AsyncIterator[StoredEvent | TailReset]:
        await self._db.open()
        if self._db.immutable:
            raise StoreError(
                f"cannot follow stream {stream!r} of {self.url}: the file is on read-only "
                "media with no writer, opened as immutable, so a later write would not be "
                "seen; read it without following"
            )
        tail = poll_subscribe(
            self, self.wakeups, namespace, stream, after=after, poll_interval=poll_interval
        )
        try:
            async for item in tail:
                yield item
        finally:
            if isinstance(tail, AsyncGenerator):  # closed here, not left to the collector
                await tail.aclose()

    # -- the contract ---------------------------------------------------------------------

    async def append(
        self,
        namespace: str,
        stream: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int | None,
        idempotency_key: str | None,
    ) -> AppendResult:
        digest = batch_digest(events) if idempotency_key is not None else ""

        db = self._db

        def work(conn: sqlite3.Connection) -> AppendResult:
            # Inside the write transaction of SQLiteThread.write, which commits it.
            cursor = db.cursor
            if idempotency_key is not None:
                row = cursor.execute(_SEEN, (namespace, stream, idempotency_key)).fetchone()
                if row is not None:
                    if row[0] != digest:
                        raise idempotency_conflict(stream, idempotency_key)
                    return AppendResult(stream, row[1], row[2], str(row[3]), deduplicated=True)
            row = cursor.execute(_VERSION, (namespace, stream)).fetchone()
            version = row[0] if row else 0
            if expected_version is not None and expected_version != version:
                raise wrong_version(stream, expected_version, version)
            if len(events) == 1:
                # One row: its rowid comes with the insert, not from a last_insert_rowid().
                cursor.execute(_INSERT, _row(namespace, stream, version + 1, events[0]))
                last_global = cursor.lastrowid
            elif len(events) <= _ONE_STATEMENT:
                cursor.execute(
                    _INSERTS[len(events)], _values(namespace, stream, version + 1, events)
                )
                last_global = cursor.lastrowid
            else:
                rows = [_row(namespace, stream, version + i, e) for i, e in enumerate(events, 1)]
                cursor.executemany(_INSERT, rows)
                last_global = cursor.execute("SELECT last_insert_rowid()").fetchone()[0]
            last = version + len(events)
            cursor.execute(_BUMP, (namespace, stream, last))
            if idempotency_key is not None:
                cursor.execute(
                    "INSERT INTO cf_idempotency VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (namespace, stream, idempotency_key, digest, version + 1, last, last_global),
                )
            return AppendResult(stream, version + 1, last, str(last_global))

        def committed(result: AppendResult) -> None:
            if not result.deduplicated:
                self._known.appended(namespace, stream, result.cursor, events)

        result = await db.write(work, committed)
        self.wakeups.notify(namespace, stream)
        return result

    async def read(
        self,
        namespace: str,
        stream: str,
        *,
        after: str | None,
        types: Sequence[str] | None,
        limit: int | None,
    ) -> ReadResult:
        target = parse_cursor(after)
        known = self._known

        def work(conn: sqlite3.Connection) -> ReadResult:
            checked = known.head(namespace, stream) == after
            if checked:  # nothing new after the head, unless another connection committed
                known.current(self._db.cursor)
                if known.head(namespace, stream) == after:
                    return ReadResult((), after)
            start: int | None = 0
            if target:
                # One read transaction: the cursor lookup and the page see one snapshot, so
                # a delete and recreate in between cannot continue an old cursor into a new
                # history without reset.
                conn.execute("BEGIN")
                row = conn.execute(
                    "SELECT position FROM cf_events"
                    " WHERE global_position = ? AND namespace = ? AND stream = ?",
                    (target, namespace, stream),
                ).fetchone()
                start = row[0] if row else None
            elif target is None:
                start = None
            reset = start is None
            sql = (
                f"SELECT {_COLUMNS} FROM cf_events"
                " WHERE namespace = ? AND stream = ? AND position > ?"
            )
            args: list[Any] = [namespace, stream, start or 0]
            if types is not None:
                sql += f" AND type IN ({','.join('?' * len(types))})"
                args.extend(types)
            sql += " ORDER BY position"
            if limit is not None:
                sql += " LIMIT ?"
                args.append(limit + 1)
            rows = conn.execute(sql, args).fetchall()
            more = limit is not None and len(rows) > limit
            if more:
                del rows[limit:]
            if conn.in_transaction:
                conn.execute("COMMIT")
            events = StoredEvent.from_rows(namespace, stream, rows)
            cursor = events[-1].cursor if events else (None if reset else after)
            if checked and types is None and not more:
                known.saw_head(namespace, stream, cursor)  # a whole page ends at the head
            return ReadResult(events, cursor, reset=reset, more=more)

        return await self._db.read(work)

    async def latest(
        self,
        namespace: str,
        stream: str,
        types: Sequence[str],
        *,
        before: str | None = None,
        limit: int = 1,
    ) -> tuple[StoredEvent, ...]:
        if not types:
            return ()
        bound = parse_cursor(before) if before is not None else None
        known = self._known
        key = (tuple(types), bound, limit)

        def work(conn: sqlite3.Connection) -> tuple[StoredEvent, ...]:
            known.current(self._db.cursor)
            found = known.latest(namespace, stream, key)
            if found is not None:
                return found
            sql = (
                f"SELECT {_COLUMNS} FROM cf_events WHERE namespace = ? AND stream = ?"
                f" AND type IN ({','.join('?' * len(types))})"
            )
            args: list[Any] = [namespace, stream, *types]
            if bound is not None:
                sql += " AND global_position < ?"
                args.append(bound)
            sql += " ORDER BY position DESC LIMIT ?"
            args.append(limit)
            events = StoredEvent.from_rows(namespace, stream, conn.execute(sql, args))
            known.saw_latest(namespace, stream, key, events)
            return events

        return await self._db.read(work)

    async def contains(self, namespace: str, stream: str, cursor: str) -> bool:
        target = parse_cursor(cursor)
        if not target:
            return False

        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT 1 FROM cf_events"
                " WHERE global_position = ? AND namespace = ? AND stream = ?",
                (target, namespace, stream),
            ).fetchone()
            return row is not None

        return await self._db.read(work)

    async def head(self, namespace: str, stream: str) -> str | None:
        known = self._known

        def work(conn: sqlite3.Connection) -> str | None:
            known.current(self._db.cursor)
            head = known.head(namespace, stream)
            if head is UNKNOWN:
                row = self._db.cursor.execute(_HEAD, (namespace, stream)).fetchone()
                head = str(row[0]) if row else None
                known.saw_head(namespace, stream, head)
            return head

        return await self._db.read(work)

    async def version(self, namespace: str, stream: str) -> int:
        def work(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT version FROM cf_streams WHERE namespace = ? AND stream = ?",
                (namespace, stream),
            ).fetchone()
            return int(row[0]) if row else 0

        return await self._db.read(work)

    async def delete_stream(self, namespace: str, stream: str) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            found = conn.execute(
                "DELETE FROM cf_streams WHERE namespace = ? AND stream = ?", (namespace, stream)
            ).rowcount
            conn.execute(
                "DELETE FROM cf_events WHERE namespace = ? AND stream = ?", (namespace, stream)
            )
            conn.execute(
                "DELETE FROM cf_idempotency WHERE namespace = ? AND stream = ?", (namespace, stream)
            )
            return found > 0

        found = await self._db.write(work, lambda found: self._known.deleted(namespace, stream))
        if found:
            self.wakeups.notify(namespace, stream)  # its tails signal the reset at once
        return found

    async def list_streams(
        self,
        namespace: str,
        *,
        prefix: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> tuple[StreamInfo, ...]:
        def work(conn: sqlite3.Connection) -> tuple[StreamInfo, ...]:
            sql = "SELECT stream, version FROM cf_streams WHERE namespace = ?"
            args: list[Any] = [namespace]
            if prefix:
                # substr comparison instead of LIKE: stream names may hold % and _.
                sql += " AND substr(stream, 1, ?) = ?"
                args.extend([len(prefix), prefix])
            if after is not None:
                # BINARY collation compares UTF-8 bytes: code point order, as sorted() does.
                sql += " AND stream > ?"
                args.append(after)
            sql += " ORDER BY stream"
            if limit is not None:
                sql += " LIMIT ?"
                args.append(limit)
            return tuple(StreamInfo(s, v) for s, v in conn.execute(sql, args))

        return await self._db.read(work)
