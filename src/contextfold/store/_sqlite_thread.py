"""One SQLite connection on one dedicated thread: the plumbing the SQLite stores share.

Jobs run on the thread in the order they were asked for, so the event loop never blocks
on disk or a lock, and a read asked after a write sees it. Reads share the writer's
connection rather than having one of their own: one connection is what lets a store
answer heads from what it wrote (``_sqlite_known``). The first job connects (WAL, the
caller's schema); a failed connect is not kept, so the next job tries again. A job that
fails leaves no transaction open, and its sqlite3 errors enter the error tree here, in
one place.

Writes (:meth:`SQLiteThread.write`) queued one after another, with no other job between,
commit in one transaction (group commit), each in its own savepoint so one refused write
leaves the others. Jobs reach the thread at the end of the event loop's current step, so
the writes queued in one step (a ``gather``) share a commit. Only a write waits for
another process's lock (``busy_timeout``; in WAL mode a read does not wait for writers),
and only on the thread: the connection rests without a busy wait, which the thread sets
for the length of each commit.

Two shortcuts, kept for speed, skip the hop to the thread and back while the connection
is idle and nothing is queued (which they would overtake):

- a write that cannot wait on anything commits on the caller's thread (the write lock
  free at once, and a commit that does not sync: ``synchronous`` OFF or NORMAL). The hop
  costs about what a single-event append costs itself, more on a busy machine, and the
  journal's benchmark holds a single append within 1.5 times the bare driver's: about
  1.3 with the shortcut, about 1.8 to 2.3 without;
- a read (:meth:`SQLiteThread.read`) runs on the caller's thread within a budget of
  virtual-machine steps (about a hundred rows, well under a millisecond); one that runs
  past it (a long page) or fails is undone and run on the thread. A warm fold read,
  answered from what the store knows, takes about 15 us so and about 100 us with the
  hop, and the fold-read benchmark holds warm reads where they were.

Anything else queues for the thread.

The WAL stays bounded without a commit ever checkpointing it (that syncs the database
file, which on the caller's thread would block the event loop): every
``_CHECKPOINT_EVERY`` commits the thread copies the WAL into the database file after its
jobs, holding the connection, so no write of this process races it; it copies the whole
WAL, and the next write starts the WAL over.

The connection keeps the files it opened even when their path is moved, deleted or
replaced; what it wrote then would be lost for whoever opens the path next. Connecting
notes which files (the database, its ``-wal`` and ``-shm``) the path names
(``_sqlite_files``), and every commit of :meth:`SQLiteThread.write` is refused once the
path names others (:class:`~contextfold.errors.StoreFileMovedError`). The WAL is then
checkpointed into the database file the connection holds and emptied: a renamed file
keeps all that was acknowledged without its WAL, and the WAL left under the old name
cannot be replayed into a file put in its place (SQLite itself skips the checkpoint when
it closes a moved database).
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
_CHECKPOINT_EVERY = 256  # commits between two WAL checkpoints on the thread
# A read on the caller's thread may run _READ_CALLS times _READ_STEPS VM steps.
_READ_STEPS = 1000
_READ_CALLS = 4
# What SQLite answers when the system refuses a write: SQLITE_FULL for a full disk (ENOSPC),
# SQLITE_IOERR_WRITE for a file-size quota (EFBIG, RLIMIT_FSIZE) or a failing device.
_REFUSED_WRITES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR_WRITE})


@dataclass
class _Job(Generic[T]):
    """A job waiting for the thread, and where its outcome goes."""

    fn: Callable[[sqlite3.Connection], T]
    write: bool
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
        self._busy_ms = int(busy_timeout * 1000)
        self._read_only = read_only
        # A commit that never syncs, of a connection that may write: one a caller's thread may run.
        self._writes_here = self._synchronous in ("OFF", "NORMAL") and not read_only
        self._required_table = required_table
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._cursor: sqlite3.Cursor | None = None  # the connection's, for every job
        self._closed = False
        self._files = OpenedFiles()
        # Held by whoever uses the connection: the thread for its jobs, or a read or write
        # on the caller's thread (which never waits for it).
        self._busy = threading.Lock()
        # Jobs asked for and not yet taken by the thread; event loops add, the thread takes.
        self._lock = threading.Lock()
        self._pending: list[_Job[Any]] = []
        self._commits = 0  # since the last checkpoint
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
        """``fn(conn)`` on the thread, after every job asked for before it (a write goes
        through :meth:`write`, which alone waits for another process's lock and checks the
        files). Raises StoreUnavailableError when closed or when the database cannot be
        opened, StoreError for a failed statement (rolled back)."""
        return await self._ask(fn, write=False, committed=None)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """:meth:`run` for a job that only reads, on this thread when it is short (see the
        module). ``fn`` may run twice (the first attempt undone), so it must not write."""
        conn = self._idle()
        if conn is not None:
            calls = iter(range(_READ_CALLS))
            conn.set_progress_handler(lambda: next(calls, None) is None, _READ_STEPS)
            try:
                return fn(conn)
            except sqlite3.Error:
                _rollback(conn)  # interrupted, or failing: the thread runs it and names it
            except BaseException:
                _rollback(conn)
                raise
            finally:
                conn.set_progress_handler(None, 0)
                self._busy.release()
        return await self.run(fn)

    def _idle(self) -> sqlite3.Connection | None:
        """The open connection, held for this thread, when nothing uses it and nothing is
        queued (which a job here would overtake); None else."""
        conn = self._conn
        if self._closed or conn is None or not self._busy.acquire(False):
            return None
        if self._pending:
            self._busy.release()
            return None
        return conn

    async def write(
        self,
        fn: Callable[[sqlite3.Connection], T],
        committed: Callable[[T], None] | None = None,
    ) -> T:
        """``fn(conn)`` inside a write transaction, committed after the moved-file check.

        ``fn`` neither begins nor ends the transaction; an exception it raises undoes what
        it wrote and nothing else. Writes queued together share one commit; a failed commit
        or moved file fails each of them (nothing is acknowledged). ``committed(value)``
        runs once the commit succeeded, still holding the connection. Raises as :meth:`run`,
        and StoreFileMovedError when the path no longer names the files opened.
        """
        here = self._write_here(fn, committed)
        if here:
            return here[0]
        return await self._ask(fn, write=True, committed=committed)

    def _write_here(
        self, fn: Callable[[sqlite3.Connection], T], committed: Callable[[T], None] | None
    ) -> list[T]:
        """:meth:`write` on this thread when that cannot wait on anything (see the module):
        ``[value]``, or ``[]`` when it must queue for the thread. Raises as :meth:`write`."""
        conn = self._idle() if self._writes_here else None
        if conn is None:
            return []
        try:
            cursor = self.cursor
            try:
                cursor.execute("BEGIN IMMEDIATE")  # resting: no busy wait
            except sqlite3.OperationalError:
                return []  # another process holds the write lock: wait on the thread
            try:
                value = fn(conn)
                self._check_files()  # the last moment before the write is acknowledged
                cursor.execute("COMMIT")
            except BaseException as exc:
                raise self._failed(conn, exc)  # noqa: B904 - _failed names the cause itself
            if committed is not None:
                committed(value)
            self._commits += 1
            if self._commits == _CHECKPOINT_EVERY and self._executor is not None:
                self._executor.submit(self._drain)  # which checkpoints
        finally:
            self._busy.release()
        return [value]

    async def _ask(
        self,
        fn: Callable[[sqlite3.Connection], T],
        *,
        write: bool,
        committed: Callable[[T], None] | None,
    ) -> T:
        if self._closed:
            raise StoreUnavailableError(f"{self._what} at {self.url} is closed")
        if self._executor is None:
            # Its one worker runs the drains in order, so only one connects.
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._thread_name)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            self._pending.append(_Job(fn, write, committed, loop, future))
            first = len(self._pending) == 1
        if first:
            # At the end of this step of the loop: the jobs asked for meanwhile go together.
            loop.call_soon(self._submit)
        return await future

    def _submit(self) -> None:
        if self._executor is not None and not self._closed:  # else close drains the jobs
            self._executor.submit(self._drain)

    def _drain(self) -> None:
        """On the worker: run the queued jobs in order, each run of writes in one commit,
        answer them once the connection is free again; then checkpoint the WAL if due."""
        with self._busy:
            with self._lock:
                jobs, self._pending = self._pending, []
            jobs = [job for job in jobs if not job.future.cancelled()]
            self._run_jobs(jobs)
        for job in jobs:
            job.loop.call_soon_threadsafe(_resolve, job.future, job.outcome)
        if self._commits >= _CHECKPOINT_EVERY:
            with self._busy:
                if self._conn is not None:
                    _checkpoint(self._conn, "PASSIVE")
                self._commits = 0

    def _run_jobs(self, jobs: list[_Job[Any]]) -> None:
        if not jobs:
            return
        try:
            conn = self._conn if self._conn is not None else self._connect()
        except BaseException as exc:
            for job in jobs:
                job.outcome[:] = [None, exc]
            return
        start = 0
        while start < len(jobs):
            end = start + 1
            if jobs[start].write:
                while end < len(jobs) and jobs[end].write:
                    end += 1
                self._commit(conn, jobs[start:end])
            else:
                job = jobs[start]
                try:
                    job.outcome[:] = [self._guarded(conn, job.fn)]
                except BaseException as exc:
                    job.outcome[:] = [None, exc]
            start = end

    def _commit(self, conn: sqlite3.Connection, jobs: list[_Job[Any]]) -> None:
        """Commit ``jobs`` (writes) in one transaction; each outcome goes to its job."""
        conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        try:
            self._guarded(conn, lambda conn: self._commit_together(conn, jobs))
        except BaseException as exc:
            for job in jobs:
                job.outcome[:] = [None, exc]
        else:
            self._commits += 1
            for job in jobs:
                if job.committed is not None and len(job.outcome) == 1:
                    job.committed(job.outcome[0])
        finally:
            conn.execute("PRAGMA busy_timeout = 0")

    def _commit_together(self, conn: sqlite3.Connection, jobs: list[_Job[Any]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        if len(jobs) == 1:
            # Alone, a write needs no savepoint: failing, it undoes a transaction of its own.
            jobs[0].outcome[:] = [jobs[0].fn(conn)]
        else:
            for job in jobs:
                conn.execute("SAVEPOINT cf_write")
                try:
                    job.outcome[:] = [job.fn(conn)]
                except Exception as exc:
                    if not conn.in_transaction:
                        # SQLite rolled the whole transaction back (a full disk may), the
                        # jobs before this one with it: each of them fails with this error.
                        raise
                    conn.execute("ROLLBACK TO cf_write")
                    failure = self._store_error(exc) if isinstance(exc, sqlite3.Error) else exc
                    job.outcome[:] = [None, failure]
                conn.execute("RELEASE cf_write")
        self._check_files()  # the last moment before the writes are acknowledged
        conn.execute("COMMIT")

    def _guarded(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return fn(conn)
        except BaseException as exc:
            raise self._failed(conn, exc)  # noqa: B904 - _failed names the cause itself

    def _failed(self, conn: sqlite3.Connection, exc: BaseException) -> BaseException:
        """Undo the transaction a failed job left; what to raise for ``exc``."""
        _rollback(conn)
        if isinstance(exc, StoreFileMovedError):
            _checkpoint(conn, "TRUNCATE")
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

    async def open(self) -> None:
        """Connect now rather than on the first statement."""
        await self.run(lambda conn: None)

    async def close(self) -> None:
        """Run the jobs already asked for, close the connection and stop the worker; later
        calls raise. Idempotent."""
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
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # the thread checkpoints
            conn.execute("PRAGMA busy_timeout = 0")  # resting (see the module)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, (sqlite3.Error, OSError)):
                raise self._unavailable(exc) from exc
            raise
        self._cursor = conn.cursor()
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
            conn.execute("PRAGMA busy_timeout = 0")  # resting (see the module)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error) and how == "ro":
                raise self._unreadable_here(exc) from exc
            if isinstance(exc, (sqlite3.Error, OSError)):
                raise self._unavailable(exc) from exc
            raise
        self._cursor = conn.cursor()
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

    def _check_files(self) -> None:
        """Raise StoreFileMovedError when the path no longer names the files the connection
        opened (moved, deleted or replaced, the ``-wal`` and ``-shm`` too). Called inside a
        write transaction, just before COMMIT: the transaction then rolls back and nothing
        is acknowledged. One ``stat`` per file, or of their directory alone while it is
        unchanged (see :class:`OpenedFiles`)."""
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
        self._drain()  # the jobs asked for before the close
        with self._busy:
            if self._conn is not None:
                if self._files.moved() is not None:
                    _checkpoint(self._conn, "TRUNCATE")
                self._conn.close()
                self._conn = None
                self._cursor = None


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _checkpoint(conn: sqlite3.Connection, mode: str) -> None:
    """Copy the WAL into the database file the connection holds (a moved one too: TRUNCATE
    then empties the WAL); best effort: a failure leaves the files as SQLite had them."""
    with contextlib.suppress(sqlite3.Error):
        conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()


def _resolve(future: asyncio.Future[Any], outcome: list[Any]) -> None:
    if future.cancelled():
        return
    if len(outcome) == 2:
        future.set_exception(outcome[1])
    else:
        future.set_result(outcome[0])
