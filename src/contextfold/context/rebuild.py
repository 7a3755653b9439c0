"""Rebuilding recorded requests from the journal, byte for byte, and verifying them.

A request @N is a pure function of the journal through N: the context fold through the
request event (which carries its header snapshot) rendered for the header's transport.
Whatever is appended later, the rebuild gives the same bytes. ``RequestRecorded`` keeps
the hash of the bytes actually sent, so :func:`verify_requests` can prove it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol

from pydantic import Field, ValidationError

from ..errors import RebuildError
from ..events import Event, StoredEvent
from ..wire import RenderedRequest, render_request
from .projection import AgentContext
from .request import build_request
from .state import AgentContextState

__all__ = ["RequestDrift", "RequestRecorded", "rebuild_request", "rebuild_state", "verify_requests"]


class RequestRecorded(Event, type="contextfold.agent/request-recorded", runtime_only=True):
    """What was sent for request ``request_offset``: transport, size and SHA-256 of the body."""

    request_offset: int = Field(ge=1)
    transport: str
    sha256: str
    size: int = Field(ge=0)


class _Reader(Protocol):
    def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]: ...


@dataclass(frozen=True, slots=True)
class RequestDrift:
    """A recorded request whose rebuild differs (or fails)."""

    request_offset: int
    recorded: str
    rebuilt: str | None
    error: str | None = None


def _fold(state: AgentContextState, stored: StoredEvent) -> AgentContextState:
    try:
        envelope = AgentContext.decode(stored)
    except (ValueError, ValidationError):
        return state  # the fold skips what does not decode; the rebuild must agree
    return state if envelope is None else AgentContext.apply(state, envelope)


async def rebuild_state(journal: _Reader, stream: str, offset: int) -> AgentContextState:
    """The agent context folded through ``offset`` (inclusive), from the journal's start.

    Reads only the event types of the ``AgentContext`` fold.
    """
    state = AgentContext.initial_state()
    events = journal.read_all(stream, types=AgentContext.event_types)
    async with aclosing(events):  # type: ignore[type-var]
        async for stored in events:
            if stored.position > offset:
                break
            state = _fold(state, stored)
    return state


def _render(state: AgentContextState, stream: str, offset: int) -> RenderedRequest:
    """Request @``offset`` from ``state``, the context folded exactly through it."""
    if state.request_offset != offset or state.header is None:
        raise RebuildError(
            f"stream {stream!r} position {offset} is not a model request with a header "
            "(an LlmRequestRequested); pass the offset of a request event"
        )
    try:
        return render_request(build_request(state), state.header.transport)
    except Exception as exc:
        raise RebuildError(
            f"request @{offset} of stream {stream!r} cannot be rebuilt: {exc}"
        ) from exc


async def rebuild_request(journal: _Reader, stream: str, offset: int) -> RenderedRequest:
    """The exact request body of request @``offset``. Raises RebuildError when @offset is not
    a request event or cannot be rendered."""
    return _render(await rebuild_state(journal, stream, offset), stream, offset)


def _drifts(
    state: AgentContextState, stream: str, offset: int, shas: list[str]
) -> list[RequestDrift]:
    try:
        rebuilt: str | None = _render(state, stream, offset).sha256
        error = None
    except RebuildError as exc:
        rebuilt, error = None, str(exc)
    return [RequestDrift(offset, sha, rebuilt, error) for sha in shas if sha != rebuilt]


async def verify_requests(journal: _Reader, stream: str) -> tuple[RequestDrift, ...]:
    """Rebuild every recorded request of ``stream`` and report each record whose hash the
    rebuild does not give: different bytes, or an offset that is no request (an error).

    Every record counts (a retry records the same request again), in offset order.
    A request that was never recorded (interrupted before it was sent) is not checked.
    One pass: the records and the context events are each read once, the events folded
    in order, and each recorded request rendered from the state folded exactly through
    it; nothing is re-read per request (each still costs its own render).
    """
    recorded: dict[int, list[str]] = {}
    async for stored in journal.read_all(stream, types=(RequestRecorded.event_type,)):
        record = stored.decode(RequestRecorded)
        assert isinstance(record, RequestRecorded)
        shas = recorded.setdefault(record.request_offset, [])
        if record.sha256 not in shas:
            shas.append(record.sha256)
    pending = sorted(recorded)
    drifts: list[RequestDrift] = []
    state = AgentContext.initial_state()
    index = 0
    if pending:
        events = journal.read_all(stream, types=AgentContext.event_types)
        async with aclosing(events):  # type: ignore[type-var]
            async for stored in events:
                # The state now holds every context event before this one.
                while index < len(pending) and pending[index] < stored.position:
                    offset = pending[index]
                    drifts.extend(_drifts(state, stream, offset, recorded[offset]))
                    index += 1
                if index == len(pending):
                    break
                state = _fold(state, stored)
    for offset in pending[index:]:
        drifts.extend(_drifts(state, stream, offset, recorded[offset]))
    return tuple(drifts)
