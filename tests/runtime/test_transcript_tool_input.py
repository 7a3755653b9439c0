"""Tool parts of the runtime transcript carry the call's parsed arguments in every state:
pending, running, completed, error (the tool failed, its arguments were refused, or the
agent was cancelled while it ran)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.transcript import TranscriptObserver
from contextfold.transcript import (
    Part,
    StreamEvent,
    ToolStateChanged,
    TranscriptBus,
    TranscriptWriter,
    read_history,
)
from contextfold.transcript.parts import Message, ToolPart
from contextfold.transcript.store.base import TranscriptStore
from contextfold.wire import ModelOutput, NeutralRequest, ToolCall
from tests.runtime.helpers import STREAM, user

SESSION = "session-1"


class Recording(TranscriptWriter):
    """A writer that keeps every tool transition it was given."""

    def __init__(self, store: TranscriptStore) -> None:
        super().__init__(store, TranscriptBus())
        self.moves: list[ToolStateChanged] = []

    async def publish(self, event: StreamEvent) -> Message | Part | None:
        if isinstance(event, ToolStateChanged):
            self.moves.append(event)
        return await super().publish(event)


def _calls(*calls: ToolCall) -> Any:
    def model(request: NeutralRequest) -> ModelOutput:
        if request.messages[-2].role == "tool":
            return ModelOutput(text="done")
        return ModelOutput(text="working", tool_calls=calls)

    return model


async def _tool_parts(store: TranscriptStore) -> dict[str, ToolPart]:
    history = await read_history(store, SESSION)
    return {p.call_id: p for e in history for p in e.parts if isinstance(p, ToolPart)}


def search(query: str, limit: int = 10) -> str:
    """Search the workspace."""
    return f"{limit} hits for {query}"


def broken(path: str) -> str:
    """Always fails."""
    raise OSError(f"cannot read {path}")


async def test_every_state_of_a_tool_part_carries_the_parsed_arguments(
    journal: Journal, store: TranscriptStore
) -> None:
    calls = (
        ToolCall(id="c1", name="search", arguments='{"query": "rates", "limit": 3}'),
        ToolCall(id="c2", name="broken", arguments='{"path": "a.txt"}'),
        ToolCall(id="c3", name="search", arguments='{"limit": "many"}'),  # refused: no query
        ToolCall(id="c4", name="search", arguments=""),  # no arguments: refused too
    )
    expected = {
        "c1": {"query": "rates", "limit": 3},
        "c2": {"path": "a.txt"},
        "c3": {"limit": "many"},
        "c4": {},
    }
    writer = Recording(store)
    rows = TranscriptObserver(writer, SESSION, clock=lambda: "2026-01-01T00:00:00+00:00")
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("search"))
    model = FunctionModel(_calls(*calls))
    agent = Agent(journal, STREAM, model, tools=[search, broken], observer=rows)
    await agent.run_until_idle()

    states = {(m.call_id, m.state) for m in writer.moves}
    assert {("c1", "running"), ("c1", "completed"), ("c2", "error"), ("c3", "error")} <= states
    assert all(move.input == expected[move.call_id] for move in writer.moves)
    parts = await _tool_parts(store)
    assert {call_id: dict(part.input) for call_id, part in parts.items()} == expected
    assert [parts[c].state for c in ("c1", "c2", "c3", "c4")] == [
        "completed",
        "error",
        "error",
        "error",
    ]


async def test_a_tool_part_cancelled_while_it_runs_keeps_its_arguments(
    journal: Journal, store: TranscriptStore
) -> None:
    running = asyncio.Event()

    async def wait(seconds: int) -> str:
        """Waits."""
        running.set()
        await asyncio.sleep(seconds)
        return "waited"

    calls = tuple(
        ToolCall(id=f"c{n}", name="wait", arguments=f'{{"seconds": {60 * n}}}') for n in (1, 2)
    )
    writer = Recording(store)
    rows = TranscriptObserver(writer, SESSION, clock=lambda: "2026-01-01T00:00:00+00:00")
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("wait twice"))
    agent = Agent(journal, STREAM, FunctionModel(_calls(*calls)), tools=[wait], observer=rows)
    task = asyncio.create_task(agent.run_until_idle())
    await asyncio.wait_for(running.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    finals = [m for m in writer.moves if m.state == "error"]
    assert {m.call_id for m in finals} == {"c1", "c2"}
    assert all(move.input == {"seconds": 60 * int(move.call_id[1:])} for move in writer.moves)
    parts = await _tool_parts(store)
    assert {c: (p.state, dict(p.input)) for c, p in parts.items()} == {
        "c1": ("error", {"seconds": 60}),
        "c2": ("error", {"seconds": 120}),
    }
