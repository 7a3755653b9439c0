"""Leases: at most one live agent instance works a stream, across processes and hosts.

A lease is an event on the stream itself, :class:`~contextfold.runtime.fence.StreamLeased`
(runtime-only): its holder, a token naming this claim, when it expires, and whether it is
held, released, or held back after provider failures (a backoff). The stream's newest lease
event is its lease. A claim reads it at a version and lands at that expected version, so of
two claimants only one can land; the holder renews it (a new event, the same token) while it
works and releases it when it is done. Its appends go through the fence
(:mod:`~contextfold.runtime.fence`: expected versions, and why).

Clocks only decide liveness: a claimant takes over a lease that its own clock reads as
expired, so skew between hosts makes a takeover early or late, never two appending
holders. What happens outside the journal cannot be fenced: a model call or a tool the old
holder started before a takeover runs on. The new holder re-sends an unanswered request
byte for byte (recorded as a retry), reports a started tool call as possibly run (see
``tool_runs``), and the old holder's answer to either is refused.

The clock bound. A live holder renews its lease once less than two thirds of its ``ttl``
are left (by its own clock), so a host whose clock runs ahead of the holder's by less than
that never reads a live holder's lease as expired. The lease is meant for clocks at most a
third of the ``ttl`` apart (10 s at the default 30 s), leaving the other third for the
renewal's own delays (a slow database, a busy event loop). Beyond it nothing is written
twice, but a host whose clock runs ahead takes live holders' streams over (their work in
flight is then re-sent or reported as possibly run, as after a crash), and a host whose
clock runs behind takes a dead holder's streams over that much later.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from ..errors import (
    ConfigurationError,
    ConflictError,
    LeaseHeldError,
    StoreError,
    WrongExpectedVersionError,
)
from ..events import StoredEvent
from ..journal import Journal
from ..journal.encode import Clock
from ..store.base import MAX_LIMIT
from .fence import LeaseState, StreamLease, StreamLeased, decode_lease
from .scheduling import AGENT

__all__ = [
    "LEASE_TTL",
    "LeaseRecord",
    "LeaseState",
    "LeaseStatus",
    "LeaseView",
    "StreamLease",
    "StreamLeased",
    "claim_lease",
    "confirm_claim",
    "hold_lease",
    "lease_table",
    "new_holder",
    "read_lease",
    "view_lease",
]

log = logging.getLogger("contextfold.runtime")

LEASE_TTL = 30.0
"""Seconds a lease lasts unless renewed (the holder renews it after a third of that)."""

LeaseStatus = Literal["held", "released", "backoff", "expired"]

_CLAIM_ATTEMPTS = 16  # claims in a row that lost a race with another append
_MAX_HOLDER = 200
_LEASED = (StreamLeased.event_type,)


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
    cursor: str | None = None
    """The lease event's cursor."""
    idle: bool = False
    """Handed back by a holder that left nothing to do before it (``StreamLeased.idle``)."""
    returning: bool = False
    """Handed back by a worker that claims it again when it has work
    (``StreamLeased.returning``)."""

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


async def read_lease(journal: Journal, stream: str) -> LeaseRecord | None:
    """The stream's lease (its newest lease event), or None when it has none. A newest lease
    event that no longer decodes counts as none: a claim after it still goes through the
    fence, which is what keeps two holders apart."""
    found = await journal.latest(stream, [StreamLeased])
    return _record(stream, found[0] if found else None)


def _record(stream: str, found: StoredEvent | None) -> LeaseRecord | None:
    event = None if found is None else decode_lease(found)
    if found is None or event is None:
        return None
    return LeaseRecord(
        stream=stream,
        holder=event.holder,
        token=event.token,
        expires_at=event.expires_at,
        state=event.state,
        failures=event.failures,
        position=found.position,
        cursor=found.cursor,
        idle=event.idle,
        returning=event.returning,
    )


@dataclass(frozen=True, slots=True)
class LeaseView:
    """A stream's lease as of a version: what a claim lands at (:func:`view_lease`)."""

    version: int
    lease: LeaseRecord | None
    """The newest lease event at or before ``version``."""
    head: str | None = None
    """The stream's head (its newest event's cursor) as the look read it: with the version
    on PostgreSQL (one statement), just after it elsewhere (then it may be newer, and a
    claim at the version finds the stream moved on and looks again); None for a stream
    without events. A version alone may be an old history's: a stream deleted and made
    again reaches it with other events, never its old head."""

    @property
    def cursor(self) -> str | None:
        """Where a catch-up after ``version`` may start reading: the lease event (nothing
        before it can take the stream over), or the stream's start when it has none."""
        return self.lease.cursor if self.lease is not None else None

    @property
    def settled(self) -> bool:
        """Whether the stream ends with an idle hand-back: nothing to do until it changes."""
        lease = self.lease
        return lease is not None and lease.idle and lease.position == self.version


