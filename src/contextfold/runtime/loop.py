"""The agent loop: wait for triggers, read the context, record and send the request, append
the output, run tool calls, compact when usage crosses the threshold, and go on.

Every decision is derived from the journal (the context and scheduler folds), so the loop
can stop at any point and a new instance picks up where it left off: an unanswered
request is re-sent byte for byte, unanswered tool calls are run, and a call that was
started without a recorded result is run again only when its tool may run twice (see
``tool_runs``): tools run at most once by record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, cast

from pydantic import ValidationError

from .._aio import CancelWatch
from ..context.compaction import (
    build_summary_request,
    needs_compaction,
    pick_compaction,
    summary_item,
)
from ..context.events import (
    ContextAdded,
    LlmRequestInterrupted,
    LlmRequestRequested,
    LlmResponse,
    ModelToolCall,
    RequestHeader,
    TokenUsage,
    ToolDefinition,
    assistant_item,
)
from ..context.projection import AgentContext
from ..context.rebuild import RequestRecorded, rebuild_state
from ..context.request import build_request, prefix_snapshot
from ..context.state import SYSTEM_PROMPT_KEY, AgentContextState
from ..context.trust import trusted_extensions
from ..errors import CorruptEventError, InvalidInputError, RenderError
from ..events import Envelope, StoredEvent
from ..journal import Journal
from ..render.neutral import (
    NeutralRequest,
    RenderedRequest,
    ToolCall,
    render_request,
)
from ..render.prefix import PrefixInstance, SessionPrefix
from .models import ModelClient, ModelError, ModelOutput
from .scheduling import (
    AGENT,
    AgentHalted,
    Decision,
    Scheduler,
    SchedulerState,
    TurnBudgets,
    behaviour_of,
    decide,
)
from .tool_runs import InterruptedToolPolicy, run_calls
from .tools import Toolbox

__all__ = ["Agent", "AgentObserver", "Observers", "RunReport", "Status", "system_prompt"]

log = logging.getLogger("contextfold.runtime")
Status = Literal["idle", "queued", "busy", "stopped"]

# In-process appends wake the interrupt watcher at once (the store's wakeups); this is only
# how often it looks for an interrupt appended by another process during a model call.
_INTERRUPT_POLL = 0.25
# The longest pause of ``serve`` between attempts while the provider keeps failing.
_SERVE_MAX_BACKOFF = 5.0


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
    not_rerun: list[str] = field(default_factory=list)
    """Ids of calls that may already have run and were answered with an error, not run."""
    compactions: list[int] = field(default_factory=list)
    status: Status = "idle"
    reason: str = ""


class Agent:
    """An agent on one journal stream.

    ``model`` completes requests (its ``transport`` picks the wire format); ``tools`` are
    callables or :class:`Tool` objects; ``prefix`` contributes the session prefix, composed
    once per Agent instance (a loop instance). Nothing else is kept in memory: the journal
    is the agent's state.

    Tools run at most once by record: a call the journal shows started but unanswered (the
    agent stopped while it ran) is, by ``on_interrupted_tool``, answered with an error
    saying it may already have run (``"report"``, the default) or run again (``"rerun"``);
    a tool's own ``idempotent`` (True or False) overrides the policy for its calls.

    Run one live Agent per stream. A new instance resumes a stopped or crashed one (it
    re-sends an unanswered request byte for byte and runs unanswered tool calls), so a
    second live instance would take the first one's request in flight for a lost one.
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
        on_interrupted_tool: InterruptedToolPolicy = "report",
    ) -> None:
        if on_interrupted_tool not in ("report", "rerun"):
            raise InvalidInputError(
                f"on_interrupted_tool must be 'report' or 'rerun', not {on_interrupted_tool!r}"
            )
        self.journal = journal
        self.stream = stream
        self.model = model
        self.toolbox = tools if isinstance(tools, Toolbox) else Toolbox(tools)
        self.prefix: PrefixInstance = (prefix or SessionPrefix()).instance()
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.stream_responses = stream_responses
        self.budgets = budgets or TurnBudgets()
        self.compaction_threshold = compaction_threshold
        self.observer = observer
        self.on_interrupted_tool: InterruptedToolPolicy = on_interrupted_tool
        self.status: Status = "idle"
        self._not_compactable: set[int] = set()  # requests recorded for another transport
        self._cancel = CancelWatch()  # renewed by each run

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
        self._cancel = CancelWatch()  # a cancel a driver swallowed still stops the run
        try:
            for _ in range(max_steps):
                context = await self.journal.fold(AgentContext, self.stream)
                sched = await self.journal.fold(Scheduler, self.stream)
                self._cancel.check()
                if await self._catch_up_compaction(context, sched, report):
                    continue
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
                    reason = "circuit-breaker" if "breaker" in decision.reason else "turn-budget"
                    await self.journal.append(
                        self.stream,
                        AgentHalted(reason=reason, detail=decision.reason),
                        actor="agent",
                    )
                    await self._emit("halted", reason=decision.reason)
                    report.status, report.reason = "stopped", decision.reason
                    break
                if decision.action == "run-tools":
                    runs = await run_calls(
                        self.journal,
                        self.stream,
                        self.toolbox,
                        sched.outstanding,
                        started=sched.started,
                        policy=self.on_interrupted_tool,
                        emit=self._emit,
                    )
                    report.tool_calls += runs.answered
                    report.not_rerun.extend(runs.not_rerun)
                elif decision.action == "retry":
                    assert sched.last_request is not None
                    await self._retry(sched.last_request, sched.request_actor, report)
                else:
                    await self._request(context, decision, report)
        except asyncio.CancelledError:
            # A shutdown, maybe while tools run: observers close what they still hold open
            # (a request's own rows are closed where it is sent).
            await _finish(self._emit("cancelled"))
            raise
        finally:
            # Never left "busy": after an error the report's status is still "idle".
            self._set_status(report.status)
        return report

    async def serve(self, *, poll_interval: float = 0.05) -> None:
        """Run forever: run until idle, then sleep until anything is appended to the stream.

        The head is taken before each run, so an item appended while the run ends still
        wakes the next one (the agent's own appends wake it once, harmlessly). A provider
        error is retried after a growing pause; a store error (the database down, the
        journal closed) ends ``serve``: run it under a supervisor, a new agent resumes.
        """
        failures = 0
        cancel = CancelWatch()  # a cancel a library swallowed still stops the agent
        while True:
            cancel.check()
            cursor = await self.journal.head(self.stream)
            try:
                await self.run_until_idle()
                failures = 0
            except ModelError as exc:
                # A provider outage must not end the agent: the unanswered request is
                # retried (byte for byte) after a growing pause, and by any new item.
                failures += 1
                delay = min(poll_interval * 2**failures, _SERVE_MAX_BACKOFF)
                log.warning(
                    "agent on %r: %s; retrying in %.2fs", self.stream, exc, delay, exc_info=exc
                )
                await asyncio.sleep(delay)
                continue
            tail = self.journal.subscribe(self.stream, after=cursor, poll_interval=poll_interval)
            async with contextlib.aclosing(cast(AsyncGenerator[Any, None], tail)) as events:
                async for _ in events:
                    break

    # -- one request --------------------------------------------------------------------------

    async def _header(self, context: AgentContextState) -> RequestHeader:
        prefix = await self.prefix.get()
        return RequestHeader(
            transport=self.model.transport,
            model=self.model.model,
            session_prefix=prefix_snapshot(prefix),
            # The registry is process state: the header records it so rebuilds agree.
            trusted_actor_types=trusted_extensions(),
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

    async def _retry(self, offset: int, appended_by: str | None, report: RunReport) -> None:
        context = await self.journal.fold(AgentContext, self.stream)
        header = context.header if context.request_offset == offset else None
        reason = ""
        if appended_by != AGENT:
            # Another writer's request (its header may carry any system prompt, model or
            # trust list) is never sent: only the agent decides what goes to the provider.
            reason = (
                f"request @{offset} was not appended by the agent "
                f"(actor {appended_by!r}) and is not sent"
            )
        elif header is None:
            reason = f"request @{offset} has no header snapshot and cannot be rendered"
        elif header.transport != self.model.transport:
            reason = (
                f"request @{offset} was recorded for the {header.transport} transport; "
                f"this agent's model speaks {self.model.transport}"
            )
        if reason:
            # It must not or cannot be re-sent byte for byte through this model (another
            # writer's, appended without a header, or the agent's model changed since):
            # seal it and request anew, with this instance's header logged, so its
            # triggers are still answered.
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
        neutral: NeutralRequest | None = None
        if context.request_offset == offset and context.header is not None:
            # The cached fold through the request: the per-turn cost stays flat...
            try:
                neutral = build_request(context, through=offset)
                transport = context.header.transport
            except RenderError:
                pass  # ...unless a compaction after @offset removed items the request saw
        if neutral is None:  # a retry after later requests or a compaction: fold through it
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
        # Observers opened rows for the request (a transcript): until its outcome is recorded
        # (the journal appends included), an error or a cancel anywhere must close them.
        try:
            output = await self._complete_interruptible(offset, neutral, rendered)
            if output is None:
                report.interrupted.append(offset)
                return
            # Its usage report is compacted, when over the threshold, by the loop's next step.
            await self._record_output(offset, output)
        except Exception as exc:
            await self._emit("error", offset=offset, error=exc)
            raise
        except asyncio.CancelledError:
            # The agent itself is cancelled (a shutdown): the closing runs to its end.
            await _finish(self._emit("interrupted", offset=offset, by=None))
            raise

    async def _complete_interruptible(
        self, offset: int, neutral: NeutralRequest, rendered: RenderedRequest
    ) -> ModelOutput | None:
        """The model's output, or None when an ``interrupt`` item arrived meanwhile (the
        request is then recorded as interrupted)."""

        async def on_delta(kind: str, text: str) -> None:
            await self._emit("delta", offset=offset, kind=kind, text=text)

        self._cancel.check()  # no model call (paid, maybe long) for a cancelled agent
        call = asyncio.create_task(self.model.complete(neutral, rendered, on_delta=on_delta))
        watch = asyncio.create_task(self._watch_interrupts(offset))
        try:
            done, _ = await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # a cancel of the agent: its caller tells the observers
            await _cancel(call, watch)
            raise
        if call in done:
            await _cancel(watch)
            if call.cancelled():
                # Only this loop cancels the call, and it has not: the model's own work was
                # cancelled (a future it awaited). A provider failure, not a shutdown.
                raise ModelError(
                    f"{self.model.transport} request to model {self.model.model!r} failed: "
                    "it was cancelled from inside the model call"
                )
            return call.result()
        await _cancel(call)  # the provider call is over (its stream closed) before we go on
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
        # Start the tail at the request, never by reading the stream from its start. When a
        # newer request has superseded @offset, only items from now on can interrupt it.
        latest = await self.journal.latest(self.stream, [LlmRequestRequested])
        cursor: str | None
        if latest and latest[0].position == offset:
            cursor = latest[0].cursor
        else:
            cursor = await self.journal.head(self.stream)
        tail = self.journal.subscribe(self.stream, after=cursor, poll_interval=_INTERRUPT_POLL)
        # Closed here on return (a PostgreSQL tail stops listening), not by the garbage
        # collector later in a task nobody awaits.
        async with contextlib.aclosing(cast(AsyncGenerator[StoredEvent, None], tail)) as events:
            async for stored in events:
                if stored.type != ContextAdded.event_type or stored.position <= offset:
                    continue
                try:
                    item = stored.decode(ContextAdded)
                except (ValidationError, CorruptEventError) as exc:
                    # The folds skip it too (and report it): one bad row must not stop the agent.
                    log.warning(
                        "interrupt watcher skipped %s@%s: %s", self.stream, stored.position, exc
                    )
                    continue
                assert isinstance(item, ContextAdded)
                if behaviour_of(item) == "interrupt":
                    return stored.position
        raise AssertionError("unreachable: subscribe never ends")

    async def _record_output(self, offset: int, output: ModelOutput) -> None:
        context = await self.journal.fold(AgentContext, self.stream)
        used = {call.id for item in context.history for call in item.tool_calls}
        kept, dropped = _split_calls(output.tool_calls)
        calls = _unique_calls(kept, used, offset)
        text = output.text
        if dropped:
            # e.g. a stream cut at max_tokens inside a call: recorded, its half-written
            # arguments would make every later request unrenderable. The model sees why.
            notes = "\n".join(
                f"[tool call {c.name} dropped: its arguments were not a JSON object]"
                for c in dropped
            )
            text = f"{text}\n{notes}" if text else notes
        usage = TokenUsage(
            input_tokens=output.usage.input_tokens,
            output_tokens=output.usage.output_tokens,
            cached_input_tokens=output.usage.cached_input_tokens or None,
        )
        response = LlmResponse(
            request_offset=offset,
            model=self.model.model,
            text=text,
            tool_calls=calls,
            usage=usage,
            stop_reason=output.finish_reason,
        )
        # assistant_item reads only the payload: the envelope is the one for pure use.
        item = assistant_item(Envelope.make(response, position=offset, stream=self.stream))
        await self.journal.append(self.stream, [response, item], actor="agent")
        recorded = tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls)
        await self._emit(
            "response", offset=offset, output=replace(output, text=text, tool_calls=recorded)
        )

    # -- compaction ---------------------------------------------------------------------------

    async def _catch_up_compaction(
        self, context: AgentContextState, sched: SchedulerState, report: RunReport
    ) -> bool:
        """Summarize the newest request whose usage report crossed the threshold and is not
        summarized yet (several may have piled up, e.g. before a restart: only the newest is
        summarized, once). Waits while the latest request is unanswered. True when it did."""
        if not sched.answered:
            return False
        picked = pick_compaction(
            sched.reports,
            threshold=self.compaction_threshold,
            compacted_through=context.compacted_through,
        )
        if picked is None or picked.request_offset in self._not_compactable:
            return False
        self._set_status("busy")
        if await self._compact(picked.request_offset, report):
            return True
        self._not_compactable.add(picked.request_offset)
        return False

    async def _compact(self, offset: int, report: RunReport) -> bool:
        """Summarize the exact request @offset (plus the instruction) through the same model;
        the summary replaces history through @offset. False when it cannot or need not."""
        current = await self.journal.fold(AgentContext, self.stream)
        if offset <= current.compacted_through:
            return False  # already summarized (the summary comes after the request it replaces)
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
            return False
        neutral = build_summary_request(state, through=offset)
        rendered = render_request(neutral, self.model.transport)
        await self._emit("compaction-start", offset=offset)
        self._cancel.check()  # no summary call for a cancelled agent either
        output = await self.model.complete(neutral, rendered)
        usage = TokenUsage(
            input_tokens=output.usage.input_tokens, output_tokens=output.usage.output_tokens
        )
        await self.journal.append(
            self.stream, summary_item(output.text, cutoff=offset, usage=usage), actor="agent"
        )
        report.compactions.append(offset)
        await self._emit("compaction", offset=offset, summary=output.text)
        return True


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    """Cancel the tasks and wait until each has finished (its cleanup run), whatever it
    raised: a cancelled model call must not outlive the loop step that started it."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _finish(cleanup: Awaitable[None]) -> None:
    """Run ``cleanup`` to its end for a caller that is handling a cancel (and re-raises it),
    even when the task is cancelled again meanwhile. ``asyncio.shield`` alone returns at the
    next cancel and leaves the cleanup running on, unawaited, after the task ended.

    A failing cleanup is logged, never raised: it must not turn the cancel into an error
    (a task cancelled at shutdown still ends cancelled). Under an anyio cancel scope, which
    re-delivers its cancel at every await, this waits in a busy loop for the cleanup's
    length (observer writes: milliseconds).
    """
    task = asyncio.ensure_future(cleanup)
    while not task.done():
        # A cancel here does not reach the cleanup; the caller re-raises the one it handles.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("cleanup after a cancel failed: %s", error, exc_info=error)


def _split_calls(calls: Sequence[ToolCall]) -> tuple[list[ToolCall], list[ToolCall]]:
    """The calls whose arguments are empty or a JSON object, and the others (truncated or
    malformed arguments, which no tool can run and no provider accepts back)."""
    kept: list[ToolCall] = []
    dropped: list[ToolCall] = []
    for call in calls:
        if not call.arguments.strip():
            kept.append(call)
            continue
        try:
            parsed = json.loads(call.arguments)
        except ValueError:
            parsed = None
        (kept if isinstance(parsed, dict) else dropped).append(call)
    return kept, dropped


def _unique_calls(
    calls: Sequence[ToolCall], used: set[str], offset: int
) -> tuple[ModelToolCall, ...]:
    """The calls of the response to request @offset, each with an id no other call in the
    context has (``used``) nor an earlier call of the same response.

    Providers may repeat ids (a local OpenAI-compatible server answering ``call_0`` every
    turn); a repeated id is neither sent as a call nor paired with its result, so a repeat
    gets the request offset as a suffix, ``call_0-12`` (``-``: Anthropic ids allow only
    ``[a-zA-Z0-9_-]``). Deterministic, and the journal records only the new ids.
    """
    taken = set(used)
    unique: list[ModelToolCall] = []
    for call in calls:
        base = call.id or "call"  # some servers send no id at all
        candidate, n = base, 1
        while candidate in taken:
            candidate = f"{base}-{offset}" if n == 1 else f"{base}-{offset}-{n}"
            n += 1
        taken.add(candidate)
        unique.append(ModelToolCall(id=candidate, name=call.name, arguments=call.arguments))
    return tuple(unique)
