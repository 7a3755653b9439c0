"""The in-process transcript bus: row updates and deltas, per session, to live subscribers.

The writer publishes a :class:`MessageUpdated` or :class:`PartUpdated` after a row is
written, and a :class:`PartDelta` for every text or reasoning fragment (which is never
written). The HTTP layer streams a subscription as SSE; a client opens it *before* it
starts a turn, or the first deltas are gone.

Slow subscribers never slow the writer. Each subscription holds at most ``maxsize``
undelivered events and ``max_bytes`` of them (their JSON as :func:`encode_bus_event`
writes it; one event larger than that is still taken when nothing else waits), so a
reader that stops reading costs bounded memory; :meth:`TranscriptBus.publish` never
waits. A subscriber that falls further behind is cut off: it receives what was queued,
then iteration raises :class:`BusOverflowError`. Dropping events silently instead would
leave a UI stitching deltas with a hole in them; an explicit cut tells it to re-read the
rows (which hold every finished block) and subscribe again.

The bus lives in one event loop: call :meth:`~TranscriptBus.publish` from that loop's
thread. Replicas of a server each have their own bus (fed by their own writers).
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any, Literal

from .. import canonical
from ..errors import BusOverflowError, InvalidInputError
from .parts import Message, Part

__all__ = [
    "DEFAULT_MAX_PENDING",
    "DEFAULT_MAX_PENDING_BYTES",
    "BusEvent",
    "BusOverflowError",
    "MessageUpdated",
    "PartDelta",
    "PartUpdated",
    "Subscription",
    "TranscriptBus",
    "encode_bus_event",
]

DEFAULT_MAX_PENDING = 10_000
"""The most undelivered events a subscription holds by default."""
DEFAULT_MAX_PENDING_BYTES = 8 * 1024 * 1024
"""The most bytes of undelivered events (as encoded for SSE) a subscription holds by default."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageUpdated:
    """A message row was written (created, finished or closed by cleanup)."""

    namespace: str
    session: str
    message: Message
    type: Literal["message-updated"] = "message-updated"


@dataclass(frozen=True, slots=True, kw_only=True)
class PartUpdated:
    """A part row was written; it holds the whole part as stored."""

    namespace: str
    session: str
    part: Part
    type: Literal["part-updated"] = "part-updated"


@dataclass(frozen=True, slots=True, kw_only=True)
class PartDelta:
    """A fragment to append to the ``text`` of a streaming text or reasoning part."""

    namespace: str
    session: str
    message_id: str
    part_id: str
    part_kind: Literal["text", "reasoning"]
    delta: str
    type: Literal["part-delta"] = "part-delta"


BusEvent = MessageUpdated | PartUpdated | PartDelta


def encode_bus_event(event: BusEvent) -> bytes:
    """The event as compact JSON for an SSE ``data:`` line (``type`` names the kind)."""
    body: dict[str, Any] = {"type": event.type, "session": event.session}
    if isinstance(event, MessageUpdated):
        body["message"] = event.message.model_dump(mode="json")
    elif isinstance(event, PartUpdated):
        body["part"] = event.part.model_dump(mode="json")
    else:
        body.update(
            message_id=event.message_id,
            part_id=event.part_id,
            part_kind=event.part_kind,
            delta=event.delta,
        )
    return canonical.dumps(body)


class _Signal(enum.Enum):
    CLOSED = "closed"
    OVERFLOW = "overflow"


class Subscription:
    """Events of one session, in publish order. Iterate it; close it when done.

    Iteration ends after :meth:`close`, and raises :class:`BusOverflowError` once the
    events queued before a cut-off are consumed.
    """

    def __init__(
        self,
        bus: TranscriptBus,
        namespace: str,
        session: str,
        maxsize: int,
        max_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    ) -> None:
        self.namespace = namespace
        self.session = session
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self._bus = bus
        self._queue: asyncio.Queue[tuple[BusEvent, int] | _Signal] = asyncio.Queue()
        self._bytes = 0  # of the events queued
        self._stopping: _Signal | None = None  # why it stopped receiving, once it has
        self._ended: _Signal | None = None  # the same, once the consumer reached that point

    @property
    def overflowed(self) -> bool:
        """Whether the subscriber was cut off for falling behind."""
        return self._stopping is _Signal.OVERFLOW

    @property
    def pending(self) -> int:
        """Events published to it but not yet consumed."""
        signal_queued = self._stopping is not None and self._ended is None
        return self._queue.qsize() - signal_queued

    def drain(self) -> list[BusEvent]:
        """The events queued now, without waiting (for batching, or tests)."""
        events: list[BusEvent] = []
        while self._ended is None and not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, _Signal):
                self._ended = item
                break
            events.append(self._taken(item))
        return events

    def _taken(self, item: tuple[BusEvent, int]) -> BusEvent:
        self._bytes -= item[1]
        return item[0]

    def _offer(self, event: BusEvent, size: int) -> bool:
        over = self._bytes > 0 and self._bytes + size > self.max_bytes
        if self._queue.qsize() >= self.maxsize or over:
            self._stop(_Signal.OVERFLOW)
            return False
        self._queue.put_nowait((event, size))
        self._bytes += size
        return True

    def _stop(self, signal: _Signal) -> None:
        if self._stopping is not None:
            return
        self._stopping = signal
        self._bus._remove(self)
        self._queue.put_nowait(signal)

    def close(self) -> None:
        """Stop receiving; events already queued are still delivered, then iteration ends."""
        self._stop(_Signal.CLOSED)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> BusEvent:
        if self._ended is None:
            item = await self._queue.get()
            if not isinstance(item, _Signal):
                return self._taken(item)
            self._ended = item
        if self._ended is _Signal.OVERFLOW:
            raise BusOverflowError(
                f"subscriber of session {self.session!r} fell more than {self.maxsize} events "
                f"or {self.max_bytes} bytes behind and was cut off: re-read the transcript "
                "rows and subscribe again",
                session=self.session,
            )
        raise StopAsyncIteration

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class TranscriptBus:
    """Publish/subscribe of transcript events, one topic per (namespace, session)."""

    def __init__(self) -> None:
        self._topics: dict[tuple[str, str], list[Subscription]] = {}

    def subscribe(
        self,
        session: str,
        *,
        namespace: str = "default",
        maxsize: int = DEFAULT_MAX_PENDING,
        max_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    ) -> Subscription:
        """A new subscription, receiving every event published from now on; it is cut off
        once more than ``maxsize`` events or ``max_bytes`` bytes of them wait for it."""
        for name, limit in (("maxsize", maxsize), ("max_bytes", max_bytes)):
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise InvalidInputError(f"{name} must be a positive int, got {limit!r}")
        sub = Subscription(self, namespace, session, maxsize, max_bytes)
        self._topics.setdefault((namespace, session), []).append(sub)
        return sub

    def publish(self, event: BusEvent) -> int:
        """Queue ``event`` for every subscriber of its session; never waits.

        Returns how many subscribers took it (a subscriber over its limit is cut off).
        """
        subs = self._topics.get((event.namespace, event.session))
        if not subs:
            return 0
        size = len(encode_bus_event(event))
        return sum(sub._offer(event, size) for sub in tuple(subs))

    def subscribers(self, session: str, *, namespace: str = "default") -> int:
        """How many live subscriptions the session has."""
        return len(self._topics.get((namespace, session), ()))

    def _remove(self, sub: Subscription) -> None:
        key = (sub.namespace, sub.session)
        subs = self._topics.get(key)
        if subs is not None and sub in subs:
            subs.remove(sub)
            if not subs:
                del self._topics[key]
