"""What the agent loop tells its observers (printing, a transcript, metrics).

Each loop event is a frozen keyword-only dataclass with a ``Literal`` ``kind``;
:data:`LoopEvent` is their union. An observer matches on the classes, so a type checker
reports every observer a renamed or removed event would silently skip. Loop events are
notifications in this process, not journal events: the journal already records what the
loop did, and an observer's failure never changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from ..wire import ModelOutput, NeutralRequest, RenderedRequest, ToolCall, Usage
from .tools import ToolOutcome

__all__ = [
    "LOOP_EVENT_TYPES",
    "AgentObserver",
    "CompactionFinished",
    "CompactionStarted",
    "DeltaReceived",
    "LoopCancelled",
    "LoopEvent",
    "LoopHalted",
    "Observers",
    "RequestFailed",
    "RequestInterrupted",
    "RequestRetried",
    "RequestSent",
    "ResponseRecorded",
    "ToolFinished",
    "ToolStarted",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestSent:
    """Request @offset was recorded and goes to the model now (a first send or a retry)."""

    kind: Literal["request-sent"] = "request-sent"
    offset: int
    """The request's position in the stream."""
    rendered: RenderedRequest
    """The exact bytes sent."""
    neutral: NeutralRequest
    """The provider-neutral request the bytes were rendered from."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestRetried:
    """Request @offset was unanswered (a crash, a takeover) and is re-sent byte for byte."""

    kind: Literal["request-retried"] = "request-retried"
    offset: int


@dataclass(frozen=True, kw_only=True, slots=True)
class DeltaReceived:
    """A streamed fragment of the answer to request @offset (never stored as a row)."""

    kind: Literal["delta-received"] = "delta-received"
    offset: int
    channel: str
    """Which part of the output it extends: ``"text"`` or ``"reasoning"``."""
    text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ResponseRecorded:
    """The answer to request @offset was appended to the journal."""

    kind: Literal["response-recorded"] = "response-recorded"
    offset: int
    output: ModelOutput
    """The output as recorded: tool call ids made unique, unrunnable calls dropped."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestFailed:
    """Request @offset failed (the provider or the journal raised): its rows close."""

    kind: Literal["request-failed"] = "request-failed"
    offset: int
    error: Exception


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestInterrupted:
    """Request @offset ended without an answer: an interrupt item arrived, the agent was
    cancelled, or it was sealed unsent (it could not be re-sent through this model)."""

    kind: Literal["request-interrupted"] = "request-interrupted"
    offset: int
    by: int | None = None
    """The position of the interrupt item, or None when none caused it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolStarted:
    """A tool call's function is about to run."""

    kind: Literal["tool-started"] = "tool-started"
    call: ToolCall


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolFinished:
    """A tool call's result was appended (an error result included)."""

    kind: Literal["tool-finished"] = "tool-finished"
    call: ToolCall
    outcome: ToolOutcome


@dataclass(frozen=True, kw_only=True, slots=True)
class CompactionStarted:
    """The history through request @offset is being summarized."""

    kind: Literal["compaction-started"] = "compaction-started"
    offset: int
    rendered: RenderedRequest | None = None
    """The summary request's exact bytes (None: no model call writes this summary, as for
    a trim note)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CompactionFinished:
    """The summary replacing the history through request @offset was appended."""

    kind: Literal["compaction-finished"] = "compaction-finished"
    offset: int
    summary: str
    usage: Usage | None = None
    """What the summary request used, as its provider reported it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LoopHalted:
    """The loop halted itself (a turn budget or the circuit breaker) and recorded why."""

    kind: Literal["loop-halted"] = "loop-halted"
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class LoopCancelled:
    """The agent's task was cancelled (a shutdown): observers close what they hold open."""

    kind: Literal["loop-cancelled"] = "loop-cancelled"


LoopEvent = (
    RequestSent
    | RequestRetried
    | DeltaReceived
    | ResponseRecorded
    | RequestFailed
    | RequestInterrupted
    | ToolStarted
    | ToolFinished
    | CompactionStarted
    | CompactionFinished
    | LoopHalted
    | LoopCancelled
)
"""Everything the loop tells observers; match on the classes (``case _: assert_never(e)``)."""

LOOP_EVENT_TYPES: tuple[type[LoopEvent], ...] = get_args(LoopEvent)
"""The members of :data:`LoopEvent`, in the union's order."""


class AgentObserver(Protocol):
    """Told of each :data:`LoopEvent` in order, awaited before the loop goes on."""

    async def on_event(self, event: LoopEvent) -> None: ...


class Observers:
    """Several observers as one, called in order."""

    def __init__(self, *observers: AgentObserver) -> None:
        self.observers = observers

    async def on_event(self, event: LoopEvent) -> None:
        for observer in self.observers:
            await observer.on_event(event)
