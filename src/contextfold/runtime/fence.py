"""The fence: a lease holder's appends land only while it holds the stream's lease.

Every append the holder makes to the stream (the agent's, through
:attr:`StreamLease.journal`) carries ``expected_version``: the last version this instance
knows. The store checks it inside its own append transaction (PostgreSQL under the
stream's ``cf_streams`` row lock, SQLite under ``BEGIN IMMEDIATE``, memory under its lock),
so an append lands only right after what the instance has seen. When another writer
appended meanwhile (a user message, a webhook), the instance reads what came after its
version: a lease event of another claim among it means another instance took the stream
over, and the append fails with LeaseLostError (nothing written; the instance stops);
anything else moves its version on and it tries again. A takeover is itself an event, so
once it lands no append of the old holder can land after it, however late a paused or
partitioned instance makes it. This needs no clock and no new store operation: it holds
on every backend that passes the store contract, across processes and hosts. (Checking a
lease token inside the store's transaction would have needed a new operation in every
backend and in the contract.)

A claim may be lazy: checked (the lease free at version V) but written with the holder's
first append, at the end of that batch and at V, so a claim whose agent finds nothing to
do writes nothing, and a turn costs one append less. Until it lands the holder has done
nothing outside the journal: the runtime appends before every model request and tool
run, and lands a pending claim itself before a compaction's summary
(:func:`~contextfold.runtime.lease.confirm_claim`). Until it lands, the lease it judged
lapsed is still the stream's newest, and a holder alive after all (paused past its expiry
and woken, or on a host whose clock is behind) may still append: a pending claim that finds
a record of an agent or of its tools after V loses (LeaseLostError, nothing written),
because what it decided from V may be done already (a tool call started and run); the
events of other writers (user messages, webhooks) it catches up on as a holder does.

A renewal rides along the same way: an append made once a sixth of the lease's time has
passed since it was last written (or after it lapsed) carries the renewal at its end, so
a holder that appends often never writes one on its own (the background renewal writes
one only when no append came). A keyed batch names exactly its events: nothing rides
along, and a pending claim or a lapsed lease is written before it.

A watched lease (:meth:`StreamLease.watch`: its holder hears of every change of the stream,
as a worker does through PostgreSQL notifications) knows the stream's head after its own
append until it hears of a newer one, so the folds of :attr:`StreamLease.journal` take it
without asking the store. That is safe because every decision a fold informs lands
through the fence: a change not yet heard of fails the next append's expected version,
which reads it first; heard of, the next fold reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field, ValidationError

from ..context.state import AGENT_WRITER, TOOL_WRITER
from ..errors import (
    ConflictError,
    CorruptEventError,
    LeaseLostError,
    StoreError,
    WrongExpectedVersionError,
)
from ..events import Event, NewEvent, RawEvent, StoredEvent
from ..journal import Journal
from ..journal.encode import Clock
from ..store.base import AppendResult, parse_cursor
from .scheduling import AGENT

__all__ = ["LeaseState", "StreamLease", "StreamLeased", "decode_lease"]

log = logging.getLogger("contextfold.runtime")

LeaseState = Literal["held", "released", "backoff"]

_FENCE_ATTEMPTS = 100  # catch-ups in a row while other writers keep appending
_RIDE_ALONG = 5 / 6  # an append renews once less than this share of the ttl is left
_RENEW_AT = 2 / 3  # the background renewal writes once less than this share is left
_CATCH_UP_PAGE = 1000
_HOLDERS_WRITE_AS = frozenset({AGENT_WRITER, TOOL_WRITER})  # a lease holder's agent and tools


class StreamLeased(Event, type="contextfold.agent/lease", runtime_only=True):
    """The stream's lease from this event on: claimed or renewed (``held``), handed back
    (``released``), or held back until ``expires_at`` after ``failures`` provider failures
    in a row (``backoff``: nobody works the stream until then)."""

    holder: str
    token: str
    """Names one claim: its renewals and its release carry it too."""
    expires_at: datetime
    state: LeaseState = "held"
    failures: int = Field(default=0, ge=0)
    idle: bool = False
    """Released by a holder whose agent had nothing left to do through the event before
    this one: other workers need not look at the stream again until it changes."""
    returning: bool = False
    """Released by a worker that claims the stream again when it has work (an idle
    hand-back, or a turn given up to waiting streams), not by one that stops: other workers
    leave it to that worker while its leases show it alive."""


def decode_lease(stored: StoredEvent) -> StreamLeased | None:
    """The lease event, or None (logged) when the row no longer decodes."""
    try:
        event = stored.decode(StreamLeased)
    except (ValidationError, CorruptEventError) as exc:
        log.warning("lease event %s@%s does not decode: %s", stored.stream, stored.position, exc)
        return None
    assert isinstance(event, StreamLeased)
    return event


class StreamLease:
    """A lease this instance holds on one stream, and the fence of its appends there.

    Made by :func:`~contextfold.runtime.lease.claim_lease`, at ``version`` (``cursor``
    naming an event at or before it). :attr:`journal` is the journal to build the agent
    with: its appends to the stream go through :meth:`append`; its reads are the journal's
    own. Once the lease is lost (or released), every append raises LeaseLostError.
    """

    def __init__(
        self,
        journal: Journal,
        stream: str,
        *,
        holder: str,
        token: str,
        ttl: float,
        clock: Clock,
        failures: int,
        version: int,
        cursor: str | None,
        expires_at: datetime,
        landed: bool,
        head: str | None = None,
    ) -> None:
        self.stream = stream
        self.holder = holder
        self.token = token
        self.ttl = ttl
        self.failures = failures
        """Provider failures in a row before this claim (carried over from a backoff)."""
        self._base = journal
        self._clock = clock
        self._expires_at = expires_at
        self._version = version
        self._cursor = cursor
        self._head = head  # the stream's head at ``version``, when the claim read it
        self._pending = not landed
        self._lock = asyncio.Lock()
        self._ended: LeaseLostError | None = None
        self._lost = False
        self._others = 0
        # Where the stream is known to be without asking: (version, head cursor if known),
        # after its own last append, or as the claimant said.
        self._at: tuple[int, str | None] | None = None
        self._watched = False
        self._heard = 0  # the newest head of the stream heard of (-1: some went unheard)
        self.journal: Journal = journal.fenced(self)
        """The journal to build the agent with: its appends to the stream go through
        :meth:`append`, its folds of the stream take :attr:`known` when it says."""

    @property
    def expires_at(self) -> datetime:
        return self._expires_at

    @property
    def version(self) -> int:
        """The stream's version as far as this instance has seen it."""
        return self._version

    def watch(self, head: str | None = None, *, notified: bool = True) -> None:
        """Take the stream to be at the claim's version (its head ``head``, when a
        notification said, else the one the claim read with its version, if it did) until
        a change is heard of (:meth:`heard`). ``notified``: every
        change of the stream from now on is reported to :meth:`heard` (by a listener that
        started before any append of this claim), so the holder's own appends tell where
        it is too; without, that holds only until the claim lands (nothing the holder did
        before then left the journal)."""
        self._watched = notified
        if self._at is None and self._pending:
            self._at = (self._version, head if head is not None else self._head)

    def heard(self, version: int | None, head: int | None) -> None:
        """A change of the stream was heard of: its version and head (a global position)
        after it, or None when the notification did not say or some may have gone unheard
        (a listener lost); then nothing is known without asking for the rest of this claim."""
        if version is None or head is None or self._heard < 0:
            self._heard = -1
            return
        self._heard = max(self._heard, head)
        at = self._at
        if at is not None and at[1] is None and version != at[0]:
            self._at = None  # no head to tell an older change from a newer one

    @property
    def known(self) -> tuple[int, str | None] | None:
        """The stream's version and head (None: not known) as this instance knows them
        without asking: after its own last append, or as :meth:`watch` said, while the
        lease is watched and active and no newer change was heard of; else None."""
        at = self._at
        heard = self._heard
        if at is None or self._ended is not None or heard < 0:
            return None
        if not (self._watched or self._pending):
            return None
        head = at[1]
        return at if head is None or heard <= (parse_cursor(head) or 0) else None

    @property
    def known_head(self) -> str | None:
        """The stream's head as :attr:`known` says, or None."""
        known = self.known
        return None if known is None else known[1]

    @property
    def cursor(self) -> str | None:
        """The cursor of an event at or before :attr:`version` (the newest this instance
        appended or caught up on: at it, once it appended)."""
        return self._cursor

    @property
    def pending(self) -> bool:
        """Whether the claim is still to land, with the first append (a lazy claim)."""
        return self._pending

    @property
    def others_appended(self) -> int:
        """Events other writers appended since the claim, as far as this instance has seen
        them (its appends catch up on them): 0 means the stream holds only its own since."""
        return self._others

    @property
    def lost(self) -> bool:
        """Whether another instance took the stream over (or it was deleted)."""
        return self._lost

    @property
    def active(self) -> bool:
        """Neither lost nor released: appends go on."""
        return self._ended is None

    async def append(
        self,
        events: Event | RawEvent | NewEvent | Iterable[Event | RawEvent | NewEvent],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        actor: str | None = None,
        channels: Sequence[str] = ("main",),
    ) -> AppendResult:
        """Append to the stream as the lease holder (see the module docstring): lands only
        while this instance holds the lease. Raises LeaseLostError (nothing written) once
        it does not, and what ``Journal.append`` raises."""
        # A NewEvent is a tuple: iterated, it would be taken for a batch of its fields.
        one = (Event, RawEvent, NewEvent)
        batch: list[Event | RawEvent | NewEvent] = (
            [events] if isinstance(events, one) else list(events)
        )
        async with self._lock:
            self._check()
            if idempotency_key is not None and (self._pending or self._expired()):
                # A keyed batch names exactly its events (nothing rides along): a pending
                # claim lands first, and a holder paused past its expiry renews first (only
                # if nobody took over).
                await self._write("held", self.ttl)
            return await self._fenced(
                batch,
                expected_version=expected_version,
                idempotency_key=idempotency_key,
                run_id=run_id,
                actor=actor,
                channels=channels,
            )

    async def confirm(self) -> None:
        """Make a pending claim land now (nothing when it has). Raises LeaseLostError when
        another instance claimed the stream meanwhile."""
        async with self._lock:
            self._check()
            if self._pending:
                await self._write("held", self.ttl)

    async def renew(self) -> None:
        """Extend the lease by ``ttl`` from now. Raises LeaseLostError when it was lost."""
        async with self._lock:
            self._check()
            await self._write("held", self.ttl)

    async def release(
        self,
        *,
        backoff: float = 0.0,
        failures: int = 0,
        idle: bool = False,
        returning: bool = False,
    ) -> None:
        """Hand the lease back: at once, or after ``backoff`` seconds during which nobody
        works the stream (after ``failures`` provider failures in a row). ``idle``: the
        agent found nothing to do in everything this instance has seen; the release says
        so (``StreamLeased.idle``) only when nobody appended since. ``returning``: this
        instance claims the stream again when it has work (``StreamLeased.returning``).
        Nothing happens when it was lost or released already; a claim that never landed
        is dropped."""
        async with self._lock:
            if self._ended is not None:
                return
            if self._pending and backoff <= 0:
                self._end("the claim was dropped before it landed")
                return
            state: LeaseState = "backoff" if backoff > 0 else "released"
            try:
                if idle and backoff <= 0 and await self._release_idle(failures, returning):
                    return
                await self._write(state, max(backoff, 0.0), failures=failures, returning=returning)
            except LeaseLostError:
                return  # taken over meanwhile: not this instance's to hand back
            self._end("the lease was released")

    @contextlib.asynccontextmanager
    async def renewing(self) -> AsyncIterator[StreamLease]:
        """Renew the lease in the background while the block runs (after a third of
        ``ttl`` each time; a pending claim lands then). A renewal that finds the lease lost
        stops renewing; the next append raises."""
        task = asyncio.create_task(self._renew_loop(), name=f"lease renewal {self.stream}")
        try:
            yield self
        finally:
            task.cancel()
            await asyncio.wait({task})

    # -- the fence --------------------------------------------------------------------------

    def _check(self) -> None:
        if self._ended is not None:
            raise self._ended

    def _expired(self) -> bool:
        return self._clock() >= self._expires_at

    def _left(self) -> float:
        """Seconds until the lease lapses (negative once it has)."""
        return (self._expires_at - self._clock()).total_seconds()

    def _end(self, why: str) -> None:
        self._ended = LeaseLostError(
            f"{why}: {self.holder!r} no longer holds stream {self.stream!r}; claim it again "
            "to append",
            stream=self.stream,
            holder=self.holder,
            position=self._version,
        )

    def _event(
        self,
        state: LeaseState,
        seconds: float,
        failures: int,
        *,
        idle: bool = False,
        returning: bool = False,
    ) -> StreamLeased:
        return StreamLeased(
            holder=self.holder,
            token=self.token,
            expires_at=self._clock() + timedelta(seconds=seconds),
            state=state,
            failures=failures,
            idle=idle,
            returning=returning,
        )

    async def _release_idle(self, failures: int, returning: bool) -> bool:
        """An idle hand-back, landing only right after what this instance has seen (False,
        nothing written, when others appended since: what they wrote may be work)."""
        event = self._event("released", 0.0, failures, idle=True, returning=returning)
        try:
            await self._fenced([event], expected_version=self._version, actor=AGENT, channels=())
        except WrongExpectedVersionError:
            return False  # caught up by the fence already (a takeover raised LeaseLostError)
        self._expires_at = event.expires_at
        self._end("the lease was released")
        return True

    async def _write(
        self, state: LeaseState, seconds: float, *, failures: int = -1, returning: bool = False
    ) -> None:
        """Append a lease event of this claim (a pending claim lands as it)."""
        failures = self.failures if failures < 0 else failures
        event = self._event(state, seconds, failures, returning=returning)
        await self._fenced([event], actor=AGENT, channels=())
        self._expires_at = event.expires_at

    async def _fenced(
        self,
        batch: Sequence[Event | RawEvent | NewEvent],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        actor: str | None = None,
        channels: Sequence[str] = ("main",),
    ) -> AppendResult:
        if expected_version is not None and expected_version != self._version:
            # The caller read further than this instance: no takeover may hide in between.
            await self._catch_up()
        for _ in range(_FENCE_ATTEMPTS):
            # A pending claim, or a renewal that is due, goes last (the batch's first
            # position stays the caller's), unless the batch is a lease event of this claim
            # already, or keyed (it names exactly its events).
            claim = None
            due = self._pending or self._left() < self.ttl * _RIDE_ALONG
            if (
                due
                and idempotency_key is None
                and not any(isinstance(e, StreamLeased) for e in batch)
            ):
                claim = self._event("held", self.ttl, self.failures)
            events = [*batch, claim] if claim is not None else batch
            expected = self._version if expected_version is None else expected_version
            try:
                result = await self._base.append(
                    self.stream,
                    events,
                    expected_version=expected,
                    idempotency_key=idempotency_key,
                    run_id=run_id,
                    actor=actor,
                    channels=channels,
                )
            except WrongExpectedVersionError:
                await self._catch_up()  # raises LeaseLostError after a takeover
                if expected_version is not None:
                    raise  # the caller's own expectation failed: not the fence's to retry
                continue
            self._pending = False
            if claim is not None:
                self._expires_at = claim.expires_at
            if not result.deduplicated:
                self._version, self._cursor = result.version, result.cursor
            self._at = None if result.deduplicated else (result.version, result.cursor)
            return result
        raise ConflictError(
            f"stream {self.stream!r}: {_FENCE_ATTEMPTS} appends in a row lost a race with "
            "other writers; nothing was written, retry later"
        )

    async def _catch_up(self) -> None:
        """Read what other writers appended after this instance's version: raise
        LeaseLostError when a lease event not of this landed claim is among it, or, while
        the claim is pending, a record of an agent or its tools (the holder it judged
        lapsed is alive and working: whatever this instance decided from before that
        record may be done already, a tool call run)."""
        self._at = None
        while True:
            page = await self._base.read(self.stream, after=self._cursor, limit=_CATCH_UP_PAGE)
            if page.reset:
                raise self._lose(None, f"stream {self.stream!r} was deleted")
            for stored in page.events:
                if stored.position > self._version:  # (a lazy claim's cursor may lag)
                    if stored.type == StreamLeased.event_type:
                        event = decode_lease(stored)
                        if self._pending or event is None or event.token != self.token:
                            by = "an unreadable lease event" if event is None else event.holder
                            raise self._lose(
                                stored.position,
                                f"stream {self.stream!r} was leased by {by!r} at "
                                f"@{stored.position}",
                            )
                    elif self._pending and stored.meta.actor in _HOLDERS_WRITE_AS:
                        raise self._lose(
                            stored.position,
                            f"stream {self.stream!r} was appended to by a lease holder's "
                            f"{stored.meta.actor} at @{stored.position} before this claim "
                            "landed",
                        )
                    self._version = stored.position
                    self._others += 1
                self._cursor = stored.cursor
            if not page.more:
                return

    def _lose(self, position: int | None, why: str) -> LeaseLostError:
        self._lost = True
        self._ended = LeaseLostError(
            f"{why}: {self.holder!r} lost its lease (another instance took over); nothing "
            "was written and this instance must stop",
            stream=self.stream,
            holder=self.holder,
            position=position,
        )
        return self._ended

    async def _renew_loop(self) -> None:
        retry = min(self.ttl / 10, 1.0)
        while self._ended is None:
            due = self._left() - self.ttl * _RENEW_AT
            if due > 0:
                # Woken then, it looks again: an append may have renewed the lease meanwhile.
                await asyncio.sleep(due)
                continue
            try:
                await self.renew()
            except LeaseLostError:
                return
            except StoreError as exc:  # the database is away: keep trying while it lasts
                log.warning("renewing the lease on %r failed: %s", self.stream, exc)
                await asyncio.sleep(retry)
