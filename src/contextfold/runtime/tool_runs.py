"""Running the outstanding tool calls of a turn, each at most once by record.

Right before a tool's function runs, the runtime appends a ``ToolCallStarted`` for the call
(after the previous call's result: calls run one after another), and afterwards its
``ToolCallResult`` with the model-visible item. An agent that stops in between (a crash, a
kill, a cancel) leaves a started call without a result; the agent that resumes the stream
does not run it silently again. A tool that may run again (``Tool.idempotent``, or the
agent's ``on_interrupted_tool="rerun"``) is run again, with ``ToolContext.resumed`` set;
any other gets an error result telling the model that it may already have run.

An output over the agent's ``content_limit`` reaches the model cut, with a ref to the whole
output kept in the journal (``context.evidence``): in its ``ToolCallResult``, or in chunks
before it when it is over the journal's payload limit. Such an output never fails the run
nor gets the tool run again; one too large to store at all is an error result the model
reads. Observers get the outcome as the model reads it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ..context.events import ToolCallResult, ToolCallStarted
from ..context.evidence import (
    DEFAULT_CONTENT_LIMIT,
    MAX_OUTPUT_BYTES,
    StoredOutput,
    output_limit,
    tool_result_events,
)
from ..errors import ConflictError, WrongExpectedVersionError
from ..journal import Journal
from ..store.base import AppendResult
from ..wire import ToolCall
from .events import LoopEvent, ToolFinished, ToolStarted
from .scheduling import AGENT, TOOL_WRITER
from .tools import Tool, Toolbox, ToolContext, ToolOutcome

__all__ = [
    "NOT_RERUN",
    "InterruptedToolPolicy",
    "ToolRuns",
    "may_rerun",
    "run_calls",
]

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
    version: int = 0
    """The stream's version after the last of its appends (0: it made none)."""


async def run_calls(
    journal: Journal,
    stream: str,
    toolbox: Toolbox,
    calls: Sequence[ToolCall],
    *,
    started: Collection[str],
    policy: InterruptedToolPolicy,
    emit: Callable[[LoopEvent], Awaitable[None]],
    content_limit: int = DEFAULT_CONTENT_LIMIT,
    max_output_bytes: int = MAX_OUTPUT_BYTES,
) -> ToolRuns:
    """Answer ``calls`` in order; ``started``: those the journal records as started without
    a result. An output over ``content_limit`` characters reaches the model cut, one over
    ``max_output_bytes`` is refused (see the module). Store errors propagate (the call's
    record is then what the journal holds)."""
    not_rerun: list[str] = []
    versions = [0]  # of each append made: the newest is the stream's version after them
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
                on_start=_recorder(journal, stream, call, versions),
            )
        result = ToolCallResult(
            tool_call_id=call.id,
            name=call.name,
            content=outcome.output,
            is_error=outcome.is_error,
        )
        stored, appended = await _append_result(
            journal, stream, result, content_limit, max_output_bytes
        )
        versions.append(appended.last_position)
        shown = replace(outcome, output=stored.visible, is_error=stored.is_error)
        await emit(ToolFinished(call=call, outcome=shown))
    return ToolRuns(len(calls), tuple(not_rerun), max(versions))


# Appends by other writers between reading the version and appending make an attempt fail;
# each failure means the stream moved on, so a few attempts suffice but for a flood.
_APPEND_ATTEMPTS = 50


async def _append_result(
    journal: Journal, stream: str, result: ToolCallResult, limit: int, max_output_bytes: int
) -> tuple[StoredOutput, AppendResult]:
    """Append ``result`` with its item; a cut one at a known position (its item's ref names
    the result's offset), so with the stream's version as the expected one."""
    options = {"limit": limit, "max_payload_bytes": journal.max_payload_bytes}
    keep = output_limit(limit, journal.max_payload_bytes)
    if len(result.content) + len("error: ") <= keep:  # surely within the limit: no ref
        stored = tool_result_events(result, stream=stream, position=None, **options)
        return stored, await journal.append(stream, stored.events, actor=TOOL_WRITER)
    for _ in range(_APPEND_ATTEMPTS):
        version = await journal.version(stream)
        stored = tool_result_events(
            result,
            stream=stream,
            position=version + 1,
            max_output_bytes=max_output_bytes,
            **options,
        )
        try:
            appended = await journal.append(
                stream, stored.events, expected_version=version, actor=TOOL_WRITER
            )
        except WrongExpectedVersionError:
            continue
        return stored, appended
    raise ConflictError(
        f"stream {stream!r} kept changing while the result of tool call "
        f"{result.tool_call_id!r} was appended ({_APPEND_ATTEMPTS} attempts); run the agent "
        "again: the call is answered as one that may already have run"
    )


def _recorder(
    journal: Journal, stream: str, call: ToolCall, versions: list[int]
) -> Callable[[], Awaitable[None]]:
    async def record() -> None:
        started = ToolCallStarted(tool_call_id=call.id, name=call.name)
        appended = await journal.append(stream, started, actor=AGENT)
        versions.append(appended.last_position)

    return record
