"""Leases: at most one live agent instance works a stream, across processes and hosts.

A lease is an event on the stream itself, :class:`StreamLeased` (runtime-only): its holder,
a token naming this claim, when it expires, and whether it is held, released, or held back
after provider failures (a backoff). The stream's newest lease event is its lease. A claim
appends one with the ``expected_version`` at which it read the current lease, so of two
claimants only one can land; the holder renews it (a new event, the same token) while it
works and releases it when it is done.

The fence. Every append the holder makes to the stream (the agent's, through
:attr:`StreamLease.journal`) carries ``expected_version``: the last version this instance
knows. The store checks it inside its own append transaction (PostgreSQL under the
stream's ``cf_streams`` row lock, SQLite under ``BEGIN IMMEDIATE``, memory under its lock),
so an append lands only right after what the instance has seen. When another writer
appended meanwhile (a user message, a webhook), the instance reads what came after its
version: a lease event with another token among it means another instance claimed the
stream, and the append fails with LeaseLostError (nothing written; the instance stops);
anything else moves its version on and it tries again. A takeover is itself an event, so
once it lands no append of the old holder can land after it, however late a paused or
partitioned instance makes it. This needs no clock and no new store operation: it holds on
every backend that passes the store contract, across processes and hosts. (Checking a
lease token inside the store's transaction would have needed a new operation in every
backend and in the contract.)

Clocks only decide liveness: a claimant takes over a lease that its own clock reads as
expired, so skew between hosts makes a takeover early or late, never two appending
holders. What happens outside the journal cannot be fenced: a model call or a tool the old
holder started before a takeover runs on. The new holder re-sends an unanswered request
byte for byte (recorded as a retry), reports a started tool call as possibly run (see
``tool_runs``), and the old holder's answer to either is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field, ValidationError

from ..errors import (
    ConfigurationError,
    ConflictError,
    CorruptEventError,
    LeaseHeldError,
    LeaseLostError,
    StoreError,
    WrongExpectedVersionError,
)
from ..events import Event, RawEvent, StoredEvent
from ..journal import Journal
from ..journal.encode import Clock
from ..store.base import MAX_LIMIT, AppendResult
from .scheduling import AGENT

__all__ = [
    "LEASE_TTL",
    "FencedJournal",
    "LeaseRecord",
    "LeaseState",
    "LeaseStatus",
    "StreamLease",
    "StreamLeased",
    "claim_lease",
    "hold_lease",
    "lease_table",
    "new_holder",
    "read_lease",
]

log = logging.getLogger("contextfold.runtime")

LEASE_TTL = 30.0
"""Seconds a lease lasts unless renewed (the holder renews it after a third of that)."""

LeaseState = Literal["held", "released", "backoff"]
LeaseStatus = Literal["held", "released", "backoff", "expired"]

_CLAIM_ATTEMPTS = 16  # claims in a row that lost a race with another append
_FENCE_ATTEMPTS = 100  # catch-ups in a row while other writers keep appending
_CATCH_UP_PAGE = 1000
_MAX_HOLDER = 200


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


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The stream's lease as the journal records it: its newest lease event, at ``position``."""

    stream: str
    holder: str
    token: str
    expires_at: datetime
    state: LeaseState
    failures: int
    position: int

    def status(self, now: datetime) -> LeaseStatus:
        """``released``, ``expired`` (lapsed at ``now``), else ``held`` or ``backoff``."""
        if self.state == "released":
            return "released"
        if now >= self.expires_at:
            return "expired"
        return self.state

    def as_json(self, now: datetime) -> dict[str, str | int]:
        """The record as ``worker status`` shows it, its status at ``now``."""
        return {
            "stream": self.stream,
            "holder": self.holder,
            "state": self.status(now),
            "expires_at": self.expires_at.isoformat(),
            "failures": self.failures,
            "position": self.position,
        }

    def free_for(self, holder: str, now: datetime) -> bool:
        """Whether ``holder`` may claim the stream at ``now``: the lease was released or has
        lapsed, or ``holder`` holds it itself (resuming its own work; its backoff binds it)."""
        status = self.status(now)
        return status in ("released", "expired") or (status == "held" and holder == self.holder)


