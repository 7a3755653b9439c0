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
from collections.abc import AsyncGenerator, Sequence
from typing import Any, cast

from .._aio import CancelWatch, finish
from ..context.compaction import DEFAULT_CONTEXT_WINDOW, check_context_window
from ..context.events import ContextAdded
from ..context.evidence import DEFAULT_CONTENT_LIMIT, check_content_limit
from ..context.projection import AgentContext
from ..context.state import SYSTEM_PROMPT_KEY
from ..errors import InvalidInputError, ModelError
from ..journal import Journal
from ..render.prefix import SessionPrefix
from ..wire import ToolCall
from .clients import ModelClient, context_window_of
from .compacting import catch_up
from .events import AgentObserver, LoopCancelled, LoopHalted
from .instance import MATERIALIZE_EVERY, AgentSettings, AgentState, Run, RunReport, Status
from .materializing import materialize_if_due
from .scheduling import AgentHalted, Scheduler, TurnBudgets, decide
from .spans import LoopSpans, client_server
from .tool_runs import InterruptedToolPolicy, run_calls
from .tools import Toolbox
from .turn import request, retry

__all__ = ["Agent", "system_prompt"]

log = logging.getLogger("contextfold.runtime")

# The longest pause of ``serve`` between attempts while the provider keeps failing.
_SERVE_MAX_BACKOFF = 5.0


def system_prompt(text: str) -> ContextAdded:
    """The agent's base prompt: the ``agent/system-prompt`` system item birth waits for."""
    return ContextAdded(role="system", content=text, key=SYSTEM_PROMPT_KEY)


