"""The PostgreSQL store: one database shared by many processes and hosts.

Every append runs in one transaction that first upserts the stream's ``cf_streams`` row
(which locks it and bumps its version), then checks the idempotency key and inserts the
events. Writers of one stream therefore queue on that row lock, positions are computed
under it, and global positions (an identity column, never reused) are drawn only after
it, so they grow with positions inside a stream. An append is one statement (one round
trip) unless it has an idempotency key: then two, pipelined. Every committed append
sends a NOTIFY right after its commit, from a task that sends what appends committed
meanwhile in one statement (see ``_NOTIFY_MANY`` for why not inside the append);
``subscribe`` wakes on it through one listening connection per store and re-reads every
``poll_fallback`` seconds anyway, so a lost notification only delays. A notification names
the stream (by a hash) and its version and head after the append (:func:`parse_wake`), so a
listener can tell a change it has seen from a new one without asking the database.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, NoReturn, TypeVar, cast

import psycopg
from psycopg.rows import AsyncRowFactory, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from .._aio import CancelWatch
from ..errors import InvalidInputError, StoreError, StoreUnavailableError
from ..events import NewEvent, StoredEvent
from ._postgres_changes import change_feed, listening
from ._postgres_errors import driver_error, redact_url
from ._postgres_pool import DEFAULT_POOL_TIMEOUT, pool_options
from ._postgres_sql import (
    _CHANNEL_SEP,
    _COLUMNS,
    _INSERT,
    _INSERT_ANY,
    _INSERT_AT,
    _INSERT_EXPECTED,
    _LOCK,
    _LOOK,
    _NOTIFY_MANY,
    _READ,
    _READ_AFTER,
    _SCHEMA,
    _SCHEMA_LOCK,
    _SCHEMA_PRESENT,
    _SEEN,
    _TYPED,
    _WHERE,
    NOTIFY_CHANNEL,
)
from ._postgres_wake import Wake, _wake_key, parse_wake, wake_key
from .base import (
    AppendResult,
    ReadResult,
    Store,
    StreamChange,
    StreamInfo,
    TailPages,
    TailReset,
    batch_digest,
    idempotency_conflict,
    parse_cursor,
    wait_or_timeout,
    wrong_version,
)

__all__ = [
    "NOTIFY_CHANNEL",
    "PostgresStore",
    "Wake",
    "driver_error",
    "parse_wake",
    "redact_url",
    "wake_key",
]

R = TypeVar("R")

_DRAIN = 5.0  # seconds a closing store waits for its last wake-ups to be sent
_NOTIFY_WINDOW = 0.005  # seconds a wake-up waits for others to share its statement


class PostgresStore(Store):
    """A store in a PostgreSQL database, safe for many processes appending at once.

    ``min_size``/``max_size`` size the connection pool, ``timeout`` (seconds, 5 by
    default) bounds the wait for a connection: a call while the database is down raises
    StoreUnavailableError within it, and the first call after it is back up connects
    again (see :mod:`._postgres_pool`). ``poll_fallback`` is how often (seconds) a live
    tail re-reads when no notification came. Driver errors surface as StoreError, or
    StoreUnavailableError when the server cannot be reached.
    """

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = DEFAULT_POOL_TIMEOUT,
        poll_fallback: float = 2.0,
    ) -> None:
        if not 0 <= min_size <= max_size or max_size < 1 or min(timeout, poll_fallback) <= 0:
            raise InvalidInputError(
                "PostgresStore needs 0 <= min_size <= max_size, max_size >= 1 and positive "
                f"timeout and poll_fallback; got {min_size=}, {max_size=}, {timeout=}, "
                f"{poll_fallback=}"
            )
        self.url = url
        self._safe_url = redact_url(url)
        self._min_size = min_size
        self._max_size = max_size
        self._timeout = timeout
        self._poll_fallback = poll_fallback
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._closed = False
        self._wakers: dict[str, set[asyncio.Event]] = {}
        self._listener: psycopg.AsyncConnection[Any] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._open_lock = asyncio.Lock()
        self._listen_lock = asyncio.Lock()
        self._next_listen = 0.0
        # Wake keys of committed appends, not yet sent: the stream's newest head and version.
        self._outbox: dict[str, tuple[int, int]] = {}
        self._sender: asyncio.Task[None] | None = None

    # -- plumbing -------------------------------------------------------------------------

    def _fail(self, exc: Exception, doing: str) -> NoReturn:
        raise driver_error(exc, self._safe_url, doing) from exc

    @contextlib.asynccontextmanager
    async def _connection(self, doing: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._closed or self._pool is None:
            state = "closed" if self._closed else "not open (call open() first)"
            raise StoreUnavailableError(f"the journal at {self._safe_url} is {state}")
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, OSError) as exc:
            self._fail(exc, doing)

    async def _query(
        self, doing: str, sql: str, args: dict[str, Any], rows: AsyncRowFactory[R]
    ) -> list[R]:
        async with self._connection(doing) as conn:
            cur = conn.cursor(binary=True, row_factory=rows)
            await cur.execute(sql, args)
            return await cur.fetchall()

    async def open(self) -> None:
        """Open the pool and create the tables if they are missing (safe from many processes)."""
        async with self._open_lock:
            if self._closed:
                raise StoreUnavailableError(f"the journal at {self._safe_url} is closed")
            if self._pool is not None:
                return
            pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
                self.url,
                min_size=self._min_size,
                max_size=self._max_size,
                open=False,
                name="contextfold",
                **pool_options(self.url, self._timeout),
            )
            try:
                await pool.open(wait=True, timeout=self._timeout)
                async with pool.connection() as conn:
                    present = await (await conn.execute(_SCHEMA_PRESENT)).fetchone()
                    if not (present and present[0]):
                        # CREATE ... IF NOT EXISTS races with itself: serialise the openers.
                        async with conn.transaction():
                            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                            await conn.execute(_SCHEMA)
            except BaseException as exc:
                await pool.close()
                if isinstance(exc, (psycopg.Error, OSError)):
                    self._fail(exc, "opening the journal")
                raise
            if self._closed:  # closed while this opened: the pool must not outlive the store
                await asyncio.shield(pool.close())
                raise StoreUnavailableError(f"the journal at {self._safe_url} is closed")
            self._pool = pool

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        sender = self._sender
        if sender is not None:
            await asyncio.wait({sender}, timeout=_DRAIN)
            sender.cancel()
            await asyncio.wait({sender})
        await self._stop_listening()
        self._wake_all()
        if self._pool is not None:
            await self._pool.close()

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
        n = len(events)
        digest = batch_digest(events) if idempotency_key is not None else None
        metas = [e.meta for e in events]
        wake = _wake_key(namespace, stream)
        args: dict[str, Any] = {
            "ns": namespace,
            "s": stream,
            "n": n,
            "key": idempotency_key,
            "digest": digest,
            "types": [e.type for e in events],
            "data": [e.data for e in events],
            "ids": [m.event_id for m in metas],
            "times": [m.time for m in metas],
            "runs": [m.run_id for m in metas],
            "actors": [m.actor for m in metas],
            "keys": [m.idempotency_key for m in metas],
            "chans": [_CHANNEL_SEP.join(m.channels) for m in metas],
        }
        doing = f"appending to stream {stream!r}"
        outcome: AppendResult | StoreError | None = None
        if idempotency_key is None:
            # Checked (at an expected version), locked and inserted by one statement, its own
            # transaction under autocommit: one round trip, and no pipeline to drive.
            if expected_version is None:
                sql = _INSERT_ANY
            else:
                sql = _INSERT_AT if expected_version > 0 else _INSERT_EXPECTED
            async with self._connection(doing) as conn:
                cur = await conn.execute(sql, {**args, "expected": expected_version})
                rows = await cur.fetchall()
        else:
            inserted: psycopg.AsyncCursor[Any] | None = None
            async with self._connection(doing) as conn, _pipeline(conn):
                async with conn.transaction() as tx:
                    # The key is checked under the stream's lock: two round trips.
                    locked = await conn.execute(_LOCK, args)
                    seen = await conn.execute(_SEEN, args)
                    row = await locked.fetchone()
                    assert row is not None
                    found = await seen.fetchone()
                    outcome = _early_outcome(
                        stream, idempotency_key, digest, found, expected_version, row[0] - n
                    )
                    if outcome is not None:
                        raise psycopg.Rollback(tx)
                    inserted = await conn.execute(_INSERT, args)
                # Fetched after COMMIT so the insert and the commit share one round trip.
                rows = await inserted.fetchall() if inserted is not None else []
        if isinstance(outcome, StoreError):
            raise outcome
        if outcome is not None:
            return outcome
        if not rows:  # the expected version differed: nothing was written
            assert expected_version is not None
            raise wrong_version(stream, expected_version, await self.version(namespace, stream))
        version, _, previous = rows[0]
        # A row per event; global positions grow with positions inside a stream (drawn
        # under its lock), so their order is the batch's.
        globals_ = sorted([row[1] for row in rows]) if n > 1 else [rows[0][1]]
        last_global = globals_[-1]
        self._wake(wake)
        self._post(wake, version + n, last_global)
        return AppendResult(
            stream,
            version + 1,
            version + n,
            str(last_global),
            cursors=tuple(map(str, globals_)) if n > 1 else (),
            # None from an append with no check (see _INSERT_ANY); one at an expected
            # version or under the lock statement saw the live history.
            previous=None if previous is None else str(previous),
        )

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
        typed = _TYPED if types is not None else ""
        args: dict[str, Any] = {
            "ns": namespace,
            "s": stream,
            "g": target,
            "types": list(types or ()),
            "limit": None if limit is None else limit + 1,
        }
        async with self._connection(f"reading stream {stream!r}") as conn:
            cur = conn.cursor(binary=True, row_factory=_events_of(namespace, stream))
            rows: list[StoredEvent | None] = []
            if target:
                await cur.execute(_READ_AFTER.format(typed=typed), args)
                rows = await cur.fetchall()
            reset = target is None or (target != 0 and not rows)
            if target == 0 or reset:
                await cur.execute(_READ.format(typed=typed), args)
                rows = await cur.fetchall()
        if rows and rows[0] is None:  # a known cursor with nothing after it
            rows = []
        more = limit is not None and len(rows) > limit
        if more:
            del rows[limit:]
        events = cast(tuple[StoredEvent, ...], tuple(rows))  # no None is left
        cursor = events[-1].cursor if events else (None if reset else after)
        return ReadResult(events, cursor, reset=reset, more=more)

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
        sql = f"SELECT {_COLUMNS} FROM cf_events WHERE {_WHERE} {_TYPED}"
        if bound is not None:
            sql += " AND global_position < %(bound)s"
        sql += " ORDER BY position DESC LIMIT %(limit)s"
        args = {"ns": namespace, "s": stream, "types": list(types), "bound": bound}
        args["limit"] = max(limit, 0)
        rows = await self._query(
            f"reading stream {stream!r}", sql, args, _events_of(namespace, stream)
        )
        return cast(tuple[StoredEvent, ...], tuple(rows))

    async def latest_at_head(
        self, namespace: str, stream: str, types: Sequence[str]
    ) -> tuple[int, str | None, StoredEvent | None]:
        """One statement: one snapshot, so the three agree (the head tells a history made
        again at the same version from the old one)."""
        args = {"ns": namespace, "s": stream, "types": list(types)}
        async with self._connection(f"reading stream {stream!r}") as conn:
            cur = await conn.cursor(binary=True).execute(_LOOK, args)
            row = await cur.fetchone()
        assert row is not None  # one row, whatever the stream holds
        version, head = row[0], row[1]
        found = None if row[2] is None else StoredEvent.from_row(namespace, stream, row[2:])
        return int(version or 0), None if head is None else str(head), found

    async def contains(self, namespace: str, stream: str, cursor: str) -> bool:
        target = parse_cursor(cursor)
        if not target:
            return False
        sql = f"SELECT 1 FROM cf_events WHERE global_position = %(g)s AND {_WHERE}"
        args = {"g": target, "ns": namespace, "s": stream}
        return bool(await self._query(f"reading stream {stream!r}", sql, args, tuple_row))

    async def head(self, namespace: str, stream: str) -> str | None:
        sql = f"SELECT global_position FROM cf_events WHERE {_WHERE} ORDER BY position DESC LIMIT 1"
        args = {"ns": namespace, "s": stream}
        rows = await self._query(f"reading stream {stream!r}", sql, args, tuple_row)
        return str(rows[0][0]) if rows else None

    async def version(self, namespace: str, stream: str) -> int:
        sql = f"SELECT version FROM cf_streams WHERE {_WHERE}"
        args = {"ns": namespace, "s": stream}
        rows = await self._query(f"reading stream {stream!r}", sql, args, tuple_row)
        return int(rows[0][0]) if rows else 0

    async def delete_stream(self, namespace: str, stream: str) -> bool:
        wake = _wake_key(namespace, stream)
        args = {"ns": namespace, "s": stream, "wake": wake}
        async with (
            self._connection(f"deleting stream {stream!r}") as conn,
            _pipeline(conn),
            conn.transaction(),
        ):
            # The stream row first: it waits for running appends, and the deletes after
            # it take a new snapshot that sees what those appends wrote.
            found = await conn.execute(f"DELETE FROM cf_streams WHERE {_WHERE}", args)
            await conn.execute(f"DELETE FROM cf_events WHERE {_WHERE}", args)
            await conn.execute(f"DELETE FROM cf_idempotency WHERE {_WHERE}", args)
            # Sent at commit (and only then): the stream's tails signal the reset at once.
            args["wake"] = f"{wake} 0"  # version 0, no head
            await conn.execute(f"SELECT pg_notify('{NOTIFY_CHANNEL}', %(wake)s)", args)
        self._wake(wake)
        return found.rowcount > 0

    async def list_streams(
        self,
        namespace: str,
        *,
        prefix: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> tuple[StreamInfo, ...]:
        sql = "SELECT stream, version FROM cf_streams WHERE namespace = %(ns)s"
        if prefix:
            # The range lets the primary key serve the scan; starts_with is exact (no LIKE escapes).
            sql += " AND stream >= %(p)s AND starts_with(stream, %(p)s)"
        if after is not None:
            sql += " AND stream > %(after)s"  # COLLATE "C": code point order
        sql += " ORDER BY stream LIMIT %(limit)s"
        args = {"ns": namespace, "p": prefix, "after": after, "limit": limit}
        doing = f"listing the streams of namespace {namespace!r}"
        rows = await self._query(doing, sql, args, tuple_row)
        return tuple(StreamInfo(s, int(v)) for s, v in rows)

    def subscribe(
        self, namespace: str, stream: str, *, after: str | None, poll_interval: float = 0.05
    ) -> AsyncIterator[StoredEvent | TailReset]:
        return self._tail(namespace, stream, after, poll_interval)

    def change_key(self, namespace: str, stream: str) -> str:
        return _wake_key(namespace, stream)

    def listen_changes(
        self,
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[StreamChange]]:
        """The NOTIFYs on :data:`NOTIFY_CHANNEL`, through a connection of its own."""
        return change_feed(self.url, self._timeout, self._fail)

    # -- live tail ------------------------------------------------------------------------

    async def _tail(
        self, namespace: str, stream: str, after: str | None, poll_interval: float
    ) -> AsyncIterator[StoredEvent | TailReset]:
        key = _wake_key(namespace, stream)
        wake = asyncio.Event()
        self._wakers.setdefault(key, set()).add(wake)
        pages = TailPages(self, namespace, stream, after)  # bounded in bytes
        cancel = CancelWatch()  # the pool may swallow a cancel (Python 3.11's wait_for)
        try:
            while True:
                listening = await self._ensure_listening()
                # Cleared before the read: a NOTIFY for anything the read misses wakes the wait.
                wake.clear()
                reset, events = await pages.read()
                cancel.check()
                if reset is not None:
                    yield reset
                while events:
                    yield events.pop()
                if pages.more:
                    continue
                timeout = max(poll_interval, self._poll_fallback) if listening else poll_interval
                await wait_or_timeout(wake, timeout)
                cancel.check()
        finally:
            waiters = self._wakers.get(key)
            if waiters is not None:
                waiters.discard(wake)
                if not waiters:
                    del self._wakers[key]
            if not self._wakers:
                await self._stop_listening()

    async def _ensure_listening(self) -> bool:
        """Start the shared listener if needed; False while it cannot (tails then poll)."""
        if self._pump is not None and not self._pump.done():
            return True
        async with self._listen_lock:
            if self._pump is not None and not self._pump.done():
                return True
            await self._stop_listening()
            loop = asyncio.get_running_loop()
            if self._closed or loop.time() < self._next_listen:
                return False
            try:
                conn = await listening(self.url, self._timeout)
            except (psycopg.Error, OSError):
                self._next_listen = loop.time() + self._poll_fallback
                return False
            if self._closed:  # closed while this connected: nothing may outlive the store
                await conn.close()
                return False
            self._listener = conn
            self._pump = asyncio.create_task(self._pump_notifies(conn), name="contextfold-listen")
            # Wake-ups sent while nobody listened are lost: have every tail re-read.
            self._wake_all()
            return True

    async def _pump_notifies(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            async for notify in conn.notifies():
                self._wake(parse_wake(notify.payload).key)
        except (psycopg.Error, OSError):
            pass  # the tails fall back to polling and reconnect the listener
        finally:
            self._wake_all()

    async def _stop_listening(self) -> None:
        pump, conn = self._pump, self._listener
        self._pump = self._listener = None
        try:
            if pump is not None:
                pump.cancel()
                # Not ``await pump`` under a suppress: that would also swallow a cancel of
                # this task (a consumer cancelled as it closes its tail). asyncio.wait ignores
                # the pump's own CancelledError and lets this task's propagate.
                await asyncio.wait({pump})
        finally:
            if conn is not None:
                await conn.close()

    # -- wake-ups of other processes ------------------------------------------------------

    def _post(self, key: str, version: int, head: int) -> None:
        """Have the NOTIFY of a committed append sent (with any others posted meanwhile): one
        per stream, naming the newest ``head`` (global position) posted and its ``version``."""
        posted = self._outbox.get(key)
        if posted is None or head > posted[0]:
            self._outbox[key] = (head, version)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_wakeups(), name="contextfold-notify")

    async def _send_wakeups(self) -> None:
        # The pool, not _connection: a closing store still sends what it has posted.
        while self._outbox and self._pool is not None:
            if not self._closed:
                await asyncio.sleep(_NOTIFY_WINDOW)  # the appends committing meanwhile join
            keys = [f"{k} {v} {g}" for k, (g, v) in sorted(self._outbox.items())]
            self._outbox.clear()
            try:
                async with self._pool.connection() as conn:
                    await conn.execute(_NOTIFY_MANY, {"keys": keys})
            except (psycopg.Error, OSError, PoolTimeout, PoolClosed):
                return  # listeners re-read every poll_fallback: a lost wake-up only delays

    def _wake(self, key: str) -> None:
        for waiter in self._wakers.get(key, ()):
            waiter.set()

    def _wake_all(self) -> None:
        for waiters in self._wakers.values():
            for waiter in waiters:
                waiter.set()


def _early_outcome(
    stream: str,
    key: str | None,
    digest: str | None,
    seen: tuple[Any, ...] | None,
    expected: int | None,
    version: int,
) -> AppendResult | StoreError | None:
    """A retry's original result, a refusal, or None when the append goes ahead."""
    if seen is not None and key is not None:
        if seen[0] != digest:
            return idempotency_conflict(stream, key)
        return AppendResult(stream, seen[1], seen[2], str(seen[3]), deduplicated=True)
    if expected is not None and expected != version:
        return wrong_version(stream, expected, version)
    return None


def _events_of(namespace: str, stream: str) -> AsyncRowFactory[StoredEvent | None]:
    """A row factory building the StoredEvents of one stream straight from the driver's rows.

    The all-NULL row that ``_READ_AFTER`` returns for a known cursor becomes None.
    """

    def event(row: Sequence[Any]) -> StoredEvent | None:
        if row[0] is None:
            return None
        return StoredEvent.from_row(namespace, stream, row)

    return lambda cursor: event


def _pipeline(conn: psycopg.AsyncConnection[Any]) -> contextlib.AbstractAsyncContextManager[Any]:
    return conn.pipeline() if psycopg.AsyncPipeline.is_supported() else contextlib.nullcontext()
