"""The agent loop: wait for triggers, read the context, record and send the request, append
the output, run tool calls, compact when usage crosses the threshold, and go on.

Every decision is derived from the journal (the context and scheduler folds), so the loop
can stop at any point and a new instance picks up where it left off: an unanswered
request is re-sent byte for byte, unanswered tool calls are run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..context.compaction import build_summary_request, needs_compaction, summary_item
from ..context.events import (
    Actor,
    ContextAdded,
    LlmRequestInterrupted,
    LlmRequestRequested,
    LlmResponse,
    ModelToolCall,
    RequestHeader,
    TokenUsage,
    ToolCallResult,
    ToolDefinition,
    tool_result_item,
)
from ..context.projection import AgentContext
from ..context.rebuild import RequestRecorded, rebuild_state
from ..context.request import build_request, prefix_snapshot
from ..context.state import SYSTEM_PROMPT_KEY, AgentContextState
from ..events import Event
from ..journal import Journal
from ..render.neutral import (
    NeutralMessage,
    NeutralRequest,
    RenderedRequest,
    ToolCall,
    render_request,
)
from ..render.prefix import PrefixInstance, SessionPrefix
from .models import ModelClient, ModelOutput
from .scheduling import AgentHalted, Decision, Scheduler, TurnBudgets, behaviour_of, decide
from .tools import Toolbox, ToolOutcome

__all__ = ["Agent", "AgentObserver", "Observers", "RunReport", "Status", "system_prompt"]

log = logging.getLogger("contextfold.runtime")
Status = Literal["idle", "queued", "busy", "stopped"]


def system_prompt(text: str) -> ContextAdded:
    """The agent's base prompt: the ``agent/system-prompt`` system item birth waits for."""
    return ContextAdded(role="system", content=text, key=SYSTEM_PROMPT_KEY)


class AgentObserver(Protocol):
    """Hooks for what the loop does (printing, a transcript, metrics). All optional."""

    async def on_event(self, name: str, **data: Any) -> None: ...


class Observers:
    """Several observers as one, called in order."""

    def __init__(self, *observers: AgentObserver) -> None:
        self.observers = observers

    async def on_event(self, name: str, **data: Any) -> None:
        for observer in self.observers:
            await observer.on_event(name, **data)


@dataclass(slots=True)
class RunReport:
    """What one ``run_until_idle`` did."""

    requests: list[int] = field(default_factory=list)
    interrupted: list[int] = field(default_factory=list)
    tool_calls: int = 0
    compactions: list[int] = field(default_factory=list)
    status: Status = "idle"
    reason: str = ""


