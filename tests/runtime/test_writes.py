"""What the agent runtime appends is declared ``runtime_only`` beside its class, so the HTTP
service (which derives what it refuses from that declaration) refuses it from external
writers: a runtime event added without the declaration fails here."""

from __future__ import annotations

import asyncio

from contextfold.context.compaction import COMPACTION_INSTRUCTION
from contextfold.context.events import (
    ContextAdded,
    LlmRequestInterrupted,
    LlmRequestRequested,
    LlmResponse,
    ToolCallResult,
    ToolCallStarted,
)
from contextfold.context.rebuild import RequestRecorded
from contextfold.events import Event, runtime_only_types
from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.scheduling import AGENT, TOOL_WRITER, AgentHalted, TurnBudgets
from contextfold.server.writers import is_runtime_type
from contextfold.wire import ModelOutput, NeutralRequest, ToolCall, Usage
from tests.runtime.helpers import STREAM, user

BIG = 100_000  # input tokens over half the default window: the answer is compacted


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_every_event_the_runtime_appends_is_declared_runtime_only(
    journal: Journal,
) -> None:
    calls = 0

    async def model(request: NeutralRequest) -> ModelOutput:
        nonlocal calls
        calls += 1
        if request.messages[-1].content == COMPACTION_INSTRUCTION:
            return ModelOutput(
                text="SUMMARY: adding numbers.", usage=Usage(input_tokens=900, output_tokens=20)
            )
        if calls == 1:  # interrupted while it runs
            await journal.append(STREAM, user("stop, add 2 and 3", "interrupt"))
            await asyncio.Event().wait()
        call = ToolCall(id=f"c{calls}", name="add", arguments='{"a": 2, "b": 3}')
        # One answer over the threshold: a compaction that works (every answer over it
        # would stop the loop after two attempts, before the turn budget halts it).
        return ModelOutput(
            tool_calls=(call,),
            usage=Usage(input_tokens=BIG if calls == 2 else 500, output_tokens=10),
            finish_reason="tool_calls",
        )

    await journal.append(STREAM, system_prompt("You add numbers."))
    await journal.append(STREAM, user("add 1 and 1"))
    agent = Agent(journal, STREAM, FunctionModel(model), tools=[add], budgets=TurnBudgets(user=3))
    report = await asyncio.wait_for(agent.run_until_idle(), 30)
    assert report.status == "stopped" and report.interrupted and report.compactions

    written = {
        stored.type
        async for stored in journal.read_all(STREAM)
        if stored.meta.actor in (AGENT, TOOL_WRITER)
    }
    runtime_events: set[type[Event]] = {
        LlmRequestRequested,
        RequestRecorded,
        LlmRequestInterrupted,
        LlmResponse,
        ToolCallStarted,
        ToolCallResult,
        AgentHalted,
    }
    # The session reached every kind of runtime write (the items are context-added).
    assert written == {cls.event_type for cls in runtime_events} | {ContextAdded.event_type}
    own = written - {ContextAdded.event_type}
    assert own <= runtime_only_types()
    assert all(is_runtime_type(name) for name in own)
