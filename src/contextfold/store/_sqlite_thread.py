"""One SQLite connection on one dedicated thread: the plumbing the SQLite stores share.

Every statement runs on the thread, so the event loop never blocks on disk and the
connection never changes threads. The first job connects (WAL, the caller's schema); a
failed connect is not kept, so the next job tries again. A job that fails leaves no
transaction open, and its sqlite3 errors enter the error tree here, in one place.

The connection keeps the files it opened even when their path is moved, deleted or
replaced; what it wrote then would be lost for whoever opens the path next. Connecting
notes which files (the database, its ``-wal`` and ``-shm``) the path names
(``_sqlite_files``), and :meth:`SQLiteThread.check_files` refuses a write once the path
names others. The WAL is
then checkpointed into the database file the connection holds and emptied: a renamed
file keeps all that was acknowledged without its WAL, and the WAL left under the old
name cannot be replayed into a file put in its place (SQLite itself skips the
checkpoint when it closes a moved database).

Writes (:meth:`SQLiteThread.write`) skip the thread hop when they cannot wait: with the
connection idle, nothing queued, the write lock free at once and a commit that does not
sync (``synchronous`` OFF or NORMAL), the write runs on the caller's thread; everything
that can wait (another process's lock, a syncing commit, the WAL checkpoint) goes to the
worker. There, every write queued meanwhile commits in one transaction (group commit),
each in its own savepoint so one refused write leaves the others. Between worker jobs the
connection rests without a busy wait or automatic checkpoints, so a statement on the
caller's thread never waits; each worker job sets both for its length.

Reads (:meth:`SQLiteThread.read`) skip the hop alike when they are short: with the
connection idle and nothing queued, a read runs on the caller's thread with SQLite's busy
wait off and a budget of virtual-machine steps; one that would wait on a lock or runs past
the budget (a long page) is undone and run on the worker instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..errors import (
    ConfigurationError,
    StorageFullError,
    StoreError,
    StoreFileMovedError,
    StoreUnavailableError,
)
from ._sqlite_files import OpenedFiles, read_only_uri
from .urls import sqlite_path_hint

__all__ = ["SQLiteThread"]

T = TypeVar("T")

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_CHECKPOINT_EVERY = 256  # commits on the caller's thread between checkpoints on the worker
_AUTOCHECKPOINT = 1000  # SQLite's default, in pages, for the worker's jobs
_CHECKPOINT_WAIT = 0.1  # seconds a checkpoint waits for writers and readers, then copies less
# An inline read gets this many calls of the progress handler, every _READ_STEPS VM steps:
# about a hundred rows of a page, well under a millisecond of the event loop's time.
_READ_STEPS = 1000
_READ_CALLS = 4
# What SQLite answers when the system refuses a write: SQLITE_FULL for a full disk (ENOSPC),
# SQLITE_IOERR_WRITE for a file-size quota (EFBIG, RLIMIT_FSIZE) or a failing device.
_REFUSED_WRITES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR_WRITE})


@dataclass
class _Write(Generic[T]):
    """A write waiting for the worker, and where its outcome goes."""

    fn: Callable[[sqlite3.Connection], T]
    committed: Callable[[T], None] | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T]
    outcome: list[Any] = field(default_factory=list)  # [result] or [None, exception]


class SQLiteThread:
    """Runs callables against one lazily opened connection on one worker thread.

    ``what`` names the database in error messages ("the journal"). ``synchronous`` trades
    power-loss safety for speed; ``busy_timeout`` (seconds) is how long a write waits on
    another process's lock. ``read_only``: open an existing database without creating,
    changing or migrating anything (the file must exist and hold ``required_table``), and
    refuse every write. Raises ConfigurationError for an unknown ``synchronous``.
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
        read_only: bool = False,
        required_table: str = "",
    ) -> None:
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}"
            )
        self.path = path
        self.url = f"sqlite:///{path}"
        self._schema = schema
        self._what = what
        self._thread_name = thread_name
        self._synchronous = synchronous.upper()
        self._inline_sync = self._synchronous in ("OFF", "NORMAL")  # a commit that never syncs
        self._busy_ms = int(busy_timeout * 1000)
        self._read_only = read_only
        self._required_table = required_table
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._cursor: sqlite3.Cursor | None = None  # the connection's, for every job
        self._closed = False
        self._files = OpenedFiles()
        # Held by whoever uses the connection: the worker for each job, or a write run on
        # the caller's thread (which never waits for it).
        self._busy = threading.Lock()
        self._queue = threading.Lock()
        self._pending: list[_Write[Any]] = []
        self._inline_commits = 0
        self._checkpointer: sqlite3.Connection | None = None  # the worker's, see _checkpoint
        self._checkpointing = False  # writes then queue for the worker (see _checkpoint)
        self._budget = -1  # progress-handler calls an inline read has left; -1: no budget
        self.immutable = False
        """Whether the open connection reads the file as immutable (read-only media): it
        never sees a later write, so it cannot follow one."""

    @property
    def connection(self) -> sqlite3.Connection | None:
        """The open connection, None before the first job; only for use on the worker."""
        return self._conn

    @property
    def cursor(self) -> sqlite3.Cursor:
        """A cursor of the connection, for the statements of a job (only inside one): one
        for all, instead of a new one per ``conn.execute``."""
        assert self._cursor is not None, "no job holds the connection"
        return self._cursor

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
            with self._busy:
                conn = self._conn if self._conn is not None else self._connect()
                # The worker may wait (a lock, a checkpoint); the connection rests without.
                conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
                conn.execute(f"PRAGMA wal_autocheckpoint = {_AUTOCHECKPOINT}")
                try:
                    return self._guarded(conn, fn)
                finally:
                    _rest(conn)

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` for a job that only reads: on this thread when it is short and cannot
        wait (see the module), else on the worker. ``fn`` may run twice (the first attempt
        undone), so it must not write. Raises as :meth:`run`."""
        here = self.read_here(fn)
        if here:
            return here[0]
        return await self.run(fn)

    def read_here(self, fn: Callable[[sqlite3.Connection], T]) -> list[T]:
        """:meth:`read` on this thread within the step budget: ``[value]``, or ``[]`` when
        it must go to the worker instead (busy, queued writes, a lock, a long read: await
        :meth:`run` then). Raises as :meth:`read`."""
        if self._closed:
            raise StoreUnavailableError(f"{self._what} at {self.url} is closed")
        conn = self._conn
        if conn is None or not self._busy.acquire(False):
            return []
        try:
            if self._pending:
                return []  # a read after a queued write sees it, as on the worker
            self._budget = _READ_CALLS
            try:
                return [fn(conn)]
            except sqlite3.Error:
                # Interrupted, busy, or a real failure: the worker runs it again and names it.
                _rollback(conn)
                return []
            except BaseException:
                _rollback(conn)
                raise
            finally:
                self._budget = -1
        finally:
            self._busy.release()

    def _over_budget(self) -> bool:
        """The progress handler: True interrupts the statement. Only an inline read has a
        budget; every job on the worker runs to its end."""
        if self._budget < 0:
            return False
        self._budget -= 1
        return self._budget < 0

    def _guarded(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return fn(conn)
        except BaseException as exc:
            raise self._failed(conn, exc)  # noqa: B904 - _failed names the cause itself

    def _failed(self, conn: sqlite3.Connection, exc: BaseException) -> BaseException:
        """Undo the transaction a failed job left; what to raise for ``exc``."""
        _rollback(conn)
        if isinstance(exc, StoreFileMovedError):
            _settle(conn)
        elif isinstance(exc, sqlite3.Error):
            return self._store_error(exc)
        return exc

    def _store_error(self, exc: sqlite3.Error) -> StoreError:
        failure: StoreError
        if getattr(exc, "sqlite_errorcode", None) in _REFUSED_WRITES:
            failure = StorageFullError(
                f"{self._what} at {self.url} cannot grow: the disk is full or the file "
                f"reached a size quota ({exc}); nothing was written: free space or raise "
                "the quota, then retry"
            )
        else:
            failure = StoreError(f"SQLite error on {self._what} at {self.url}: {exc}")
        failure.__cause__ = exc
        return failure

    async def write(
        self,
        fn: Callable[[sqlite3.Connection], T],
        committed: Callable[[T], None] | None = None,
    ) -> T:
        """``fn(conn)`` inside a write transaction, committed after the moved-file check.

        ``fn`` neither begins nor ends the transaction; an exception it raises undoes what
        it wrote and nothing else. Writes queued together share one commit; a failed commit
        or moved file fails each of them (nothing is acknowledged). ``committed(value)``
        runs once the commit succeeded, still holding the connection. Raises as :meth:`run`.
        """
        here = self.write_here(fn, committed)
        if here:
            return here[0]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        job = _Write(fn, committed, loop, future)
        with self._queue:
            self._pending.append(job)
            first = len(self._pending) == 1
        if first:
            # The flush resolves every job it takes; when it cannot run at all (closed, the
            # database cannot be opened) the jobs still queued get its error.
            asyncio.ensure_future(self.run(self._flush)).add_done_callback(self._unflushed)
        return await future

    def _unflushed(self, flushed: asyncio.Future[None]) -> None:
        if flushed.cancelled() or flushed.exception() is None:
            return
        with self._queue:
            jobs, self._pending = self._pending, []
        for job in jobs:
            job.loop.call_soon_threadsafe(_resolve, job.future, [None, flushed.exception()])

    def write_here(
        self,
        fn: Callable[[sqlite3.Connection], T],
        committed: Callable[[T], None] | None = None,
    ) -> list[T]:
        """:meth:`write` on this thread when that cannot wait on anything: ``[value]``, or
        ``[]`` when it must go to the worker (await :meth:`write` then). Raises as it."""
        if self._closed:
            raise StoreUnavailableError(f"{self._what} at {self.url} is closed")
        conn = self._conn
        if conn is None or self._checkpointing or self._read_only or not self._inline_sync:
            return []
        if not self._busy.acquire(False):
            return []
        try:
            if self._pending:
                return []  # queued writes keep their order
            cursor = self._cursor
            assert cursor is not None
            try:
                cursor.execute("BEGIN IMMEDIATE")  # resting: no busy wait
            except sqlite3.OperationalError:
                return []  # another writer holds the lock: wait on the worker
            try:
                value = fn(conn)
                self.check_files()  # the last moment before the write is acknowledged
                # Resting, the commit does not checkpoint (that syncs the database file):
                # the worker does, every _CHECKPOINT_EVERY commits made here.
                cursor.execute("COMMIT")
            except BaseException as exc:
                raise self._failed(conn, exc)  # noqa: B904 - _failed names the cause itself
            if committed is not None:
                committed(value)
        finally:
            self._busy.release()
        self._inline_commits += 1
        if self._inline_commits % _CHECKPOINT_EVERY == 0 and self._executor is not None:
            self._executor.submit(self._checkpoint)
        return [value]

    def _flush(self, conn: sqlite3.Connection) -> None:
        """On the worker: commit every queued write in one transaction, then resolve each."""
        with self._queue:
            jobs, self._pending = self._pending, []
        jobs = [job for job in jobs if not job.future.cancelled()]
        try:
            if jobs:
                self._guarded(conn, lambda conn: self._commit_together(conn, jobs))
        except BaseException as exc:
            for job in jobs:
                job.outcome[:] = [None, exc]
        else:
            for job in jobs:
                if job.committed is not None and len(job.outcome) == 1:
                    job.committed(job.outcome[0])
        for job in jobs:
            job.loop.call_soon_threadsafe(_resolve, job.future, job.outcome)

    def _commit_together(self, conn: sqlite3.Connection, jobs: list[_Write[Any]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        for job in jobs:
            conn.execute("SAVEPOINT cf_write")
            try:
                job.outcome[:] = [job.fn(conn)]
            except Exception as exc:
                if not conn.in_transaction:
                    # SQLite rolled the whole transaction back (a full disk may), the jobs
                    # before this one with it: each of them fails with this error.
                    raise
                conn.execute("ROLLBACK TO cf_write")
                failure = self._store_error(exc) if isinstance(exc, sqlite3.Error) else exc
                job.outcome[:] = [None, failure]
            conn.execute("RELEASE cf_write")
        self.check_files()  # the last moment before the writes are acknowledged
        conn.execute("COMMIT")

    def _checkpoint(self) -> None:
        """On the worker, beside the connection (which goes on meanwhile, on the caller's
        thread too): copy the WAL into the database file through a connection of its own to
        the files the connection holds. Best effort: the next one tries again.

        PASSIVE copies the bulk while appends go on, then FULL the few frames appended
        meanwhile, holding writers back: the whole WAL is copied and the next write starts
        the WAL over. PASSIVE alone, racing a steady stream of appends, never ends with
        nothing left to copy, and the WAL then grows without end, every commit and page
        lookup slower for it. During the FULL one this process's appends queue on this
        worker instead of taking the write lock it waits for."""
        files = self._files.files
        if self._conn is None or self._read_only or not files or self._files.moved():
            return  # a moved file is settled through the connection that holds it
        try:
            if self._checkpointer is None:
                # mode=rw: never creates a file, should the path name none after the check.
                uri = Path(files[0][0]).as_uri() + "?mode=rw"
                self._checkpointer = sqlite3.connect(
                    uri, uri=True, timeout=_CHECKPOINT_WAIT, check_same_thread=False
                )
            self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # the bulk
            self._checkpointing = True
            self._checkpointer.execute("PRAGMA wal_checkpoint(FULL)").fetchall()  # the rest
        except sqlite3.Error:
            pass
        finally:
            self._checkpointing = False

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
        if self._read_only:
            return self._connect_existing()
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
            self._files = OpenedFiles.identify(self.path)
            _rest(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, (sqlite3.Error, OSError)):
                raise self._unavailable(exc) from exc
            raise
        self._cursor = conn.cursor()
        conn.set_progress_handler(self._over_budget, _READ_STEPS)
        self._conn = conn
        return conn

    def _connect_existing(self) -> sqlite3.Connection:
        # Never creates the file (nor its directory); query_only refuses writes. A file this
        # process may not write is opened read-only (see read_only_open).
        if self.path in ("", ":memory:") or not Path(self.path).is_file():
            raise StoreUnavailableError(
                f"cannot open {self._what} at {self.url}: the file {self.path} does not "
                f"exist{sqlite_path_hint(self.path)} (nothing was created); check the path"
            )
        try:
            uri, how = read_only_uri(self.path)
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        except (sqlite3.Error, OSError) as exc:
            raise self._unavailable(exc) from exc
        try:
            conn.execute("PRAGMA query_only = ON")
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                (self._required_table,),
            ).fetchone()
            if self._required_table and found is None:
                raise StoreUnavailableError(
                    f"{self.path} is not {self._what} (it has no {self._required_table} "
                    f"table): check the path"
                )
            self._files = OpenedFiles.identify(self.path)
            _rest(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error) and how == "ro":
                raise self._unreadable_here(exc) from exc
            if isinstance(exc, (sqlite3.Error, OSError)):
                raise self._unavailable(exc) from exc
            raise
        self._cursor = conn.cursor()
        conn.set_progress_handler(self._over_budget, _READ_STEPS)
        self._conn = conn
        self.immutable = how == "immutable"
        return conn

    def _unreadable_here(self, exc: sqlite3.Error) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"cannot open {self._what} at {self.url} read-only: {exc}. This user may not "
            f"write {self.path} or its folder, and SQLite reads the file (a WAL database) "
            "only through a -shm file beside it, which it cannot create there while no "
            "writer has the file open; read it as a user who may write the folder, while a "
            "writer has it open, or from a copy (it is read as immutable only on read-only "
            "media, where nothing can change it)"
        )

    def check_files(self) -> None:
        """Raise StoreFileMovedError when the path no longer names the files the connection
        opened (moved, deleted or replaced, the ``-wal`` and ``-shm`` too). Call it on the
        worker inside a write transaction, just before COMMIT: the transaction then rolls
        back and nothing is acknowledged. One ``stat`` per file, or of their directory
        alone while it is unchanged (see :class:`OpenedFiles`)."""
        moved = self._files.moved()
        if moved is not None:
            raise StoreFileMovedError(
                f"{self._what} file {self.path} was moved or deleted while open ({moved}); "
                "nothing was written: close and reopen it (what was written before is in "
                "the file that moved)",
                path=self.path,
            )

    def _unavailable(self, exc: Exception) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"cannot open {self._what} at {self.url}: {exc}{sqlite_path_hint(self.path)}; "
            "check the path and its permissions, then retry"
        )

    def _disconnect(self) -> None:
        with self._busy:
            self._disconnect_now()

    def _disconnect_now(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._conn is not None:
            if self._files.moved() is not None:
                _settle(self._conn)
            self._conn.close()
            self._conn = None
            self._cursor = None


def _rest(conn: sqlite3.Connection) -> None:
    """The connection's settings between worker jobs, as the caller's thread uses it: no
    busy wait (a lock sends the job to the worker) and no automatic checkpoint."""
    conn.execute("PRAGMA busy_timeout = 0")
    conn.execute("PRAGMA wal_autocheckpoint = 0")


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _settle(conn: sqlite3.Connection, mode: str = "TRUNCATE") -> None:
    """Checkpoint the WAL into the (moved) database file the connection holds and empty it;
    best effort: a failure leaves the files as SQLite had them."""
    with contextlib.suppress(sqlite3.Error):
        conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()


def _resolve(future: asyncio.Future[Any], outcome: list[Any]) -> None:
    if future.cancelled():
        return
    if len(outcome) == 2:
        future.set_exception(outcome[1])
    else:
        future.set_result(outcome[0])
