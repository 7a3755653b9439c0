"""What an agent instance holds in memory besides the journal: its settings, its status
and its observer; and what one run of its loop reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .._aio import CancelWatch
from ..journal import Journal
from ..render.prefix import PrefixInstance
from .clients import ModelClient
from .events import AgentObserver, LoopEvent
from .spans import LoopSpans
from .tools import Toolbox

__all__ = ["AgentInstance", "RunReport", "Status"]

Status = Literal["idle", "queued", "busy", "stopped"]


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


class AgentInstance:
    """The state the loop's steps share (the base of :class:`~contextfold.runtime.loop.Agent`,
    which sets it): the steps of one turn and of compaction read it, and tell the observer."""

    journal: Journal
    stream: str
    model: ModelClient
    toolbox: Toolbox
    prefix: PrefixInstance
    max_tokens: int
    temperature: float | None
    stream_responses: bool
    compaction_threshold: float
    context_window: int | None  # the model's input limit; None: its known window
    content_limit: int  # characters of one tool output or item the model sees
    observer: AgentObserver | None
    status: Status
    _not_compactable: set[int]  # requests recorded for another transport
    _cancel: CancelWatch  # renewed by each run
    _spans: LoopSpans | None = None  # OpenTelemetry spans of the loop (no-ops without an SDK)

    async def _emit(self, event: LoopEvent) -> None:
        if self._spans is not None:
            self._spans.on_event(event)
        if self.observer is not None:
            await self.observer.on_event(event)

    def _set_status(self, status: Status) -> None:
        self.status = status
