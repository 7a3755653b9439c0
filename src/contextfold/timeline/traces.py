"""The values a stream's timeline is made of: its turns, each with its items and its
requests, each request with its answer and tool calls, whoever recorded them (a
contextfold agent, or a framework's integration through its call records).

Pure frozen records: :mod:`.build` and :mod:`.calls` make them, :mod:`.stats` and
:mod:`.encode` read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ..context.state import AgentContextState
from ..wire import Usage

__all__ = [
    "PREVIEW_CHARS",
    "FrameworkContext",
    "ItemKind",
    "LaneTokens",
    "RequestTrace",
    "Timeline",
    "ToolTrace",
    "TraceItem",
    "TurnTrace",
    "Verify",
    "millis_between",
    "preview",
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


def preview(text: str) -> str:
    """``text`` cut at :data:`PREVIEW_CHARS` (an ellipsis marks the cut)."""
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
    framework: str | None = None
    """The framework that recorded it (a call record), None for a contextfold agent's."""
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
    summarized: int | None = None
    """For a framework's compaction: how many messages of its history it replaces."""
    usage: Usage | None = None
    model: str | None = None
    """For a compaction summary: the model that wrote it, when recorded."""


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


@dataclass(frozen=True, slots=True)
class LaneTokens:
    """One lane of the context as the latest request sees it: items and approximate tokens
    (JSON length / 4, the default counter)."""

    lane: str
    items: int
    tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkContext:
    """What a framework's newest recorded request held: its model and lanes (what the
    agent context's header and lanes are to a contextfold agent's stream)."""

    frameworks: tuple[str, ...]
    model: str
    lanes: tuple[LaneTokens, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """A stream's turns through ``version``, and the agent context folded through it (with
    ``framework``, what a framework's newest request held, when the stream has call
    records)."""

    stream: str
    version: int
    turns: tuple[TurnTrace, ...]
    state: AgentContextState
    skipped: int = 0
    """Rows left out because they no longer decode (the folds leave them out too)."""
    framework: FrameworkContext | None = None

    @property
    def requests(self) -> tuple[RequestTrace, ...]:
        return tuple(r for turn in self.turns for r in turn.requests)
