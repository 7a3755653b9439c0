"""A stream's timeline: its turns as nested spans, derived from the journal alone.

A turn starts with what woke the agent (the trigger items: a user's question, a webhook,
a turn the dispatcher compiled, any item that wakes the model by its request policy, as
the scheduler counts them, whoever wrote it) and holds every request the agent made until
the next trigger: each request @N with its streamed answer, its tool calls and their
results, and what else landed meanwhile (items that wake nothing, steers the dispatcher
accepted into the open turn, compaction summaries, halts; an item landing while the agent
is idle belongs to the next turn). Each item shows the role the model received it as: the
trust rules of the first request after it (an untrusted webhook's developer item is sent
as ``user``).
Latencies are journal times: a request is sent when its ``RequestRecorded`` is appended
and answered when its ``LlmResponse`` is.

The builder folds the agent context as it goes and renders each request from the state
folded exactly through it, so it also knows each body: its SHA-256 against the recorded
one (the verify status), and how many of its bytes are an exact prefix of the previous
request's body (what a provider's prompt cache can reuse). It keeps one body in memory.
It reads events incrementally: :meth:`TimelineBuilder.add` each new event, in order, then
take a :meth:`~TimelineBuilder.snapshot`. A framework's call records on the stream make
turns of their own (:mod:`.calls`), placed among the agent's in stream order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from ..context.events import (
    ContextAdded,
    LlmRequestInterrupted,
    LlmRequestRequested,
    LlmResponse,
    ToolCallResult,
    ToolCallStarted,
)
from ..context.projection import AgentContext
from ..context.rebuild import RequestRecorded
from ..context.request import Built, build
from ..context.state import ContextItem
from ..context.trust import wire_role
from ..context.turns import SteerAccepted, item_sha256
from ..errors import ContextfoldError
from ..events import Event, StoredEvent
from ..runtime.scheduling import AGENT, TOOL_WRITER, AgentHalted, behaviour_of
from ..runtime.tool_runs import NOT_RERUN
from ..telemetry import shared_prefix
from ..wire import RenderedRequest, render_request
from .calls import RECORD_TYPES, CallTimeline, first_position
from .traces import (
    PREVIEW_CHARS,
    ItemKind,
    RequestTrace,
    Timeline,
    ToolTrace,
    TraceItem,
    TurnTrace,
    Verify,
    millis_between,
    preview,
)

__all__ = [  # the records, defined in .traces, are named here too, as they always were
    "PREVIEW_CHARS",
    "ItemKind",
    "RequestTrace",
    "Timeline",
    "TimelineBuilder",
    "ToolTrace",
    "TraceItem",
    "TurnTrace",
    "Verify",
    "build_timeline",
    "millis_between",
]

E = TypeVar("E", bound=Event)


@dataclass(slots=True)
class _Turn:
    items: list[TraceItem] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)


class TimelineBuilder:
    """Builds a :class:`Timeline` from a stream's events, added in order (see the module
    docstring). Holds the agent context state, the previous request's build and body (the
    next request reuses them, so it costs what it adds) and the small records of each
    request; never raises on an event that does not decode."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.version = 0
        self.cursor: str | None = None
        self.skipped = 0
        self._state = AgentContext.initial_state()
        self._previous: tuple[int, Built, RenderedRequest] | None = None
        self._requests: dict[int, RequestTrace] = {}
        self._calls: dict[str, tuple[int, int]] = {}  # call id -> (request, index)
        self._turns: list[_Turn] = []
        self._pending: list[TraceItem] = []
        # Items no request has sent yet, where they are listed: the next request's header
        # decides the role the model receives each as.
        self._unsent: list[tuple[list[TraceItem], int, ContextItem]] = []
        self._steer: tuple[int, str] | None = None  # the item a SteerAccepted promised
        self._framework = CallTimeline()  # a framework's call records on the same stream

    def add(self, stored: StoredEvent) -> None:
        """Fold one event (the next of the stream)."""
        self.version, self.cursor = stored.position, stored.cursor
        try:
            envelope = AgentContext.decode(stored)
        except (ValueError, ValidationError, ContextfoldError):
            self.skipped += 1
            return
        if envelope is not None:
            self._state = AgentContext.apply(self._state, envelope)
        try:
            self._record(stored)
        except (ValueError, ValidationError, ContextfoldError):
            self.skipped += 1

    def _record(self, stored: StoredEvent) -> None:
        kind = stored.type
        if kind == ContextAdded.event_type:
            self._item(stored, _decode(stored, ContextAdded))
        elif kind == LlmRequestRequested.event_type:
            self._request(stored, _decode(stored, LlmRequestRequested))
        elif kind == RequestRecorded.event_type:
            recorded = _decode(stored, RequestRecorded)
            manifest = stored.payload.get("manifest")
            self._update(
                recorded.request_offset,
                lambda r: {
                    "sent_at": r.sent_at or stored.meta.time,
                    "sends": r.sends + 1,
                    "recorded_sha256": (*r.recorded_sha256, recorded.sha256),
                    "manifest": manifest if isinstance(manifest, dict) else r.manifest,
                },
            )
        elif kind == LlmResponse.event_type:
            self._response(stored, _decode(stored, LlmResponse))
        elif kind == ToolCallStarted.event_type:
            started = _decode(stored, ToolCallStarted)
            self._tool(started.tool_call_id, started_at=stored.meta.time, started=stored.position)
        elif kind == ToolCallResult.event_type:
            result = _decode(stored, ToolCallResult)
            self._tool(
                result.tool_call_id,
                finished_at=stored.meta.time,
                result_position=stored.position,
                is_error=result.is_error,
                output=preview(result.content),
                output_chars=len(result.content),
                not_rerun=result.is_error and result.content == NOT_RERUN,
            )
        elif kind == SteerAccepted.event_type and stored.meta.actor == AGENT:
            # Only the runtime's record counts (as for the turn fold); its item is next.
            steer = _decode(stored, SteerAccepted)
            self._steer = (stored.position + 1, steer.item_sha256)
        elif kind == LlmRequestInterrupted.event_type:
            stopped = _decode(stored, LlmRequestInterrupted)
            reason = stopped.reason or "interrupted"
            self._update(stopped.request_offset, lambda r: {"interrupted": reason})
        elif kind == AgentHalted.event_type:
            halted = _decode(stored, AgentHalted)
            item = TraceItem(
                kind="halt",
                position=stored.position,
                time=stored.meta.time,
                actor=stored.meta.actor,
                text=f"{halted.reason}: {halted.detail}" if halted.detail else halted.reason,
            )
            self._note(item)
        elif kind in RECORD_TYPES:
            self._framework.add(stored.position, stored.meta.time, stored.decode())

    def _item(self, stored: StoredEvent, item: ContextAdded) -> None:
        writer = stored.meta.actor
        steer, self._steer = self._steer, None
        if item.compaction is None and (
            writer == TOOL_WRITER or (writer == AGENT and item.role == "assistant")
        ):
            return  # the agent's answers and tool results: part of their request already
        actor = writer
        if item.actor is not None:
            actor = item.actor.type + (f":{item.actor.id}" if item.actor.id else "")
        kind: ItemKind = "context"
        if item.compaction is not None:
            kind = "compaction"
        elif (
            writer == AGENT
            and steer is not None
            and steer == (stored.position, item_sha256(item.content))
        ):
            kind = "steer"
        elif behaviour_of(item) != "none":
            # The scheduler's rule, whoever wrote it: the dispatcher appends a turn's
            # envelope as the runtime, and that turn is a turn like any other.
            kind = "trigger"
        sent = ContextItem(
            offset=stored.position,
            role=item.role,
            actor=item.actor,
            tool_call_id=item.tool_call_id,
            compaction=item.compaction,
        )
        header = self._state.header
        trace = TraceItem(
            kind=kind,
            position=stored.position,
            time=stored.meta.time,
            role=wire_role(
                sent,
                header.has_developer_role if header is not None else True,
                header.trusted_actor_types if header is not None else (),
            ),
            actor=actor,
            text=preview(item.content),
            chars=len(item.content),
            through=item.compaction.replaces_history_through if item.compaction else None,
            usage=item.compaction.usage if item.compaction else None,
        )
        waiting = any(i.kind == "trigger" for i in self._pending)
        if self._turns and (
            kind == "compaction"
            or (kind == "steer" and not waiting)
            or (kind == "context" and self._busy())
        ):
            listed = self._turns[-1].items
        else:  # a trigger, or what arrived before its turn's first request
            listed = self._pending
        listed.append(trace)
        self._unsent.append((listed, len(listed) - 1, sent))

    def _busy(self) -> bool:
        """Whether the current turn's latest request still waits for its answer or for
        the results of its tool calls."""
        latest = self._requests[self._turns[-1].offsets[-1]]
        if latest.interrupted is not None:
            return False
        if latest.answered_at is None:
            return True
        return any(call.finished_at is None for call in latest.tool_calls)

    def _note(self, item: TraceItem) -> None:
        (self._turns[-1].items if self._turns else self._pending).append(item)

    def _request(self, stored: StoredEvent, event: LlmRequestRequested) -> None:
        offset = stored.position
        state = self._state
        header = state.header if state.request_offset == offset else None
        if header is not None:  # this request sent them: its rules gave them their roles
            developer, trusted = header.has_developer_role, header.trusted_actor_types
            for listed, index, sent in self._unsent:
                role = wire_role(sent, developer, trusted)
                listed[index] = replace(listed[index], role=role)
        self._unsent.clear()
        if any(i.kind == "trigger" for i in self._pending) or not self._turns:
            self._turns.append(_Turn())
        turn = self._turns[-1]
        turn.items.extend(self._pending)
        self._pending.clear()
        turn.offsets.append(offset)
        trace = RequestTrace(
            offset=offset,
            requested_at=stored.meta.time,
            reason=event.reason,
            model=header.model if header else None,
            transport=header.transport if header else None,
            streamed=header.stream if header else False,
        )
        if header is None:
            trace = replace(trace, rebuild_error=f"request @{offset} has no header snapshot")
        else:
            previous = self._previous
            try:
                built = build(state, previous=previous[1] if previous else None)
                rendered = render_request(
                    built.request, header.transport, previous=previous[2] if previous else None
                )
            except Exception as exc:  # what rebuild_request reports as a RebuildError
                trace = replace(trace, rebuild_error=f"cannot be rebuilt: {exc}")
            else:
                body = rendered.body
                trace = replace(
                    trace,
                    rebuilt_sha256=rendered.sha256,
                    size=len(body),
                    previous_offset=previous[0] if previous else None,
                    prefix_bytes=shared_prefix(previous[2].body, body) if previous else None,
                )
                self._previous = (offset, built, rendered)
        self._requests[offset] = trace

    def _response(self, stored: StoredEvent, response: LlmResponse) -> None:
        offset = response.request_offset
        if offset not in self._requests or stored.meta.actor != AGENT:
            return  # another writer's answer answers nothing (the scheduler agrees)
        calls = tuple(
            ToolTrace(call_id=c.id, name=c.name, arguments=c.arguments) for c in response.tool_calls
        )
        for index, call in enumerate(calls):
            self._calls[call.call_id] = (offset, index)
        self._update(
            offset,
            lambda r: {
                "answered_at": stored.meta.time,
                "response_position": stored.position,
                "response_model": response.model,
                "usage": response.usage,
                "finish_reason": response.stop_reason,
                "text": preview(response.text),
                "text_chars": len(response.text),
                "tool_calls": calls,
            },
        )

    def _tool(self, call_id: str, **changes: Any) -> None:
        where = self._calls.get(call_id)
        if where is None:
            return
        offset, index = where
        request = self._requests[offset]
        calls = list(request.tool_calls)
        if "started" in changes:
            changes["started_position"] = changes.pop("started")
        calls[index] = replace(calls[index], **changes)
        self._requests[offset] = replace(request, tool_calls=tuple(calls))

    def _update(self, offset: int, changes: Callable[[RequestTrace], dict[str, Any]]) -> None:
        request = self._requests.get(offset)
        if request is not None:
            self._requests[offset] = replace(request, **changes(request))

    def snapshot(self) -> Timeline:
        """The timeline of every event added so far (frozen; the builder goes on)."""
        turns = [
            TurnTrace(
                index=n,
                items=tuple(turn.items),
                requests=tuple(self._requests[o] for o in turn.offsets),
            )
            for n, turn in enumerate(self._turns)
        ]
        if self._pending:  # triggers not answered yet: a turn waiting for its request
            turns.append(TurnTrace(index=len(turns), items=tuple(self._pending), requests=()))
        framework = self._framework.turns()
        if framework:  # a framework's turns, in stream order with any of an agent's
            merged = sorted([*turns, *framework], key=first_position)
            turns = [replace(turn, index=n) for n, turn in enumerate(merged)]
        return Timeline(
            stream=self.stream,
            version=self.version,
            turns=tuple(turns),
            state=self._state,
            skipped=self.skipped,
            framework=self._framework.context(),
        )


def _decode(stored: StoredEvent, cls: type[E]) -> E:
    event = stored.decode(cls)
    assert isinstance(event, cls)
    return event


class _Reader(Protocol):
    def read_all(
        self, stream: str, *, after: str | None = None, page_size: int = 1000
    ) -> AsyncIterator[StoredEvent]: ...


async def build_timeline(journal: _Reader, stream: str) -> Timeline:
    """The timeline of ``stream``, read from its start (one pass)."""
    builder = TimelineBuilder(stream)
    events = journal.read_all(stream)
    async with aclosing(events):  # type: ignore[type-var]
        async for stored in events:
            builder.add(stored)
    return builder.snapshot()
