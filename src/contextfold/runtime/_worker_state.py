"""What a worker knows of the streams it serves and what it did: each stream's status (one
record: where it stands in the schedule and what goes with it), the point of a stream a
change was heard at, the keys a store's push channel names streams by, and the counts."""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from .fence import StreamLease
from .lease import LeaseRecord

__all__ = [
    "ChangeKeys",
    "Holders",
    "Mark",
    "StreamState",
    "StreamStatus",
    "Streams",
    "WorkerStats",
]


@dataclass(frozen=True, slots=True)
class Mark:
    """A stream as of a change: its version, and the global position of its newest event
    when known (a notification says it; a scan does not)."""

    version: int
    head: int | None = None

    def covers(self, heard: Mark) -> bool:
        """Whether ``heard`` is this point of the stream or an older one. By head when both
        know it (global positions are never reused, so a stream deleted and made again is
        never covered); else by version."""
        if heard.head is not None and self.head is not None:
            return heard.head <= self.head
        return heard.version == self.version

    def newer(self, heard: Mark) -> Mark:
        """The newer of two changes heard of (this one first): by head when both know it.
        Else the later heard, unless it says no more than this one: no head, and this one's
        version, or this one a deletion (version 0, which nothing covers: a version heard
        after it without a head may be the new history's, made again to where the old one
        was left)."""
        if heard.head is not None and self.head is not None:
            return self if heard.head < self.head else heard
        if heard.head is None and (self.version == 0 or heard.version == self.version):
            return self
        return heard


class StreamState(enum.Enum):
    """Where a stream stands in a worker's schedule: in exactly one of these at a time."""

    IDLE = "idle"
    """Nothing scheduled: looked at again when it changes."""
    QUEUED = "queued"
    """Waiting for a free slot, first in, first out."""
    RUNNING = "running"
    """Its task runs: a look at its lease and its scheduler, then its agent."""
    BLOCKED = "blocked"
    """Not looked at before ``until`` (its lease held elsewhere or backing off, a pause), or
    before ``recheck`` once it changed (its holder may have handed it back)."""


@dataclass(slots=True, eq=False)
class StreamStatus:
    """What a worker knows of one stream. :attr:`state` changes only through
    :class:`Streams`; the fields marked with a state hold only in it (else they are None, or
    False), the others in every state."""

    stream: str
    state: StreamState = StreamState.IDLE
    version: int | None = None
    """Its version as the last scan listed it."""
    heard: Mark | None = None
    """The newest change heard of and not looked at yet."""
    settled: Mark | None = None
    """Where it was left with nothing to do (by this worker, or handed back idle by any
    worker): a change heard of at or before it needs no look."""
    paused: datetime | None = None
    """Not worked before then (after a store error, or a backoff without a lease), even
    when it changes."""
    failures: int = 0
    """Failures in a row without a lease, or before a claim landed (a landed lease
    carries its own count)."""
    deferred: tuple[int, datetime] | None = None
    """Left to the instance that handed it back: the position of that hand-back, and when
    a look first found it (the journal's clock)."""
    task: asyncio.Task[None] | None = None
    """RUNNING: the task serving it."""
    lease: StreamLease | None = None
    """RUNNING: the lease its agent runs under, once claimed."""
    again: bool = False
    """RUNNING: it changed (or gave its slot up) meanwhile: looked at again after the run."""
    until: datetime | None = None
    """BLOCKED: looked at again at this time of the journal's clock (set while RUNNING:
    blocked when the run ends)."""
    recheck: float | None = None
    """BLOCKED: it changed meanwhile: looked at again at this time of the event loop."""


