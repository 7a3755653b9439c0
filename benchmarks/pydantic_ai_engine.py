"""Benchmark: what contextfold's ContextModel adds to a pydantic-ai agent's model call.

One ``Agent`` with an instant ``FunctionModel`` (a tool call, then an answer, per user
message) holds a conversation of ``--turns`` turns, once on the model alone and once
through ``ContextModel`` (a budget, and every call recorded on a SQLite journal), in the
same run. Claim:

  pydantic_ai_engine_overhead  seconds per model call through ContextModel against the
                               agent alone, both with an instant model (<= 1.2)

A real model call takes 300 ms to 30 s; the instant model makes the framework's own work
the whole of the baseline, so this is the worst case.

Run: .venv/bin/python benchmarks/pydantic_ai_engine.py [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

import contextfold as cf
from contextfold.integrations.pydantic_ai import ContextModel

TARGET = 1.2


def read_file(path: str) -> str:
    """Read a file of the workspace."""
    return f"{path}: " + "x" * 2_000


def instant(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A tool call per user message, then an answer; costs nothing."""
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in last.parts):
        return ModelResponse(parts=[TextPart("done")])
    return ModelResponse(parts=[ToolCallPart("read_file", {"path": "a.py"}, f"c{len(messages)}")])


def agent_on(model: Model) -> Agent[None, str]:
    return Agent(model, system_prompt="You read files.", tools=[read_file])


async def conversation(agent: Agent[None, str], turns: int) -> float:
    """Seconds per model call over ``turns`` turns (two model calls each)."""
    history: list[ModelMessage] = []
    start = time.perf_counter()
    for n in range(turns):
        history = (await agent.run(f"read file {n}", message_history=history)).all_messages()
    return (time.perf_counter() - start) / (2 * turns)


async def main(turns: int) -> int:
    alone: list[float] = []
    wrapped: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with cf.open_journal(f"sqlite:///{Path(tmp) / 'agent.db'}") as journal:
            # One-time costs (pydantic's schemas built on first use) are no call's overhead.
            await conversation(agent_on(ContextModel(FunctionModel(instant), journal, "warm")), 2)
            for round_ in range(3):  # interleaved: the machine's noise hits both sides
                alone.append(await conversation(agent_on(FunctionModel(instant)), turns))
                model = ContextModel(
                    FunctionModel(instant), journal, f"chat/{round_}", budget=8_000
                )
                wrapped.append(await conversation(agent_on(model), turns))
    base, ours = statistics.median(alone), statistics.median(wrapped)
    print(
        f"per model call: agent alone {base * 1e3:.2f} ms, through ContextModel {ours * 1e3:.2f} ms"
    )
    ratio = ours / base
    print(f"RATIO pydantic_ai_engine_overhead {ratio:.2f} target <= {TARGET}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    sys.exit(asyncio.run(main(parser.parse_args().turns)))
