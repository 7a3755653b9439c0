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
take a :meth:`~TimelineBuilder.snapshot`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

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
from ..context.state import AgentContextState, ContextItem
from ..context.trust import wire_role
from ..context.turns import SteerAccepted, item_sha256
from ..errors import ContextfoldError
from ..events import Event, StoredEvent
from ..runtime.scheduling import AGENT, TOOL_WRITER, AgentHalted, behaviour_of
from ..runtime.tool_runs import NOT_RERUN
from ..telemetry import shared_prefix
from ..wire import RenderedRequest, Usage, render_request

__all__ = [
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

PREVIEW_CHARS = 2000
"""Most characters of an item, answer or tool output a timeline keeps (the full text is
in the journal, at the position the timeline names)."""

Verify = Literal["ok", "drift", "error", "unsent"]
"""A request's verify status: its rebuild gives the recorded bytes (``ok``), other bytes
(``drift``), no bytes (``error``), or it was never sent (``unsent``: no record)."""

ItemKind = Literal["trigger", "steer", "context", "compaction", "halt"]
"""What an item is to its turn: what started it (``trigger``), an event the dispatcher
steered into it (``steer``: its next request answers it), what landed meanwhile
(``context``), a compaction summary, or the loop halting itself (``halt``)."""

E = TypeVar("E", bound=Event)


def _preview(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def millis_between(start: str | None, end: str | None) -> float | None:
    """Milliseconds from one journal time (ISO 8601) to another; None when either is
    missing or unreadable."""
    if start is None or end is None:
        return None
    try:
        delta = datetime.fromisoformat(end) - datetime.fromisoformat(start)
    except ValueError:
        return None
    return delta.total_seconds() * 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolTrace:
    """One tool call of an answer: when it started and when its result was appended."""

    call_id: str
    name: str
    arguments: str
    started_at: str | None = None
    started_position: int | None = None
    finished_at: str | None = None
    result_position: int | None = None
    is_error: bool | None = None
    output: str | None = None
    """The result (cut at :data:`PREVIEW_CHARS`); None while there is none."""
    output_chars: int | None = None
    not_rerun: bool = False
    """Answered without running: it may already have run before the agent stopped."""

    @property
    def latency_ms(self) -> float | None:
        return millis_between(self.started_at, self.finished_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestTrace:
    """Request @offset: recorded, sent (perhaps again), answered or not."""

    offset: int
    requested_at: str
    reason: str | None = None
    model: str | None = None
    transport: str | None = None
    streamed: bool = False
    sent_at: str | None = None
    sends: int = 0
    """How many times it was recorded as sent (a retry after a crash sends it again)."""
    recorded_sha256: tuple[str, ...] = ()
    manifest: Mapping[str, Any] | None = None
    """A manifest recorded with the request, when its record carries one."""
    rebuilt_sha256: str | None = None
    rebuild_error: str | None = None
    size: int | None = None
    previous_offset: int | None = None
    prefix_bytes: int | None = None
    answered_at: str | None = None
    response_position: int | None = None
    response_model: str | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    text: str = ""
    text_chars: int = 0
    tool_calls: tuple[ToolTrace, ...] = ()
    interrupted: str | None = None

    @property
    def verify(self) -> Verify:
        if not self.recorded_sha256:
            return "unsent"
        if self.rebuilt_sha256 is None:
            return "error"
        return "ok" if set(self.recorded_sha256) == {self.rebuilt_sha256} else "drift"

    @property
    def prefix_share(self) -> float | None:
        """The share of the body that is an exact prefix of the previous request's body."""
        if self.prefix_bytes is None or not self.size:
            return None
        return self.prefix_bytes / self.size

    @property
    def latency_ms(self) -> float | None:
        """From sent to answered (journal times)."""
        return millis_between(self.sent_at or self.requested_at, self.answered_at)

    @property
    def end_time(self) -> str:
        times = [self.requested_at, self.sent_at, self.answered_at]
        times += [t.finished_at for t in self.tool_calls]
        return max(t for t in times if t is not None)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceItem:
    """A context item (or a halt) in a turn: what woke it, or what landed meanwhile."""

    kind: ItemKind
    position: int
    time: str
    role: str | None = None
    """The role the model received the item as (the trust rules decide it: a webhook's
    developer item is ``user``); until a request sends it, the role the latest request's
    rules would give it. None for a halt."""
    actor: str | None = None
    """The item's actor (``type`` or ``type:id``), else its journal writer."""
    text: str = ""
    chars: int = 0
    through: int | None = None
    """For a compaction summary: the request whose history it replaces."""
    usage: Usage | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnTrace:
    """One turn: its triggers and other items, and its requests, in journal order."""

    index: int
    items: tuple[TraceItem, ...]
    requests: tuple[RequestTrace, ...]

    @property
    def start_time(self) -> str:
        times = [i.time for i in self.items] + [r.requested_at for r in self.requests]
        return min(times)

    @property
    def end_time(self) -> str:
        times = [i.time for i in self.items] + [r.end_time for r in self.requests]
        return max(times)

    @property
    def duration_ms(self) -> float | None:
        return millis_between(self.start_time, self.end_time)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """A stream's turns through ``version``, and the agent context folded through it."""

    stream: str
    version: int
    turns: tuple[TurnTrace, ...]
    state: AgentContextState
    skipped: int = 0
    """Rows left out because they no longer decode (the folds leave them out too)."""

    @property
    def requests(self) -> tuple[RequestTrace, ...]:
        return tuple(r for turn in self.turns for r in turn.requests)


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
                output=_preview(result.content),
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
            text=_preview(item.content),
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
                "text": _preview(response.text),
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
        return Timeline(
            stream=self.stream,
            version=self.version,
            turns=tuple(turns),
            state=self._state,
            skipped=self.skipped,
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
