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
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, cast

from .._aio import CancelWatch
from ..context.compaction import DEFAULT_CONTEXT_WINDOW, check_context_window
from ..context.events import ContextAdded
from ..context.evidence import DEFAULT_CONTENT_LIMIT, check_content_limit
from ..context.projection import AgentContext
from ..context.state import SYSTEM_PROMPT_KEY
from ..errors import InvalidInputError, ModelError
from ..journal import Journal
from ..render.prefix import SessionPrefix
from ..wire import ToolCall
from .carried import RequestDue, ToolsStarted, folded_ahead, seen_through
from .clients import ModelClient, context_window_of
from .events import AgentObserver, LoopCancelled, LoopHalted
from .instance import RunReport, Status
from .materializing import _position
from .scheduling import AgentHalted, Scheduler, TurnBudgets, decide
from .spans import LoopSpans
from .tool_runs import HeldResult, InterruptedToolPolicy, run_calls
from .tools import Toolbox
from .turn import TurnSteps, _finish

__all__ = ["Agent", "system_prompt"]

log = logging.getLogger("contextfold.runtime")

# The longest pause of ``serve`` between attempts while the provider keeps failing.
_SERVE_MAX_BACKOFF = 5.0


def system_prompt(text: str) -> ContextAdded:
    """The agent's base prompt: the ``agent/system-prompt`` system item birth waits for."""
    return ContextAdded(role="system", content=text, key=SYSTEM_PROMPT_KEY)


