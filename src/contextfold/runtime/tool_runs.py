"""Running the outstanding tool calls of a turn, each at most once by record.

Right before a tool's function runs, the runtime appends a ``ToolCallStarted`` for the call
(after the previous call's result: calls run one after another), and afterwards its
``ToolCallResult`` with the model-visible item. An agent that stops in between (a crash, a
kill, a cancel) leaves a started call without a result; the agent that resumes the stream
does not run it silently again. A tool that may run again (``Tool.idempotent``, or the
agent's ``on_interrupted_tool="rerun"``) is run again, with ``ToolContext.resumed`` set;
any other gets an error result telling the model that it may already have run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from ..context.events import ToolCallResult, ToolCallStarted, tool_result_item
from ..journal import Journal
from ..wire import ToolCall
from .events import LoopEvent, ToolFinished, ToolStarted
from .scheduling import AGENT, TOOL_WRITER
from .tools import Tool, Toolbox, ToolContext, ToolOutcome

__all__ = ["NOT_RERUN", "InterruptedToolPolicy", "ToolRuns", "may_rerun", "run_calls"]

InterruptedToolPolicy = Literal["report", "rerun"]
"""What a resumed agent does with a call that was started and recorded no result."""

NOT_RERUN = (
    "this tool call may already have run: the agent stopped after starting it and before "
    "recording its result; it was not run again"
)
"""The error result a call that may already have run gets instead of a second run."""


def may_rerun(tool: Tool | None, policy: InterruptedToolPolicy) -> bool:
    """Whether a call that may already have run is run again: the tool's own ``idempotent``
    when it says, else the agent's policy."""
    if tool is not None and tool.idempotent is not None:
        return tool.idempotent
    return policy == "rerun"


@dataclass(frozen=True, slots=True)
class ToolRuns:
    """What one ``run`` did: how many calls it answered, and which of them were answered
    with :data:`NOT_RERUN` instead of running."""

    answered: int = 0
    not_rerun: tuple[str, ...] = ()


async def run_calls(
    journal: Journal,
    stream: str,
    toolbox: Toolbox,
    calls: Sequence[ToolCall],
    *,
    started: Collection[str],
    policy: InterruptedToolPolicy,
    emit: Callable[[LoopEvent], Awaitable[None]],
) -> ToolRuns:
    """Answer ``calls`` in order; ``started``: those the journal records as started without
    a result. Store errors propagate (the call's record is then what the journal holds)."""
    not_rerun: list[str] = []
    for call in calls:
        resumed = call.id in started
        if resumed and not may_rerun(toolbox.get(call.name), policy):
            outcome = ToolOutcome(call.id, call.name, NOT_RERUN, is_error=True)
            not_rerun.append(call.id)
        else:
            await emit(ToolStarted(call=call))
            outcome = await toolbox.call(
                call,
                ToolContext(call.id, call.name, stream, resumed=resumed),
                on_start=_recorder(journal, stream, call),
            )
        result = ToolCallResult(
            tool_call_id=call.id,
            name=call.name,
            content=outcome.output,
            is_error=outcome.is_error,
        )
        await journal.append(stream, [result, tool_result_item(result)], actor=TOOL_WRITER)
        await emit(ToolFinished(call=call, outcome=outcome))
    return ToolRuns(len(calls), tuple(not_rerun))


def _recorder(journal: Journal, stream: str, call: ToolCall) -> Callable[[], Awaitable[None]]:
    async def record() -> None:
        started = ToolCallStarted(tool_call_id=call.id, name=call.name)
        await journal.append(stream, started, actor=AGENT)

    return record
