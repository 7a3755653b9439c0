"""The store interface every journal backend implements, and the helpers backends share.

A backend stores append-only streams of :class:`~contextfold.events.StoredEvent` per
namespace. The contract (``contextfold.store.contract``) pins what each method must do.
Backends only implement storage: they receive checked input. The journal checks every
argument before it calls a store (:mod:`contextfold.journal.encode`, the one place), so
every text reaching a backend is valid Unicode (no lone surrogate: SQLite and PostgreSQL
store UTF-8), every name within its length limit, every limit from 1 to :data:`MAX_LIMIT`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import hashlib
import operator
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from .._aio import CancelWatch
from ..errors import IdempotencyConflictError, WrongExpectedVersionError
from ..events import NewEvent, StoredEvent

__all__ = [
    "MAX_LIMIT",
    "TAIL_BUFFER_BYTES",
    "AppendResult",
    "ReadResult",
    "Store",
    "StreamChange",
    "StreamInfo",
    "TailPages",
    "TailReset",
    "Wakeups",
    "batch_digest",
    "idempotency_conflict",
    "parse_cursor",
    "poll_subscribe",
    "wait_or_timeout",
    "wrong_version",
]

MAX_LIMIT = 10_000
"""The most events (or streams) one ``read``, ``latest`` or ``list_streams`` is asked for."""
_MAX_CURSOR = 2**63 - 1  # global positions are signed 64-bit integers in SQL

TAIL_BUFFER_BYTES = 1 << 20
"""The most bytes of stored events (their JSON) a live tail holds read and not yet handed
out: a page over it is cut after the last event within it (one event at least) and the
rest read again when the tail gets there. A reader that stops taking events (a stalled
SSE client) thus keeps at most this much of the journal in memory, however far behind."""
_TAIL_PAGE = 1000  # the most events a live tail reads at once
# A tail's first read: small, since the store builds a whole page (up to 4 MiB an event)
# before the budget can cut it.
_TAIL_FIRST_PAGE = 16


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an append landed. ``deduplicated`` is true when an idempotent retry wrote nothing."""

    stream: str
    first_position: int
    last_position: int
    cursor: str
    """The cursor after the last event of this append."""
    deduplicated: bool = False
    cursors: tuple[str, ...] = ()
    """The cursor of every event appended, oldest first, when the store says (one whose
    appends' global positions can have gaps between them); empty when it does not."""
    previous: str | None = None
    """The cursor of the event just before the first one appended, when the store says."""

    @property
    def version(self) -> int:
        """The stream's version after this append (its last position)."""
        return self.last_position


@dataclass(frozen=True, slots=True)
class ReadResult:
    """A page of a stream, oldest first.

    ``cursor`` is where the next read continues (the last event returned, or the cursor
    given when nothing new was found; None for an empty stream read from the start).
    ``reset`` is true when the given cursor was unknown and the page starts from the
    beginning of the stream. ``more`` is true when ``limit`` cut the page short.
    """

    events: tuple[StoredEvent, ...]
    cursor: str | None
    reset: bool = False
    more: bool = False


@dataclass(frozen=True, slots=True)
class TailReset:
    """What a live tail yields when the history it was following is gone.

    The tail's cursor named no event of the stream any more: the stream was deleted (and
    perhaps recreated) while the tail ran, or the cursor it started from was unknown. What
    comes after it is the stream's current history from its start, as a read with
    ``reset=True`` returns it: drop what was derived from the events before it. ``after``
    is the cursor that became unknown.
    """

    stream: str
    after: str
    kind: Literal["reset"] = "reset"


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """A stream of a namespace and its version (number of events)."""

    stream: str
    version: int


@dataclass(frozen=True, slots=True)
class StreamChange:
    """A change of a stream, as a store's push channel reports it (:meth:`Store.listen_changes`)."""

    key: str
    """The stream, as :meth:`Store.change_key` names it (the channel names no stream in clear)."""
    version: int | None
    """The stream's version after the change (0: deleted); None when the channel did not say."""
    head: int | None
    """The global position of the stream's newest event after the change; None after a
    deletion or when the channel did not say."""


def parse_cursor(cursor: str | None) -> int | None:
    """The global position a cursor names (0 for None: the start); None for a malformed
    (thus unknown) one, and for one past the 64-bit positions a store can hold."""
    if cursor is None:
        return 0
    if not cursor.isascii() or not cursor.isdigit() or len(cursor) > 19:
        return None
    position = int(cursor)
    return position if position <= _MAX_CURSOR else None


def batch_digest(events: Sequence[NewEvent]) -> str:
    """What an idempotency key names: types, payloads, run, actor and channels of a batch.

    Event ids and times are left out: a retry generates new ones for the same payload.
    """
    h = hashlib.sha256()
    for ev in events:
        for part in (
            ev.type.encode(),
            ev.data,
            (ev.meta.run_id or "").encode(),
            (ev.meta.actor or "").encode(),
            "\x1f".join(ev.meta.channels).encode(),
        ):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return h.hexdigest()