class Agent(TurnSteps):
    """An agent on one journal stream.

    ``model`` completes requests (its ``transport`` picks the wire format); ``tools`` are
    callables or :class:`Tool` objects; ``prefix`` contributes the session prefix, composed
    once per Agent instance (a loop instance). Nothing else is kept in memory: the journal
    is the agent's state.

    Tools run at most once by record: a call the journal shows started but unanswered (the
    agent stopped while it ran) is, by ``on_interrupted_tool``, answered with an error
    saying it may already have run (``"report"``, the default) or run again (``"rerun"``);
    a tool's own ``idempotent`` (True or False) overrides the policy for its calls.

    ``context_window`` is the model's input limit in tokens, compacted at
    ``compaction_threshold`` of it; None takes the model client's own ``context_window``,
    else the model's from ``context.compaction``'s table (``MODEL_WINDOWS``, which says where
    each number comes from), else what the client's server reports (llama.cpp, vLLM), else
    the table's default (logged as a warning, once).

    ``content_limit`` is the most characters of one tool output or item the model sees: a
    longer one is cut, with a ref to the whole record in the journal (``context.evidence``).

    Run one live Agent per stream. A new instance resumes a stopped or crashed one (it
    re-sends an unanswered request byte for byte and runs unanswered tool calls), so a
    second live instance would take the first one's request in flight for a lost one:
    across processes, build it on a lease's journal (``cf.hold_lease``), or let a
    ``cf.Worker`` run it, whose appends are fenced by the stream's lease.
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
        context_window: int | None = None,
        observer: AgentObserver | None = None,
        on_interrupted_tool: InterruptedToolPolicy = "report",
        content_limit: int = DEFAULT_CONTENT_LIMIT,
    ) -> None:
        check_content_limit(content_limit)
        if on_interrupted_tool not in ("report", "rerun"):
            raise InvalidInputError(
                f"on_interrupted_tool must be 'report' or 'rerun', not {on_interrupted_tool!r}"
            )
        self.journal = journal
        self.stream = stream
        self.model = model
        self.toolbox = tools if isinstance(tools, Toolbox) else Toolbox(tools)
        self.prefix = (prefix or SessionPrefix()).instance()
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.stream_responses = stream_responses
        self.budgets = budgets or TurnBudgets()
        self.compaction_threshold = compaction_threshold
        self.context_window = check_context_window(context_window)
        self._window_looked_up = context_window is not None
        self.observer = observer
        self.on_interrupted_tool: InterruptedToolPolicy = on_interrupted_tool
        self.content_limit = content_limit
        self.status: Status = "idle"
        self._birth_reported = False  # the wait for the system prompt is logged once
        self._not_compactable: set[int] = set()
        self._cancel = CancelWatch()
        self._spans = LoopSpans(journal.namespace, stream, model.model, model.transport)

    async def _look_up_window(self) -> None:
        """The context window when none was given: the client's, the table's, the server's."""
        window, source = await context_window_of(self.model)
        self._window_looked_up = True
        self.context_window = window
        if source == "server":
            log.info(
                "%s: context window %s tokens, as the model's server reports", self.stream, window
            )
        elif source == "unreported":
            log.warning(
                "%s: the context window of model %r is unknown (not in contextfold's table, not "
                "reported by its server): assuming %s tokens; give cf.Agent(context_window=...)",
                self.stream,
                self.model.model,
                f"{DEFAULT_CONTEXT_WINDOW:,}",
            )

    # -- the loop -----------------------------------------------------------------------------

    async def run_until_idle(
        self, *, max_steps: int = 1000, stop: asyncio.Event | None = None
    ) -> RunReport:
        """Run until nothing wakes the model (idle), birth is pending (queued) or the loop
        halted itself (stopped); once ``stop`` is set, after the step in progress (reason
        ``"stop requested"``). Raises ModelError when the provider fails."""
        report = RunReport()
        self._cancel = CancelWatch()  # a cancel a driver swallowed still stops the run
        spans = self._spans
        if spans is not None:
            spans.start_turn()
        if not self._window_looked_up:
            await self._look_up_window()
        self._carried = None
        left = max_steps

        def next_runs() -> bool:  # whether a step after the one in progress will run
            return self._ahead and left > 0 and not (stop is not None and stop.is_set())

        try:
            while left > 0:
                carried = self._carried
                if isinstance(carried, ToolsStarted):
                    # Its first call is recorded as started: the step is under way.
                    self._carried = None
                    left -= 1
                    report.steps += 1
                    await self._run_tools(carried.calls, (), report, next_runs, carried.recorded)
                    continue
                if stop is not None and stop.is_set():
                    await self._flush_carried()
                    report.reason = "stop requested"
                    break
                if carried is not None:
                    self._cancel.check()
                    self._carried = None  # the request takes the held result on
                    self._set_status("busy")
                    left -= 1
                    self._next_runs = next_runs
                    try:
                        sent = await self._request(
                            carried.context, carried.decision, report, carried.version, carried
                        )
                    finally:
                        self._next_runs = None
                    if sent:
                        report.steps += 1
                        continue
                    left += 1  # the stream moved on (the held result is appended): look again
                known = self._version_seen  # the states hold everything through it
                context, sched = await self.journal.fold_pair(AgentContext, Scheduler, self.stream)
                self._cancel.check()
                left -= 1
                if await self._catch_up_compaction(context, sched, report):
                    report.steps += 1
                    continue
                if await self._materialize_if_due(context):  # its events come first now
                    known = self._version_seen
                    context, sched = await self.journal.fold_pair(
                        AgentContext, Scheduler, self.stream
                    )
                decision = decide(sched, context, self.budgets)
                if decision.action == "idle":
                    report.status, report.reason = (
                        ("stopped" if sched.halted else "idle"),
                        decision.reason,
                    )
                    break
                if decision.action == "queued":
                    report.status, report.reason = "queued", decision.reason
                    self._report_birth(decision.reason)
                    break
                self._set_status("busy")
                report.steps += 1
                if decision.action == "halt":
                    reason = "circuit-breaker" if "breaker" in decision.reason else "turn-budget"
                    halted = AgentHalted(reason=reason, detail=decision.reason)
                    self._saw(await self.journal.append(self.stream, halted, actor="agent"))
                    await self._emit(LoopHalted(reason=decision.reason))
                    report.status, report.reason = "stopped", decision.reason
                    break
                if decision.action == "run-tools":
                    await self._run_tools(sched.outstanding, sched.started, report, next_runs)
                elif decision.action == "retry":
                    assert sched.last_request is not None
                    await self._retry(sched.last_request, sched.request_actor, report)
                else:
                    self._next_runs = next_runs
                    try:
                        await self._request(context, decision, report, known)
                    finally:
                        self._next_runs = None
        except asyncio.CancelledError:
            # A shutdown, maybe while tools run: observers close what they still hold open
            # (a request's own rows are closed where it is sent).
            await _finish(self._flush_carried())
            await _finish(self._emit(LoopCancelled()))
            raise
        except Exception:
            await _finish(self._flush_carried())
            raise
        finally:
            # Never left "busy": after an error the report's status is still "idle".
            self._set_status(report.status)
            if spans is not None:
                spans.end_turn(report.status, report.reason)
        return report

    def _report_birth(self, reason: str) -> None:
        """Say once per agent that it waits for its system prompt: otherwise it does nothing
        and says nothing, however often it is run."""
        if self._birth_reported:
            return
        self._birth_reported = True
        log.warning(
            "agent on %r: %s; nothing is sent to the model until a writer appends it "
            "(cf.system_prompt(...))",
            self.stream,
            reason,
        )

    async def _run_tools(
        self,
        calls: tuple[ToolCall, ...],
        started: tuple[str, ...],
        report: RunReport,
        next_runs: Callable[[], bool],
        recorded: str | None = None,
    ) -> None:
        """Run ``calls`` (``recorded``: the first one's start is recorded already). When the
        next step is the request after them, the last result is held for its append."""
        hold = next_runs()
        runs = await run_calls(
            self.journal,
            self.stream,
            self.toolbox,
            calls,
            started=started,
            policy=self.on_interrupted_tool,
            emit=self._emit,
            content_limit=self.content_limit,
            recorded=recorded,
            hold_last=hold,
        )
        report.tool_calls += runs.answered
        report.not_rerun.extend(runs.not_rerun)
        self._version_seen = max(self._version_seen, runs.version)
        if runs.held is not None:
            try:
                self._carried = await self._request_due(runs.held, next_runs)
            except BaseException:
                await _finish(self._flush(runs.held))
                raise
            if self._carried is None:
                await self._flush(runs.held)

    async def _request_due(
        self, held: HeldResult, next_runs: Callable[[], bool]
    ) -> RequestDue | None:
        """The next step from the journal and ``held`` folded ahead, when it is a request
        the held result can go out with (nothing else comes first); else None."""
        known = self._version_seen  # the states hold everything through it
        context, sched = await self.journal.fold_pair(AgentContext, Scheduler, self.stream)
        version = max(known, seen_through(context))
        first = version + 1
        context = folded_ahead(AgentContext, context, held.events, self.stream, first)
        sched = folded_ahead(Scheduler, sched, held.events, self.stream, first)
        if (
            not next_runs()
            or self._compaction_due(context, sched)
            or self._materialization_due(_position(context))
        ):
            return None
        decision = decide(sched, context, self.budgets)
        if decision.action != "request":
            return None
        return RequestDue(context, sched, decision, held, version)

    async def _flush_carried(self) -> None:
        """Append what a step held back for the next one, which will not come."""
        carried, self._carried = self._carried, None
        if isinstance(carried, RequestDue):
            await self._flush(carried.held)

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