def new_holder() -> str:
    """A holder name unique to this process: host, process id and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _check_settings(holder: object, ttl: object) -> None:
    if not isinstance(holder, str) or not holder or len(holder) > _MAX_HOLDER:
        raise ConfigurationError(
            f"holder must be a non-empty str of at most {_MAX_HOLDER} characters, got {holder!r}"
        )
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, (int, float))
        or not math.isfinite(ttl)
        or ttl <= 0
    ):
        raise ConfigurationError(f"ttl must be a positive number of seconds, got {ttl!r}")


def _decode(stored: StoredEvent) -> StreamLeased | None:
    """The lease event, or None (logged) when the row no longer decodes."""
    try:
        event = stored.decode(StreamLeased)
    except (ValidationError, CorruptEventError) as exc:
        log.warning("lease event %s@%s does not decode: %s", stored.stream, stored.position, exc)
        return None
    assert isinstance(event, StreamLeased)
    return event


async def read_lease(journal: Journal, stream: str) -> LeaseRecord | None:
    """The stream's lease (its newest lease event), or None when it has none. A newest lease
    event that no longer decodes counts as none: a claim after it still goes through the
    fence, which is what keeps two holders apart."""
    found = await journal.latest(stream, [StreamLeased])
    if not found:
        return None
    event = _decode(found[0])
    if event is None:
        return None
    return LeaseRecord(
        stream=stream,
        holder=event.holder,
        token=event.token,
        expires_at=event.expires_at,
        state=event.state,
        failures=event.failures,
        position=found[0].position,
    )


async def lease_table(journal: Journal, *, prefix: str | None = None) -> tuple[LeaseRecord, ...]:
    """The lease of every stream of the namespace that has one (by name; at most
    :data:`~contextfold.store.base.MAX_LIMIT` streams are looked at: narrow with ``prefix``)."""
    records: list[LeaseRecord] = []
    for info in await journal.list_streams(prefix=prefix, limit=MAX_LIMIT):
        record = await read_lease(journal, info.stream)
        if record is not None:
            records.append(record)
    return tuple(records)


class StreamLease:
    """A lease this instance holds on one stream, and the fence of its appends there.

    Made by :func:`claim_lease`. :attr:`journal` is the journal to build the agent with:
    its appends to the stream go through :meth:`append`; its reads are the journal's own.
    Once the lease is lost (or released), every append raises LeaseLostError.
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
        expires_at: datetime,
        failures: int,
        claimed: AppendResult,
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
        self._version = claimed.version
        self._cursor = claimed.cursor
        self._lock = asyncio.Lock()
        self._ended: LeaseLostError | None = None
        self._lost = False
        self.journal: Journal = FencedJournal(self, journal)

    @property
    def expires_at(self) -> datetime:
        return self._expires_at

    @property
    def version(self) -> int:
        """The stream's version as far as this instance has seen it."""
        return self._version

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
        events: Event | RawEvent | Iterable[Event | RawEvent],
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
        batch = [events] if isinstance(events, (Event, RawEvent)) else list(events)
        async with self._lock:
            self._check()
            if self._clock() >= self._expires_at:
                # Paused past the expiry: renew first, which lands only if nobody took over.
                await self._write("held", self.ttl, failures=self.failures)
            return await self._fenced(
                batch,
                expected_version=expected_version,
                idempotency_key=idempotency_key,
                run_id=run_id,
                actor=actor,
                channels=channels,
            )

    async def renew(self) -> None:
        """Extend the lease by ``ttl`` from now. Raises LeaseLostError when it was lost."""
        async with self._lock:
            self._check()
            await self._write("held", self.ttl, failures=self.failures)

    async def release(self, *, backoff: float = 0.0, failures: int = 0) -> None:
        """Hand the lease back: at once, or after ``backoff`` seconds during which nobody
        works the stream (after ``failures`` provider failures in a row). Nothing happens
        when it was lost or released already."""
        async with self._lock:
            if self._ended is not None:
                return
            state: LeaseState = "backoff" if backoff > 0 else "released"
            try:
                await self._write(state, max(backoff, 0.0), failures=failures)
            except LeaseLostError:
                return  # taken over meanwhile: not this instance's to hand back
            self._ended = LeaseLostError(
                f"the lease of {self.holder!r} on stream {self.stream!r} was released: "
                "claim it again to append",
                stream=self.stream,
                holder=self.holder,
                position=self._version,
            )

    @contextlib.asynccontextmanager
    async def renewing(self) -> AsyncIterator[StreamLease]:
        """Renew the lease in the background while the block runs (after a third of
        ``ttl`` each time). A renewal that finds the lease lost stops renewing; the next
        append raises."""
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

    async def _write(self, state: LeaseState, seconds: float, *, failures: int) -> None:
        expires = self._clock() + timedelta(seconds=seconds)
        event = StreamLeased(
            holder=self.holder,
            token=self.token,
            expires_at=expires,
            state=state,
            failures=failures,
        )
        await self._fenced([event], actor=AGENT, channels=())
        self._expires_at = expires

    async def _fenced(
        self,
        batch: Sequence[Event | RawEvent],
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
            expected = self._version if expected_version is None else expected_version
            try:
                result = await self._base.append(
                    self.stream,
                    batch,
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
            if not result.deduplicated:
                self._version, self._cursor = result.version, result.cursor
            return result
        raise ConflictError(
            f"stream {self.stream!r}: {_FENCE_ATTEMPTS} appends in a row lost a race with "
            "other writers; nothing was written, retry later"
        )

    async def _catch_up(self) -> None:
        """Read what other writers appended after this instance's version: raise
        LeaseLostError when a lease event of another claim is among it."""
        while True:
            page = await self._base.read(self.stream, after=self._cursor, limit=_CATCH_UP_PAGE)
            if page.reset:
                raise self._lose(None, f"stream {self.stream!r} was deleted")
            for stored in page.events:
                if stored.type == StreamLeased.event_type:
                    event = _decode(stored)
                    if event is None or event.token != self.token:
                        by = "an unreadable lease event" if event is None else repr(event.holder)
                        raise self._lose(
                            stored.position,
                            f"stream {self.stream!r} was claimed by {by} at @{stored.position}",
                        )
                self._version, self._cursor = stored.position, stored.cursor
            if not page.more:
                return

    def _lose(self, position: int | None, why: str) -> LeaseLostError:
        self._lost = True
        self._ended = LeaseLostError(
            f"{why}: {self.holder!r} lost its lease (it lapsed and another instance took "
            "over); nothing was written and this instance must stop",
            stream=self.stream,
            holder=self.holder,
            position=position,
        )
        return self._ended

    async def _renew_loop(self) -> None:
        retry = min(self.ttl / 10, 1.0)
        while self._ended is None:
            due = (self._expires_at - self._clock()).total_seconds() - self.ttl * 2 / 3
            await asyncio.sleep(max(due, 0.0))
            try:
                await self.renew()
            except LeaseLostError:
                return
            except StoreError as exc:  # the database is away: keep trying while it lasts
                log.warning("renewing the lease on %r failed: %s", self.stream, exc)
                await asyncio.sleep(retry)


class FencedJournal(Journal):
    """The journal as a lease holder sees it: appends to the leased stream go through the
    lease's fence (:meth:`StreamLease.append`); everything else is the journal's own (the
    same store and fold cache)."""

    def __init__(self, lease: StreamLease, journal: Journal) -> None:
        super().__init__(
            journal.store,
            namespace=journal.namespace,
            max_payload_bytes=journal.max_payload_bytes,
            clock=journal.clock,
            ids=journal.ids,
            _shared=journal._shared,
        )
        self.lease = lease

    async def append(
        self,
        stream: str,
        events: Event | RawEvent | Iterable[Event | RawEvent],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        actor: str | None = None,
        channels: Sequence[str] = ("main",),
    ) -> AppendResult:
        if stream != self.lease.stream:
            return await super().append(
                stream,
                events,
                expected_version=expected_version,
                idempotency_key=idempotency_key,
                run_id=run_id,
                actor=actor,
                channels=channels,
            )
        return await self.lease.append(
            events,
            expected_version=expected_version,
            idempotency_key=idempotency_key,
            run_id=run_id,
            actor=actor,
            channels=channels,
        )


async def claim_lease(
    journal: Journal,
    stream: str,
    *,
    holder: str,
    ttl: float = LEASE_TTL,
    clock: Clock | None = None,
) -> StreamLease:
    """Claim the stream's lease for ``holder`` for ``ttl`` seconds: it lands only when the
    lease is free (released, lapsed, or ``holder``'s own) at the version it was read at.

    ``clock`` defaults to the journal's. Raises LeaseHeldError when another instance holds
    it, ConfigurationError for a bad holder or ttl, ConflictError when other writers kept
    winning the race.
    """
    _check_settings(holder, ttl)
    now_of = clock or journal.clock
    conflict: WrongExpectedVersionError | None = None
    for _ in range(_CLAIM_ATTEMPTS):
        # The version first: a lease event appended after it makes the claim's append fail.
        version = await journal.version(stream)
        current = await read_lease(journal, stream)
        now = now_of()
        if current is not None and not current.free_for(holder, now):
            raise LeaseHeldError(
                f"stream {stream!r} is leased to {current.holder!r} "
                f"({current.status(now)}) until {current.expires_at.isoformat()}: "
                "claim it once that lease is released or has lapsed",
                stream=stream,
                holder=current.holder,
                expires_at=current.expires_at.isoformat(),
            )
        failures = current.failures if current is not None and current.state == "backoff" else 0
        token = journal.ids()
        expires = now + timedelta(seconds=ttl)
        claim = StreamLeased(holder=holder, token=token, expires_at=expires, failures=failures)
        try:
            claimed = await journal.append(
                stream, claim, expected_version=version, actor=AGENT, channels=()
            )
        except WrongExpectedVersionError as exc:
            conflict = exc
            continue
        return StreamLease(
            journal,
            stream,
            holder=holder,
            token=token,
            ttl=float(ttl),
            clock=now_of,
            expires_at=expires,
            failures=failures,
            claimed=claimed,
        )
    assert conflict is not None
    raise ConflictError(
        f"stream {stream!r}: {_CLAIM_ATTEMPTS} lease claims in a row lost a race with other "
        "appends; nothing was written, retry later"
    ) from conflict


@contextlib.asynccontextmanager
async def hold_lease(
    journal: Journal,
    stream: str,
    *,
    holder: str | None = None,
    ttl: float = LEASE_TTL,
) -> AsyncIterator[StreamLease]:
    """Claim the stream's lease, renew it while the block runs, release it afterwards.

    Build the agent on ``lease.journal`` inside the block: its appends are fenced. Raises
    LeaseHeldError when another instance holds the lease; a lease lost meanwhile is not
    released (the block's append raised LeaseLostError already).
    """
    lease = await claim_lease(journal, stream, holder=holder or new_holder(), ttl=ttl)
    async with lease.renewing():
        try:
            yield lease
        finally:
            try:
                await lease.release()
            except StoreError as exc:  # it lapses by itself; never hide the block's error
                log.warning("releasing the lease on %r failed: %s", stream, exc)
