"""One SQLite connection on one dedicated thread: the plumbing the SQLite stores share.

Every statement runs on the thread, so the event loop never blocks on disk and the
connection never changes threads. The first job connects (WAL, the caller's schema); a
failed connect is not kept, so the next job tries again. A job that fails leaves no
transaction open, and its sqlite3 errors enter the error tree here, in one place.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from ..errors import StoreError, StoreUnavailableError

__all__ = ["SQLiteThread"]

T = TypeVar("T")

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class SQLiteThread:
    """Runs callables against one lazily opened connection on one worker thread.

    ``what`` names the database in error messages ("the journal"). ``synchronous`` trades
    power-loss safety for speed; ``busy_timeout`` (seconds) is how long a write waits on
    another process's lock. Raises ValueError for an unknown ``synchronous``.
    """

    def __init__(
        self,
        path: str,
        *,
        schema: str,
        what: str,
        thread_name: str,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
    ) -> None:
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
        self.path = path
        self.url = f"sqlite:///{path}"
        self._schema = schema
        self._what = what
        self._thread_name = thread_name
        self._synchronous = synchronous.upper()
        self._busy_ms = int(busy_timeout * 1000)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    @property
    def connection(self) -> sqlite3.Connection | None:
        """The open connection, None before the first job; only for use on the worker."""
        return self._conn

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` on the worker. Raises StoreUnavailableError when closed or when the
        database cannot be opened, StoreError for a failed statement (rolled back)."""
        if self._closed:
            raise StoreUnavailableError(f"{self._what} at {self.url} is closed")
        if self._executor is None:
            # Created without an await in between, so concurrent first calls share it; its
            # one worker runs jobs in order, so only the first job connects.
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._thread_name)

        def call() -> T:
            conn = self._conn if self._conn is not None else self._connect()
            try:
                return fn(conn)
            except sqlite3.Error as exc:
                _rollback(conn)
                raise StoreError(f"SQLite error on {self._what} at {self.url}: {exc}") from exc
            except BaseException:
                _rollback(conn)
                raise

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def open(self) -> None:
        """Connect now rather than on the first statement."""
        await self.run(lambda conn: None)

    async def close(self) -> None:
        """Close the connection and stop the worker; later calls raise. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._executor is not None:
            # On the worker, after any job still running (one may be connecting). Queued and
            # shut down before the await, and the wait shielded: a close cancelled while a
            # job runs still disconnects and stops the worker, instead of leaving both.
            disconnected = self._executor.submit(self._disconnect)
            self._executor.shutdown(wait=False)
            await asyncio.shield(asyncio.wrap_future(disconnected))

    def _connect(self) -> sqlite3.Connection:
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (sqlite3.Error, OSError) as exc:
            raise self._unavailable(exc) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.executescript(self._schema)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, (sqlite3.Error, OSError)):
                raise self._unavailable(exc) from exc
            raise
        self._conn = conn
        return conn

    def _unavailable(self, exc: Exception) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"cannot open {self._what} at {self.url}: {exc}; "
            "check the path and its permissions, then retry"
        )

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")