class Streams:
    """Every stream a worker knows, by name, each with one :class:`StreamStatus`.

    Its methods are the transitions, and the only place a state changes: they keep the
    indexes that spare the worker a walk over every stream it knows. The queue holds exactly
    the QUEUED streams, in the order they queued; :attr:`running` and the blocked index hold
    exactly the RUNNING and the BLOCKED ones.
    """

    def __init__(self) -> None:
        self._all: dict[str, StreamStatus] = {}
        self._queue: deque[StreamStatus] = deque()
        self._running: dict[str, StreamStatus] = {}
        self._blocked: dict[str, StreamStatus] = {}

    def get(self, stream: str) -> StreamStatus | None:
        return self._all.get(stream)

    def add(self, stream: str) -> StreamStatus:
        """A stream first seen: IDLE."""
        status = self._all[stream] = StreamStatus(stream)
        return status

    @property
    def running(self) -> Mapping[str, StreamStatus]:
        """The RUNNING streams."""
        return self._running

    @property
    def waiting(self) -> tuple[str, ...]:
        """The QUEUED streams, first first."""
        return tuple(status.stream for status in self._queue)

    @property
    def queued(self) -> int:
        """How many streams are QUEUED."""
        return len(self._queue)

    def change(self, status: StreamStatus, recheck: float) -> bool:
        """The stream changed: RUNNING, it is looked at again after the run (``again``);
        BLOCKED, at ``recheck`` (the event loop's time) at the latest; else it queues, at
        the end unless queued already. True when there is something new to schedule."""
        if status.state is StreamState.RUNNING:
            status.again = True
            return False
        if status.state is StreamState.BLOCKED:
            if status.recheck is None:
                status.recheck = recheck
            return True
        return self._enqueue(status)

    def start(self) -> StreamStatus | None:
        """The first QUEUED stream, now RUNNING (its task is the caller's to set), or None
        when none waits."""
        if not self._queue:
            return None
        status = self._queue.popleft()
        self._move(status, StreamState.RUNNING)
        return status

    def block(self, status: StreamStatus, until: datetime) -> None:
        """A RUNNING stream is BLOCKED until ``until`` (the journal's clock) once its run ends
        (the last call of a run decides)."""
        assert status.state is StreamState.RUNNING
        status.until = until

    def finish(self, status: StreamStatus) -> bool:
        """A run ended: RUNNING to BLOCKED when :meth:`block` was called during it, else to
        IDLE. True when it changed meanwhile: the caller :meth:`change`s it then."""
        again = status.again
        status.task = status.lease = None
        status.again = False
        self._move(status, StreamState.IDLE if status.until is None else StreamState.BLOCKED)
        return again

    def due(self, now: float, clock: Callable[[], datetime]) -> bool:
        """Every BLOCKED stream whose ``until`` (by ``clock``) or ``recheck`` (by ``now``, the
        event loop's time) came queues. True when any did."""
        if not self._blocked:
            return False
        wall = clock()
        due = [
            status
            for status in self._blocked.values()
            if wall >= _until(status) or (status.recheck is not None and now >= status.recheck)
        ]
        for status in due:
            self._enqueue(status)
        return bool(due)

    def next_due(self, now: float, clock: Callable[[], datetime]) -> float | None:
        """Seconds until the first BLOCKED stream is due (at most 0 once one is), or None
        when none is blocked."""
        if not self._blocked:
            return None
        wall = clock()
        waits = [(_until(status) - wall).total_seconds() for status in self._blocked.values()]
        waits += [s.recheck - now for s in self._blocked.values() if s.recheck is not None]
        return min(waits)

    def _enqueue(self, status: StreamStatus) -> bool:
        """IDLE or BLOCKED to QUEUED, at the end of the queue (True); False when QUEUED already."""
        if status.state is StreamState.QUEUED:
            return False
        assert status.state is not StreamState.RUNNING
        self._move(status, StreamState.QUEUED)
        return True

    def _move(self, status: StreamStatus, state: StreamState) -> None:
        """The one place a state changes, and the indexes with it (a stream leaves the queue
        at its front, in :meth:`start`)."""
        stream = status.stream
        if status.state is StreamState.RUNNING:
            del self._running[stream]
        elif status.state is StreamState.BLOCKED:
            del self._blocked[stream]
            status.until = status.recheck = None
        status.state = state
        if state is StreamState.QUEUED:
            self._queue.append(status)
        elif state is StreamState.RUNNING:
            self._running[stream] = status
        elif state is StreamState.BLOCKED:
            self._blocked[stream] = status


def _until(status: StreamStatus) -> datetime:
    until = status.until
    assert until is not None, f"{status.stream!r} is BLOCKED without a time"
    return until


class ChangeKeys:
    """The keys a store's push channel names streams by (``Journal.change_key``), mapped
    back to the streams of the worker's namespace as its scans list them. A key no scan has
    listed yet is noted, and the next scan tells: a key it does not list either is another
    namespace's, ignored from then on (the newest ``limit`` or so remembered)."""

    def __init__(self, limit: int) -> None:
        self._streams: dict[str, StreamStatus] = {}
        self._unknown: set[str] = set()
        self._foreign: set[str] = set()
        self._limit = limit

    def learn(self, key: str, status: StreamStatus) -> None:
        self._streams[key] = status
        self._foreign.discard(key)

    def find(self, key: str) -> StreamStatus | None:
        return self._streams.get(key)

    def note(self, key: str) -> bool:
        """A key no scan listed: True when it is new (a scan should look), False when noted
        already or known to be another namespace's."""
        if key in self._foreign or key in self._unknown:
            return False
        self._unknown.add(key)
        return True

    def scanned(self) -> None:
        """A scan listed every stream: the keys noted before it that it did not learn are
        another namespace's."""
        if len(self._foreign) > self._limit:
            self._foreign.clear()
        self._foreign.update(k for k in self._unknown if k not in self._streams)
        self._unknown.clear()


class Holders:
    """Until when each other lease holder is known to be alive: the expiry of the newest
    lease it holds (or holds back) that a look read, since a live worker renews its leases.
    The lapsed are forgotten once ``limit`` holders are known (they come and go with their
    processes)."""

    def __init__(self, me: str, limit: int) -> None:
        self._me = me
        self._limit = limit
        self._until: dict[str, datetime] = {}

    def seen(self, record: LeaseRecord, now: datetime) -> None:
        if record.state == "released" or record.holder == self._me:
            return
        until = self._until
        known = until.get(record.holder)
        if known is not None and known >= record.expires_at:
            return
        if known is None and len(until) >= self._limit:
            for holder in [h for h, then in until.items() if then < now]:
                del until[holder]
        until[record.holder] = record.expires_at

    def alive_until(self, holder: str) -> datetime | None:
        return self._until.get(holder)


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """What a worker did so far."""

    claims: int = 0
    """Leases claimed and used (a claim whose agent found nothing to do is never written)."""
    runs: int = 0
    """Streams run to the end of their work (or of their quantum)."""
    steps: int = 0
    """Agent steps: requests sent, tool calls run, compactions, halts."""
    backoffs: int = 0
    """Runs ended by a provider (or factory) error and held back."""
    lost: int = 0
    """Runs ended because another instance took the lease over."""
    store_errors: int = 0
    """Runs and scans that met a store error."""