class Agent:
    """An agent on one journal stream.

    ``model`` completes requests (its ``transport`` picks the wire format); ``tools`` are
    callables or :class:`Tool` objects; ``prefix`` contributes the session prefix, composed
    once per Agent instance (a loop instance). Nothing else is kept in memory: the journal
    is the agent's state.
    """

    def __init__(
        self,
        journal: Journal,
        stream: str,
        model: ModelClient,
        *,
        tools: Sequence[Any] = (),
        prefix: SessionPrefix | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
        stream_responses: bool = False,
        budgets: TurnBudgets | None = None,
        compaction_threshold: float = 0.5,
        observer: AgentObserver | None = None,
        actor: Actor | None = None,
    ) -> None:
        self.journal = journal
        self.stream = stream
        self.model = model
        self.toolbox = tools if isinstance(tools, Toolbox) else Toolbox(tools)
        self._prefix_source = prefix or SessionPrefix()
        self.prefix: PrefixInstance = self._prefix_source.instance()
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.stream_responses = stream_responses
        self.budgets = budgets or TurnBudgets()
        self.compaction_threshold = compaction_threshold
        self.observer = observer
        self.actor = actor or Actor(type="agent")
        self.status: Status = "idle"
        self._header_logged: RequestHeader | None = None

    # -- observation --------------------------------------------------------------------------

    async def _emit(self, name: str, **data: Any) -> None:
        if self.observer is not None:
            await self.observer.on_event(name, **data)

    def _set_status(self, status: Status) -> None:
        self.status = status

    # -- the loop -----------------------------------------------------------------------------

    async def run_until_idle(self, *, max_steps: int = 1000) -> RunReport:
        """Run until nothing wakes the model (idle), birth is pending (queued) or the loop
        halted itself (stopped). Raises ModelError when the provider fails."""
        report = RunReport()
        for _ in range(max_steps):
            context = await self.journal.fold(AgentContext, self.stream)
            sched = await self.journal.fold(Scheduler, self.stream)
            decision = decide(sched, context, self.budgets)
            if decision.action == "idle":
                report.status, report.reason = (
                    ("stopped" if sched.halted else "idle"),
                    decision.reason,
                )
                break
            if decision.action == "queued":
                report.status, report.reason = "queued", decision.reason
                break
            self._set_status("busy")
            if decision.action == "halt":
                await self.journal.append(
                    self.stream,
                    AgentHalted(
                        reason="circuit-breaker" if "breaker" in decision.reason else "turn-budget",
                        detail=decision.reason,
                    ),
                    actor="agent",
                )
                await self._emit("halted", reason=decision.reason)
                report.status, report.reason = "stopped", decision.reason
                break
            if decision.action == "run-tools":
                report.tool_calls += await self._run_tools(sched.outstanding)
            elif decision.action == "retry":
                assert sched.last_request is not None
                await self._retry(sched.last_request, report)
            else:
                await self._request(context, decision, report)
        self._set_status(report.status)
        return report

    async def serve(self, *, poll_interval: float = 0.05) -> None:
        """Run forever: run until idle, then sleep until anything is appended to the stream.

        The head is taken before each run, so an item appended while the run ends still
        wakes the next one (the agent's own appends wake it once, harmlessly).
        """
        while True:
            cursor = await self.journal.head(self.stream)
            await self.run_until_idle()
            async for _ in self.journal.subscribe(
                self.stream, after=cursor, poll_interval=poll_interval
            ):
                break

    # -- one request --------------------------------------------------------------------------

    async def _session_prefix(self) -> tuple[NeutralMessage, ...]:
        """The instance's composed prefix. A cancel landing inside the composition discards
        it, even when a contributor swallowed the cancel and returned a degraded fallback:
        that value must reach neither this request nor a later one."""
        composed = self.prefix.composed
        if composed is not None:
            return composed
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        composed = await self.prefix.get()
        if task is not None and task.cancelling() > cancels:
            self.prefix = self._prefix_source.instance()  # the next turn composes again
            raise asyncio.CancelledError
        return composed

    async def _header(self, context: AgentContextState) -> RequestHeader:
        prefix = await self._session_prefix()
        return RequestHeader(
            transport=self.model.transport,
            model=self.model.model,
            session_prefix=prefix_snapshot(prefix),
            tools=tuple(
                ToolDefinition(
                    name=s.name,
                    description=s.description,
                    parameters=s.parameters_json.decode(),
                    strict=s.strict,
                )
                for s in self.toolbox.specs
            ),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            stream=self.stream_responses,
        )

    async def _request(
        self, context: AgentContextState, decision: Decision, report: RunReport
    ) -> None:
        header = await self._header(context)
        previous = context.request_offset
        if previous is not None and previous > context.compacted_through:
            # The pressure gate: estimate the request about to go out, session prefix
            # included (a new instance's prefix may have grown), before sending it.
            estimate = (
                len(render_request(build_request(context, header), header.transport).body) // 4
            )
            if needs_compaction(estimate, header.model, threshold=self.compaction_threshold):
                await self._compact(previous, report)
                context = await self.journal.fold(AgentContext, self.stream)
        # An unchanged header is logged once: later requests carry None and reuse it.
        logged = None if context.header == header else header
        appended = await self.journal.append(
            self.stream, LlmRequestRequested(header=logged, reason=decision.reason), actor="agent"
        )
        offset = appended.first_position
        await self._send(offset, report)

    async def _retry(self, offset: int, report: RunReport) -> None:
        context = await self.journal.fold(AgentContext, self.stream)
        header = context.header if context.request_offset == offset else None
        reason = ""
        if header is None:
            reason = f"request @{offset} has no header snapshot and cannot be rendered"
        elif header.transport != self.model.transport:
            reason = (
                f"request @{offset} was recorded for the {header.transport} transport; "
                f"this agent's model speaks {self.model.transport}"
            )
        if reason:
            # It cannot be re-sent byte for byte through this model (appended by hand without
            # a header, or the agent's model changed since): seal it and request anew, with
            # this instance's header logged, so its triggers are still answered.
            sealed = LlmRequestInterrupted(request_offset=offset, reason=reason)
            await self.journal.append(self.stream, sealed, actor="agent")
            report.interrupted.append(offset)
            await self._emit("interrupted", offset=offset, by=None)
            await self._request(context, Decision("request", reason), report)
            return
        await self._emit("retry", offset=offset)
        await self._send(offset, report)

    async def _send(self, offset: int, report: RunReport) -> None:
        context = await self.journal.fold(AgentContext, self.stream)
        if context.request_offset == offset and context.header is not None:
            # The cached fold through the request: the per-turn cost stays flat.
            neutral = build_request(context, through=offset)
            transport = context.header.transport
        else:  # a retry after later requests or a compaction: fold the journal through it
            state = await rebuild_state(self.journal, self.stream, offset)
            assert state.header is not None
            neutral, transport = build_request(state), state.header.transport
        rendered = render_request(neutral, transport)
        await self.journal.append(
            self.stream,
            RequestRecorded(
                request_offset=offset,
                transport=rendered.transport,
                sha256=rendered.sha256,
                size=len(rendered.body),
            ),
            actor="agent",
            channels=(),
        )
        report.requests.append(offset)
        await self._emit("request", offset=offset, rendered=rendered, neutral=neutral)
        output = await self._complete_interruptible(offset, neutral, rendered)
        if output is None:
            report.interrupted.append(offset)
            return
        await self._record_output(offset, output)
        if output.usage.input_tokens and needs_compaction(
            output.usage.input_tokens, self.model.model, threshold=self.compaction_threshold
        ):
            await self._compact(offset, report)

    async def _complete_interruptible(
        self, offset: int, neutral: NeutralRequest, rendered: RenderedRequest
    ) -> ModelOutput | None:
        """The model's output, or None when an ``interrupt`` item arrived meanwhile (the
        request is then recorded as interrupted)."""

        async def on_delta(kind: str, text: str) -> None:
            await self._emit("delta", offset=offset, kind=kind, text=text)

        call = asyncio.create_task(self.model.complete(neutral, rendered, on_delta=on_delta))
        watch = asyncio.create_task(self._watch_interrupts(offset))
        try:
            done, _ = await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            call.cancel()
            watch.cancel()
            raise
        if call in done:
            watch.cancel()
            return call.result()
        call.cancel()
        interrupter = watch.result()
        await self.journal.append(
            self.stream,
            LlmRequestInterrupted(request_offset=offset, reason=f"interrupted by @{interrupter}"),
            actor="agent",
        )
        await self._emit("interrupted", offset=offset, by=interrupter)
        return None

    async def _watch_interrupts(self, offset: int) -> int:
        """Return the offset of the first ``interrupt`` item appended after request @offset."""
        # The request is the stream's latest: start the tail at it, not by reading the whole
        # stream on every request (a cursor of None tails from the start, skipping <= offset).
        latest = await self.journal.latest(self.stream, [LlmRequestRequested])
        cursor = latest[0].cursor if latest and latest[0].position == offset else None
        async for stored in self.journal.subscribe(self.stream, after=cursor, poll_interval=0.02):
            if stored.type != ContextAdded.event_type or stored.position <= offset:
                continue
            item = stored.decode(ContextAdded)
            assert isinstance(item, ContextAdded)
            if behaviour_of(item) == "interrupt":
                return stored.position
        raise AssertionError("unreachable: subscribe never ends")

    async def _record_output(self, offset: int, output: ModelOutput) -> None:
        calls = tuple(
            ModelToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in output.tool_calls
        )
        usage = TokenUsage(
            input_tokens=output.usage.input_tokens,
            output_tokens=output.usage.output_tokens,
            cached_input_tokens=output.usage.cached_input_tokens or None,
        )
        events: list[Event] = [
            LlmResponse(
                request_offset=offset,
                model=self.model.model,
                text=output.text,
                tool_calls=calls,
                usage=usage,
                stop_reason=output.finish_reason,
            ),
            ContextAdded(
                role="assistant",
                actor=Actor(type="agent"),
                content=output.text,
                tool_calls=calls,
                llm_request_offset=offset,
            ),
        ]
        await self.journal.append(self.stream, events, actor="agent")
        await self._emit("response", offset=offset, output=output)

    async def _run_tools(self, calls: Sequence[ModelToolCall]) -> int:
        for call in calls:
            await self._emit("tool-start", call=call)
            outcome: ToolOutcome = await self.toolbox.call(
                ToolCall(id=call.id, name=call.name, arguments=call.arguments)
            )
            result = ToolCallResult(
                tool_call_id=call.id,
                name=call.name,
                content=outcome.output,
                is_error=outcome.is_error,
            )
            await self.journal.append(self.stream, [result, tool_result_item(result)], actor="tool")
            await self._emit("tool-end", call=call, outcome=outcome)
        return len(calls)

    # -- compaction ---------------------------------------------------------------------------

    async def _compact(self, offset: int, report: RunReport) -> None:
        """Summarize the exact request @offset (plus the instruction) through the same model;
        the summary replaces history through @offset."""
        current = await self.journal.fold(AgentContext, self.stream)
        if offset <= current.compacted_through:
            return  # already summarized (the summary comes after the request it replaces)
        state = await rebuild_state(self.journal, self.stream, offset)
        recorded_for = state.header.transport if state.header is not None else None
        if recorded_for != self.model.transport:
            # The exact request can only go through the model it was recorded for (and one
            # without a header cannot be rendered): the next request, logged with this
            # model's header, is measured and compacted instead.
            log.warning(
                "not compacting request @%s of %r: recorded for %s, the model speaks %s",
                offset,
                self.stream,
                recorded_for,
                self.model.transport,
            )
            return
        neutral = build_summary_request(state, through=offset)
        rendered = render_request(neutral, self.model.transport)
        await self._emit("compaction-start", offset=offset)
        output = await self.model.complete(neutral, rendered)
        usage = TokenUsage(
            input_tokens=output.usage.input_tokens, output_tokens=output.usage.output_tokens
        )
        await self.journal.append(
            self.stream, summary_item(output.text, cutoff=offset, usage=usage), actor="agent"
        )
        report.compactions.append(offset)
        await self._emit("compaction", offset=offset, summary=output.text)
