"""Rebuilding recorded requests from the journal, byte for byte, and verifying them.

A request @N is a pure function of the journal through N: the context fold through the
request event (which carries its header snapshot) rendered for the header's transport.
Whatever is appended later, the rebuild gives the same bytes. ``RequestRecorded`` keeps
the hash of the bytes actually sent, so :func:`verify_requests` can prove it, and the
manifest of a request of an event-driven turn (``turns``), which the rebuild recomputes
from the turn records through the request (:func:`rebuild_manifest`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import Field, SerializerFunctionWrapHandler, ValidationError, model_serializer

from ..errors import RebuildError
from ..events import Event, StoredEvent
from ..wire import RenderedRequest, render_request
from .events import ContextAdded, LlmResponse
from .manifest import Manifest
from .projection import AgentContext
from .request import build_request
from .state import AgentContextState
from .turns import Turns, TurnState, fold_turns, turns_through

__all__ = [
    "RequestDrift",
    "RequestRecorded",
    "rebuild_manifest",
    "rebuild_request",
    "rebuild_state",
    "verify_requests",
]


class RequestRecorded(Event, type="contextfold.agent/request-recorded", runtime_only=True):
    """What was sent for request ``request_offset``: transport, size and SHA-256 of the body,
    and the manifest of the event-driven turn it belongs to (None outside one)."""

    request_offset: int = Field(ge=1)
    transport: str
    sha256: str
    size: int = Field(ge=0)
    manifest: Manifest | None = None

    @model_serializer(mode="wrap")
    def _canonical_absence(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # No manifest is no field: a request outside a turn is recorded as before.
        data: dict[str, Any] = handler(self)
        if data.get("manifest") is None:
            data.pop("manifest", None)
        return data


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


async def rebuild_manifest(journal: _Reader, stream: str, offset: int) -> Manifest | None:
    """The manifest of request @``offset``, recomputed from the turn records through it:
    the open turn's layers and its steers accepted before the request; None outside a turn.
    Pair it with :func:`rebuild_request`, which checks that @offset is a request."""
    return (await turns_through(journal, stream, offset)).manifest


@dataclass(frozen=True, slots=True)
class _Record:
    sha256: str
    manifest: str | None


def _drifts(
    state: AgentContextState,
    turns: TurnState,
    stream: str,
    offset: int,
    records: list[_Record],
) -> list[RequestDrift]:
    try:
        rebuilt: str | None = _render(state, stream, offset).sha256
        error = None
    except RebuildError as exc:
        rebuilt, error = None, str(exc)
    manifest = turns.manifest
    rebuilt_manifest = manifest.hash if manifest is not None else None
    problems = turns.problems_at(offset) if manifest is not None else ()
    drifts = []
    for record in records:
        if record.sha256 != rebuilt:
            drifts.append(RequestDrift(offset, record.sha256, rebuilt, error))
        elif record.manifest != rebuilt_manifest:
            drifts.append(
                RequestDrift(
                    offset,
                    record.sha256,
                    rebuilt,
                    f"request @{offset} of stream {stream!r} recorded manifest "
                    f"{record.manifest}; its turn records through it give {rebuilt_manifest}",
                )
            )
        elif problems:
            drifts.append(
                RequestDrift(
                    offset,
                    record.sha256,
                    rebuilt,
                    f"request @{offset} of stream {stream!r}: its turn's records do not "
                    f"hold: {'; '.join(problems)}",
                )
            )
    return drifts


def _matters(turns: TurnState, type_name: str) -> bool:
    """Whether the turn records can change on an event of this type: an item only where a
    record promised one, an answer only to an open turn (so a stream without turns decodes
    no extra event)."""
    if turns.awaiting is not None:
        return True
    if type_name == ContextAdded.event_type:
        return False
    return type_name != LlmResponse.event_type or turns.open


async def verify_requests(journal: _Reader, stream: str) -> tuple[RequestDrift, ...]:
    """Rebuild every recorded request of ``stream`` and report each record whose hash the
    rebuild does not give: different bytes, or an offset that is no request (an error);
    or whose manifest the turn records through the request do not give, or whose turn's
    envelope is not the item that followed its record.

    Every record counts (a retry records the same request again), in offset order.
    A request that was never recorded (interrupted before it was sent) is not checked.
    One pass: the records and the context events are each read once, the events folded
    in order, and each recorded request rendered from the state folded exactly through
    it; nothing is re-read per request (each still costs its own render).
    """
    recorded: dict[int, list[_Record]] = {}
    async for stored in journal.read_all(stream, types=(RequestRecorded.event_type,)):
        record = stored.decode(RequestRecorded)
        assert isinstance(record, RequestRecorded)
        records = recorded.setdefault(record.request_offset, [])
        seen = _Record(record.sha256, record.manifest.hash if record.manifest else None)
        if seen not in records:
            records.append(seen)
    pending = sorted(recorded)
    drifts: list[RequestDrift] = []
    state = AgentContext.initial_state()
    turns = Turns.initial_state()
    index = 0
    if pending:
        context_types = frozenset(AgentContext.event_types)
        turn_types = frozenset(Turns.event_types)
        events = journal.read_all(stream, types=sorted(context_types | turn_types))
        async with aclosing(events):  # type: ignore[type-var]
            async for stored in events:
                # The states now hold every event before this one.
                while index < len(pending) and pending[index] < stored.position:
                    offset = pending[index]
                    drifts.extend(_drifts(state, turns, stream, offset, recorded[offset]))
                    index += 1
                if index == len(pending):
                    break
                if stored.type in context_types:
                    state = _fold(state, stored)
                if stored.type in turn_types and _matters(turns, stored.type):
                    turns = fold_turns(turns, stored)
    for offset in pending[index:]:
        drifts.extend(_drifts(state, turns, stream, offset, recorded[offset]))
    return tuple(drifts)