async def view_lease(journal: Journal, stream: str, *, version: int | None = None) -> LeaseView:
    """The stream's version, then its lease, then its head: three reads (two when
    ``version`` is given: read just before, or heard of in a notification; one behind the
    stream's only makes a claim at it catch up as it lands). A lease event newer than the
    version moves the version up to it: it is the newest lease event there all the same.
    The head, read last, is of the history the claim lands in: a stream deleted and made
    again meanwhile has another head, whatever its version (a settled view, which nothing
    claims, skips it: a claim from it reads it then). On PostgreSQL one statement reads
    the version, the head and the lease together (``version`` is not needed)."""
    together = await journal.latest_at_head(stream, _LEASED)
    if together is not None:
        version, head, found = together
        return LeaseView(version, _record(stream, found), head)
    if version is None:
        version = await journal.version(stream)
    current = await read_lease(journal, stream)
    if current is not None and current.position > version:
        version = current.position
    view = LeaseView(version, current)
    if view.settled:  # handed back idle with nothing after: a worker leaves it unclaimed
        return view
    return LeaseView(version, current, await journal.head(stream))


async def lease_table(
    journal: Journal, *, prefix: str | None = None, page_size: int = MAX_LIMIT
) -> tuple[LeaseRecord, ...]:
    """The lease of every stream of the namespace that has one (by name; only streams
    starting with ``prefix`` when given), its streams listed ``page_size`` at a time."""
    records: list[LeaseRecord] = []
    async for info in journal.all_streams(prefix=prefix, page_size=page_size):
        record = await read_lease(journal, info.stream)
        if record is not None:
            records.append(record)
    return tuple(records)


async def claim_lease(
    journal: Journal,
    stream: str,
    *,
    holder: str,
    ttl: float = LEASE_TTL,
    clock: Clock | None = None,
    lazy: bool = False,
    view: LeaseView | None = None,
) -> StreamLease:
    """Claim the stream's lease for ``holder`` for ``ttl`` seconds: it lands only when the
    lease is free (released, lapsed, or ``holder``'s own) at the version it was read at.
    ``lazy``: written with the holder's first append instead of now (see ``fence``).
    ``view``: the stream's lease as the caller just read it (:func:`view_lease`), used for
    the first attempt instead of reading it again.

    ``clock`` defaults to the journal's. Raises LeaseHeldError when another instance holds
    it, ConfigurationError for a bad holder or ttl, ConflictError when other writers kept
    winning the race.
    """
    _check_settings(holder, ttl)
    now_of = clock or journal.clock
    conflict: WrongExpectedVersionError | None = None
    for attempt in range(_CLAIM_ATTEMPTS):
        seen = view if view is not None and attempt == 0 else await view_lease(journal, stream)
        current, version, cursor, head = seen.lease, seen.version, seen.cursor, seen.head
        if lazy and head is None and version:  # read after the version: its history's
            head = await journal.head(stream)
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
        if not lazy:
            claim = StreamLeased(holder=holder, token=token, expires_at=expires, failures=failures)
            try:
                claimed = await journal.append(
                    stream, claim, expected_version=version, actor=AGENT, channels=()
                )
            except WrongExpectedVersionError as exc:
                conflict = exc
                continue
            version, cursor = claimed.version, claimed.cursor
            head = claimed.cursor  # its claim is the stream's newest event
        return StreamLease(
            journal,
            stream,
            holder=holder,
            token=token,
            ttl=float(ttl),
            clock=now_of,
            failures=failures,
            version=version,
            cursor=cursor,
            head=head,
            expires_at=expires,
            landed=not lazy,
        )
    assert conflict is not None
    raise ConflictError(
        f"stream {stream!r}: {_CLAIM_ATTEMPTS} lease claims in a row lost a race with other "
        "appends; nothing was written, retry later"
    ) from conflict


async def confirm_claim(journal: Journal) -> None:
    """On a lease holder's journal (:attr:`StreamLease.journal`), make a lazy claim still
    pending land now: before work no append precedes (a compaction's summary call).
    Nothing on another journal. Raises LeaseLostError when another instance has the lease."""
    lease = journal.fence
    if isinstance(lease, StreamLease):
        await lease.confirm()


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
