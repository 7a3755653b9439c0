"""What an agent is made of besides the journal: its settings, one record of what its loop
learned, and what the steps of one run share; and what a run reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .._aio import CancelWatch
from ..context.events import RequestHeader
from ..context.evidence import DEFAULT_CONTENT_LIMIT
from ..context.request import Built, build
from ..context.state import AgentContextState
from ..journal import Journal
from ..render.prefix import PrefixInstance
from ..store.base import AppendResult
from ..wire import NeutralRequest, RenderedRequest, render_request
from .clients import ModelClient
from .events import AgentObserver, LoopEvent
from .scheduling import TurnBudgets
from .spans import LoopSpans
from .tool_runs import InterruptedToolPolicy
from .tools import Toolbox

__all__ = [
    "MATERIALIZE_EVERY",
    "AgentSettings",
    "AgentState",
    "Outgoing",
    "Run",
    "RunReport",
    "Status",
]

Status = Literal["idle", "queued", "busy", "stopped"]

MATERIALIZE_EVERY = 1000
"""Stream positions between two materializations of a running agent."""


@dataclass(slots=True)
class RunReport:
    """What one ``run_until_idle`` did."""

    requests: list[int] = field(default_factory=list)
    interrupted: list[int] = field(default_factory=list)
    tool_calls: int = 0
    not_rerun: list[str] = field(default_factory=list)
    """Ids of calls that may already have run and were answered with an error, not run."""
    compactions: list[int] = field(default_factory=list)
    steps: int = 0
    """Steps taken (a request sent or re-sent, the tool calls run, a compaction, a halt):
    0 when there was nothing to do."""
    status: Status = "idle"
    reason: str = ""


@dataclass(slots=True, kw_only=True)
class AgentSettings:
    """How an agent requests, runs tools and compacts (``cf.Agent``'s arguments, checked).

    Read by every step, so a change takes effect at the next step; what a request is made
    of is logged in its header, so a rebuild never reads these."""

    model: ModelClient
    toolbox: Toolbox
    prefix: PrefixInstance
    max_tokens: int = 1024
    temperature: float | None = None
    stream_responses: bool = False
    budgets: TurnBudgets = field(default_factory=TurnBudgets)
    compaction_threshold: float = 0.5
    context_window: int | None = None
    """The model's input limit in tokens; None until looked up (see ``cf.Agent``)."""
    on_interrupted_tool: InterruptedToolPolicy = "report"
    content_limit: int = DEFAULT_CONTENT_LIMIT
    """Characters of one tool output or item the model sees."""
    materialize_every: int = MATERIALIZE_EVERY
    """Stream positions between two materializations."""


@dataclass(slots=True)
class AgentState:
    """What a live agent knows beyond the journal: all of it derived from what its own
    appends returned and what it looked up, so a new instance starts empty and loses only
    time (the journal is the agent's state)."""

    status: Status = "idle"
    version_seen: int = 0
    """The newest stream version the agent's own appends returned: the stream had it at
    least (a request appended with its record names the version it expects)."""
    materialized_at: int | None = None
    """Stream position of the newest materialization, once looked up."""
    not_compactable: set[int] = field(default_factory=set)
    """Requests recorded for another transport: never summarized by this agent."""
    window_known: bool = False
    """Whether the context window was given or looked up already."""
    birth_reported: bool = False
    """Whether the wait for the system prompt was logged (it is, once)."""
    built: Built | None = None
    """The newest request built, passed to the next build (``context.request.build``)."""
    rendered: RenderedRequest | None = None
    """The newest body rendered, passed to the next render (``wire.render_request``)."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A request built from a context and its body rendered for the header's transport."""

    request: NeutralRequest
    rendered: RenderedRequest


@dataclass(slots=True)
class Run:
    """What the steps of one ``run_until_idle`` share: where they read and append, the
    agent's settings and state, whom they tell, and the run's report."""

    journal: Journal
    stream: str
    settings: AgentSettings
    state: AgentState
    report: RunReport
    observer: AgentObserver | None = None
    spans: LoopSpans | None = None
    cancel: CancelWatch = field(default_factory=CancelWatch)
    """Renewed by each run: a cancel a driver swallowed still stops it."""

    async def emit(self, event: LoopEvent) -> None:
        """Tell the spans and the observer, in that order."""
        if self.spans is not None:
            self.spans.on_event(event)
        if self.observer is not None:
            await self.observer.on_event(event)

    def saw(self, appended: AppendResult) -> AppendResult:
        """Note the version ``appended`` left the stream at; returns it."""
        state = self.state
        if not appended.deduplicated and appended.last_position > state.version_seen:
            state.version_seen = appended.last_position
        return appended

    def build(
        self,
        context: AgentContextState,
        header: RequestHeader | None = None,
        *,
        through: int | None = None,
        timestamp: str | None = None,
    ) -> Outgoing:
        """The request from ``context`` (``build_request``'s arguments) and its body for the
        header's transport, each made from the agent's previous ones where they hold the
        same (a request costs what it adds); those are replaced by these."""
        state = self.state
        header = header if header is not None else context.header
        state.built = build(
            context, header, through=through, timestamp=timestamp, previous=state.built
        )
        assert header is not None  # else build raised
        request = state.built.request
        state.rendered = render_request(request, header.transport, previous=state.rendered)
        return Outgoing(request, state.rendered)

    def busy(self) -> None:
        self.state.status = "busy"