class Store(abc.ABC):
    """An append-only journal backend. All methods are coroutines except ``subscribe``.

    Arguments reaching a backend are already checked (by :mod:`contextfold.journal.encode`):
    a backend checks nothing itself. Every method takes the namespace first; namespaces
    never see each other's data. ``head`` and ``subscribe`` have defaults built on ``read``;
    a backend that calls ``self.wakeups.notify(namespace, stream)`` once an append or a
    deletion is committed wakes the default tails of this process at once. What only some
    backends can do (``latest_at_head``, ``change_key``, ``listen_changes``) defaults to
    None: the caller does without.
    """

    url: str = ""
    consecutive_globals: bool = False
    """Whether the events of one append always get consecutive global positions (a store
    with one writer at a time); the journal then knows every appended event's cursor."""

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Create tables or pools; called once before first use."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. The store is unusable afterwards."""

    @abc.abstractmethod
    async def append(
        self,
        namespace: str,
        stream: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int | None,
        idempotency_key: str | None,
    ) -> AppendResult:
        """Append atomically: all events get consecutive positions, or nothing is written.

        Raises WrongExpectedVersionError when ``expected_version`` is given and differs
        from the stream's version (0 for a stream that does not exist). With an
        ``idempotency_key`` seen before for this stream: same batch digest -> the original
        result with ``deduplicated=True``; another digest -> IdempotencyConflictError.
        """

    @abc.abstractmethod
    async def read(
        self,
        namespace: str,
        stream: str,
        *,
        after: str | None,
        types: Sequence[str] | None,
        limit: int | None,
    ) -> ReadResult:
        """Events after ``after`` (from the start when None), oldest first.

        A cursor that names no event of this stream (another stream's, a deleted
        history's, another store's, malformed) reads from the start with ``reset=True``.
        """

    @abc.abstractmethod
    async def latest(
        self,
        namespace: str,
        stream: str,
        types: Sequence[str],
        *,
        before: str | None = None,
        limit: int = 1,
    ) -> tuple[StoredEvent, ...]:
        """The newest events of the given types (newest first), older than ``before``."""

    @abc.abstractmethod
    async def contains(self, namespace: str, stream: str, cursor: str) -> bool:
        """Whether ``cursor`` names an event of this stream (a cursor the store recognises)."""

    async def latest_at_head(
        self, namespace: str, stream: str, types: Sequence[str]
    ) -> tuple[int, str | None, StoredEvent | None] | None:
        """The stream's version, its head (None when empty) and its newest event of ``types``
        (None when it has none), read in one snapshot so the three agree; None when the
        store cannot read them together (this default: the caller reads them one by one)."""
        return None

    async def head(self, namespace: str, stream: str) -> str | None:
        """The cursor of the stream's newest event (None for an empty stream): a read or a
        tail after it sees only what is appended from now on.

        This default pages through the whole stream; backends override it with one lookup.
        """
        cursor: str | None = None
        while True:
            page = await self.read(namespace, stream, after=cursor, types=None, limit=10_000)
            cursor = page.cursor
            if not page.more:
                return cursor

    @abc.abstractmethod
    async def version(self, namespace: str, stream: str) -> int:
        """The stream's last position; 0 when it does not exist."""

    @abc.abstractmethod
    async def delete_stream(self, namespace: str, stream: str) -> bool:
        """Delete the stream's events and idempotency keys; True when it existed.

        Cursors into the deleted history become unknown (reads after them reset).
        """

    @abc.abstractmethod
    async def list_streams(
        self,
        namespace: str,
        *,
        prefix: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> tuple[StreamInfo, ...]:
        """Streams of the namespace, sorted by name (code point order), optionally filtered
        by prefix; with ``after``, only those whose name sorts after it (a page starting
        after the last name of the previous one: ``after`` need not name a stream)."""

    def change_key(self, namespace: str, stream: str) -> str | None:
        """The key naming the stream in the changes :meth:`listen_changes` reports; None when
        the store has no push channel (this default)."""
        return None

    def listen_changes(
        self,
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[StreamChange]] | None:
        """Listen to the store's push channel: once entered, the iterator it gives reports
        every change (append or deletion) of every stream, by any process, committed from
        then on, until the channel is lost: then it ends or raises StoreError, and what
        lands until the next listen goes unreported. Entering raises StoreError when it
        cannot listen. None when the store has no push channel (this default): callers poll
        :meth:`list_streams` for changes instead."""
        return None

    @functools.cached_property
    def wakeups(self) -> Wakeups:
        """The live tails of this process, woken by :meth:`Wakeups.notify`."""
        return Wakeups()

    def subscribe(
        self, namespace: str, stream: str, *, after: str | None, poll_interval: float = 0.05
    ) -> AsyncIterator[StoredEvent | TailReset]:
        """Yield events after ``after`` as they are appended, forever (until cancelled).

        Whenever the tail's cursor names no event of the stream (an unknown ``after``, or
        the stream deleted while the tail runs), it yields a :class:`TailReset` and goes on
        from the beginning of the stream, like ``read`` with ``reset=True``.

        This default reads every ``poll_interval`` seconds, and at once when the backend
        notifies :attr:`wakeups` of an append; backends with a push channel override it.
        """
        return poll_subscribe(
            self, self.wakeups, namespace, stream, after=after, poll_interval=poll_interval
        )


class Wakeups:
    """In-process wake-up of live tails when this process appends (other processes poll)."""

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, str], set[asyncio.Event]] = {}

    def notify(self, namespace: str, stream: str) -> None:
        for waiter in self._waiters.get((namespace, stream), ()):
            waiter.set()

    @contextlib.contextmanager
    def listen(self, namespace: str, stream: str) -> Iterator[asyncio.Event]:
        """An event set by every append to the stream while the block runs. Registered for
        the whole tail, not per wait: an append landing while the tail reads or hands out
        events still sets it (clear it before each read)."""
        waiter = asyncio.Event()
        key = (namespace, stream)
        self._waiters.setdefault(key, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[key]


async def wait_or_timeout(wake: asyncio.Event, timeout: float) -> None:
    """Wait until ``wake`` is set or ``timeout`` seconds pass.

    Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancellation that lands as the
    event is set, and a cancelled tail would then poll forever.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await wake.wait()


class TailPages:
    """The reads of one live tail, bounded in bytes: each :meth:`read` hands out at most
    :data:`TAIL_BUFFER_BYTES` of events (one at least) and holds nothing of a page past
    them. The page size in events follows the events' sizes: it shrinks to what fitted
    when a page was cut and doubles (from 16, up to 1,000) while whole pages fit, so a
    stream of large events is not read past the budget again and again, nor far past it
    by the first read."""

    def __init__(self, store: Store, namespace: str, stream: str, after: str | None) -> None:
        self.store = store
        self.namespace = namespace
        self.stream = stream
        self.cursor = after
        """Where the next read continues: after the last event handed out."""
        self.more = False
        """Whether the last read left events to read at once."""
        self._limit = _TAIL_FIRST_PAGE

    async def read(self) -> tuple[TailReset | None, list[StoredEvent]]:
        """The reset to yield first (the cursor named no event of the stream), if any, and
        the next events as a stack: ``pop()`` gives the oldest. Popping them one at a time
        lets each go once its reader is done with it."""
        page = await self.store.read(
            self.namespace, self.stream, after=self.cursor, types=None, limit=self._limit
        )
        reset = None
        if page.reset and self.cursor is not None:
            reset = TailReset(self.stream, self.cursor)
        events = page.events
        kept = _within_budget(events)
        if kept < len(events):
            self._limit = kept
            self.cursor, self.more = events[kept - 1].cursor, True
        else:
            if page.more:
                self._limit = min(self._limit * 2, _TAIL_PAGE)
            self.cursor, self.more = page.cursor, page.more
        return reset, list(reversed(events[:kept]))


def _within_budget(events: tuple[StoredEvent, ...]) -> int:
    """How many of the first ``events`` fit in :data:`TAIL_BUFFER_BYTES` (one at least)."""
    if sum(map(len, map(_DATA, events))) <= TAIL_BUFFER_BYTES:
        return len(events)
    size = 0
    for kept, event in enumerate(events):
        size += len(event.data)
        if kept and size > TAIL_BUFFER_BYTES:
            return kept
    return len(events)  # pragma: no cover - the sum above was over the budget


_DATA = operator.attrgetter("data")  # StoredEvent.data, read without a Python call per event


async def poll_subscribe(
    store: Store,
    wakeups: Wakeups,
    namespace: str,
    stream: str,
    *,
    after: str | None,
    poll_interval: float,
) -> AsyncIterator[StoredEvent | TailReset]:
    """A live tail built on ``read``: wakes on local appends, polls for other processes.
    It holds at most :data:`TAIL_BUFFER_BYTES` of events (see :class:`TailPages`)."""
    pages = TailPages(store, namespace, stream, after)
    cancel = CancelWatch()  # a cancel the store's driver swallowed still ends the tail
    with wakeups.listen(namespace, stream) as wake:
        while True:
            wake.clear()  # before the read: an append the read misses sets it again
            reset, events = await pages.read()
            cancel.check()
            if reset is not None:
                yield reset
            while events:
                yield events.pop()
            if not pages.more:
                await wait_or_timeout(wake, poll_interval)
                cancel.check()


def wrong_version(stream: str, expected: int, actual: int) -> WrongExpectedVersionError:
    return WrongExpectedVersionError(
        f"stream {stream!r} is at version {actual}, the append expected {expected}: "
        "read the stream again and retry; nothing was written",
        stream=stream,
        expected=expected,
        actual=actual,
    )


def idempotency_conflict(stream: str, key: str) -> IdempotencyConflictError:
    return IdempotencyConflictError(
        f"idempotency key {key!r} on stream {stream!r} was used for another payload; "
        "an idempotency key names one exact batch forever: use a new key; nothing was written",
        stream=stream,
        key=key,
    )
