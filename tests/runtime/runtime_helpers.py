"""Shared helpers for the runtime tests: journals, items, an observer and journal queries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from contextfold.context.events import (
    Actor,
    ContextAdded,
    LlmRequestInterrupted,
    LlmRequestPolicy,
    LlmRequestRequested,
    LlmResponse,
)
from contextfold.context.rebuild import RequestRecorded
from contextfold.events import Event, StoredEvent
from contextfold.journal import Journal, open_journal
from contextfold.runtime.events import LoopEvent, RequestSent
from contextfold.runtime.scheduling import AgentHalted
from contextfold.wire import NeutralRequest, RenderedRequest

__all__ = [
    "STREAM",
    "Observer",
    "assistant_texts",
    "events_of",
    "fixed_clock",
    "memory_journal",
    "requests_of",
    "text_of",
    "user",
]

STREAM = "agents/test"


def fixed_clock(start: datetime | None = None) -> Any:
    """A deterministic journal clock: one millisecond further at every call."""
    state = {"now": start or datetime(2026, 1, 1, tzinfo=UTC)}

    def clock() -> datetime:
        state["now"] += timedelta(milliseconds=1)
        return state["now"]

    return clock


async def memory_journal(**options: Any) -> AsyncIterator[Journal]:
    journal = open_journal("memory://", **options)
    async with journal:
        yield journal


def user(text: str, behaviour: str | None = None) -> ContextAdded:
    """A human message, optionally with an explicit request policy."""
    policy = None if behaviour is None else LlmRequestPolicy(behaviour=behaviour)
    return ContextAdded(
        role="user", actor=Actor(type="user"), content=text, llm_request_policy=policy
    )


def text_of(request: NeutralRequest) -> str:
    """Every message of a neutral request joined: for "does the request include X" checks."""
    return "\n".join(m.content for m in request.messages)


async def events_of(journal: Journal, stream: str, cls: type[Event]) -> list[tuple[int, Any]]:
    """(position, decoded payload) of every event of one type, in stream order."""
    found: list[tuple[int, Any]] = []
    async for stored in journal.read_all(stream):
        if stored.type == cls.event_type:
            found.append((stored.position, stored.decode(cls)))
    return found


async def stored_of(journal: Journal, stream: str, cls: type[Event]) -> list[StoredEvent]:
    return [s async for s in journal.read_all(stream) if s.type == cls.event_type]


async def requests_of(journal: Journal, stream: str) -> list[int]:
    return [p for p, _ in await events_of(journal, stream, LlmRequestRequested)]


async def recorded_of(journal: Journal, stream: str) -> dict[int, list[str]]:
    """Request offset -> every recorded sha256 (a retry records again)."""
    recorded: dict[int, list[str]] = {}
    for _, record in await events_of(journal, stream, RequestRecorded):
        recorded.setdefault(record.request_offset, []).append(record.sha256)
    return recorded


async def interrupted_of(journal: Journal, stream: str) -> list[int]:
    return [e.request_offset for _, e in await events_of(journal, stream, LlmRequestInterrupted)]


async def halts_of(journal: Journal, stream: str) -> list[AgentHalted]:
    return [e for _, e in await events_of(journal, stream, AgentHalted)]


async def assistant_texts(journal: Journal, stream: str) -> list[str]:
    return [e.text for _, e in await events_of(journal, stream, LlmResponse)]


_E = TypeVar("_E")


class Observer:
    """Records every loop event; ``sent`` maps request offset to the bodies sent for it."""

    def __init__(self) -> None:
        self.events: list[LoopEvent] = []
        self.sent: dict[int, list[RenderedRequest]] = {}
        self.neutral: dict[int, list[NeutralRequest]] = {}

    async def on_event(self, event: LoopEvent) -> None:
        self.events.append(event)
        if isinstance(event, RequestSent):
            self.sent.setdefault(event.offset, []).append(event.rendered)
            self.neutral.setdefault(event.offset, []).append(event.neutral)

    def of(self, kind: type[_E]) -> list[_E]:
        """The recorded events of one class, in order."""
        return [event for event in self.events if isinstance(event, kind)]