class Agent:
    """An agent on one journal stream.

    ``model`` completes requests (its ``transport`` picks the wire format); ``tools`` are
    callables or :class:`Tool` objects; ``prefix`` contributes the session prefix, composed
    once per Agent instance (a loop instance). The arguments are kept, checked, as
    :attr:`settings`; besides them an agent holds only what its own appends told it
    (:class:`AgentState`): the journal is the agent's state.

    Tools run at most once by record: a call the journal shows started but unanswered (the
    agent stopped while it ran) is, by ``on_interrupted_tool``, answered with an error
    saying it may already have run (``"report"``, the default) or run again (``"rerun"``);
    a tool's own ``idempotent`` (True or False) overrides the policy for its calls.

    ``context_window`` is the model's input limit in tokens, compacted at
    ``compaction_threshold`` of it; None takes the model client's own ``context_window``,
    else the model's from ``context.compaction``'s table (``MODEL_WINDOWS``, which says where
    each number comes from), else what the client's server reports (llama.cpp, vLLM), else
    the table's default (logged as a warning, once).

    ``name`` names the agent in its OpenTelemetry spans (``invoke_agent {name}``,
    ``gen_ai.agent.name``); without it the turn span is ``invoke_agent``.

    ``content_limit`` is the most characters of one tool output or item the model sees: a
    longer one is cut, with a ref to the whole record in the journal (``context.evidence``).

    Every ``materialize_every`` stream positions the agent stores its context in chunks
    (``runtime.materializing``), so a new instance's first read starts there.

    Run one live Agent per stream. A new instance resumes a stopped or crashed one (it
    re-sends an unanswered request byte for byte and runs unanswered tool calls), so a
    second live instance would take the first one's request in flight for a lost one:
    across processes, build it on a lease's journal (``cf.hold_lease``), or let a
    ``cf.Worker`` run it, whose appends are fenced by the stream's lease.
    """

    __slots__ = ("_spans", "_state", "journal", "observer", "settings", "stream")

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
        materialize_every: int = MATERIALIZE_EVERY,
        name: str | None = None,
    ) -> None:
        check_content_limit(content_limit)
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidInputError(f"name must be a non-empty string or None, got {name!r}")
        if on_interrupted_tool not in ("report", "rerun"):
            raise InvalidInputError(
                f"on_interrupted_tool must be 'report' or 'rerun', not {on_interrupted_tool!r}"
            )
        self.journal = journal
        self.stream = stream
        self.settings = AgentSettings(
            model=model,
            toolbox=tools if isinstance(tools, Toolbox) else Toolbox(tools),
            prefix=(prefix or SessionPrefix()).instance(),
            max_tokens=max_tokens,
            temperature=temperature,
            stream_responses=stream_responses,
            budgets=budgets or TurnBudgets(),
            compaction_threshold=compaction_threshold,
            context_window=check_context_window(context_window),
            on_interrupted_tool=on_interrupted_tool,
            content_limit=content_limit,
            materialize_every=materialize_every,
        )
        self.observer = observer
        self._state = AgentState(window_known=context_window is not None)
        self._spans = LoopSpans(
            journal.namespace,
            stream,
            model.model,
            model.transport,
            agent_name=name,
            server=client_server(model),
        )

    @property
    def model(self) -> ModelClient:
        """The model client requests go to (``settings.model``)."""
        return self.settings.model

    @property
    def status(self) -> Status:
        """``busy`` while a run takes a step, else how the last run ended."""
        return self._state.status

    async def _look_up_window(self) -> None:
        """The context window when none was given: the client's, the table's, the server's."""
        window, source = await context_window_of(self.model)
        self._state.window_known = True
        self.settings.context_window = window
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
        run = Run(
            self.journal,
            self.stream,
            self.settings,
            self._state,
            report,
            observer=self.observer,
            spans=self._spans,
        )
        self._spans.start_turn()
        if not self._state.window_known:
            await self._look_up_window()
        try:
            for _ in range(max_steps):
                if stop is not None and stop.is_set():
                    report.reason = "stop requested"
                    break
                if not await self._step(run):
                    break
                report.steps += 1
        except asyncio.CancelledError:
            # A shutdown, maybe while tools run: observers close what they still hold open
            # (a request's own rows are closed where it is sent).
            await finish(run.emit(LoopCancelled()))
            raise
        finally:
            # Never left "busy": after an error the report's status is still "idle".
            self._state.status = report.status
            self._spans.end_turn(report.status, report.reason)
        return report

    async def _step(self, run: Run) -> bool:
        """Take one step from the journal as it is now: a compaction, the tool calls, a
        request (or its re-send) or a halt. False when there is none to take (the report
        says why)."""
        known = run.state.version_seen  # the states hold everything through it
        context, sched = await self.journal.fold_pair(AgentContext, Scheduler, self.stream)
        run.cancel.check()
        if await catch_up(run, context, sched):
            return True
        if await materialize_if_due(run, context):  # its events come first now
            known = run.state.version_seen
            context, sched = await self.journal.fold_pair(AgentContext, Scheduler, self.stream)
        report = run.report
        decision = decide(sched, context, self.settings.budgets)
        if decision.action == "idle":
            report.status = "stopped" if sched.halted else "idle"
            report.reason = decision.reason
            return False
        if decision.action == "queued":
            report.status, report.reason = "queued", decision.reason
            self._report_birth(decision.reason)
            return False
        run.busy()
        if decision.action == "halt":
            reason = "circuit-breaker" if "breaker" in decision.reason else "turn-budget"
            halted = AgentHalted(reason=reason, detail=decision.reason)
            run.saw(await self.journal.append(self.stream, halted, actor="agent"))
            await run.emit(LoopHalted(reason=decision.reason))
            report.status, report.reason = "stopped", decision.reason
            report.steps += 1
            return False
        if decision.action == "run-tools":
            await self._run_tools(run, sched.outstanding, sched.started)
        elif decision.action == "retry":
            assert sched.last_request is not None
            await retry(run, sched.last_request, sched.request_actor)
        else:
            await request(run, context, decision, known)
        return True

    def _report_birth(self, reason: str) -> None:
        """Say once per agent that it waits for its system prompt: otherwise it does nothing
        and says nothing, however often it is run."""
        if self._state.birth_reported:
            return
        self._state.birth_reported = True
        log.warning(
            "agent on %r: %s; nothing is sent to the model until a writer appends it "
            "(cf.system_prompt(...))",
            self.stream,
            reason,
        )

    async def _run_tools(
        self, run: Run, calls: tuple[ToolCall, ...], started: tuple[str, ...]
    ) -> None:
        """Run ``calls`` (``started``: those the journal shows started without a result)."""
        settings = self.settings
        runs = await run_calls(
            self.journal,
            self.stream,
            settings.toolbox,
            calls,
            started=started,
            policy=settings.on_interrupted_tool,
            emit=run.emit,
            content_limit=settings.content_limit,
        )
        run.report.tool_calls += runs.answered
        run.report.not_rerun.extend(runs.not_rerun)
        run.state.version_seen = max(run.state.version_seen, runs.version)

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
