"""Benchmark: what contextfold's middleware adds to a LangChain v1 agent's model call.

One ``create_agent`` agent with an instant scripted model (a tool call, then an answer,
per user message) holds a conversation of ``--turns`` turns, once without middleware and
once with ``ContextMiddleware`` (budget, and recording on a SQLite journal), in the same
run. Claim:

  langchain_middleware_overhead  seconds per model call with the middleware against the
                                 agent alone, both with an instant model (<= 1.2)

A real model call takes 300 ms to 30 s; the instant model makes the framework's own work
the whole of the baseline, so this is the worst case.

Run: .venv/bin/python benchmarks/langchain_middleware.py [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

import contextfold as cf
from contextfold.integrations.langchain import ContextMiddleware

TARGET = 1.2


@tool
def read_file(path: str) -> str:
    """Read a file of the workspace."""
    return f"{path}: " + "x" * 2_000


class Instant(BaseChatModel):
    """A tool call per user message, then an answer; costs nothing."""

    @property
    def _llm_type(self) -> str:
        return "instant"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Instant:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            message = AIMessage(content="done")
        else:
            call = {"name": "read_file", "args": {"path": "a.py"}, "id": f"c{len(messages)}"}
            message = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=message)])


async def conversation(agent: Any, turns: int) -> float:
    """Seconds per model call over ``turns`` turns (two model calls each)."""
    state: dict[str, Any] = {"messages": []}
    start = time.perf_counter()
    for n in range(turns):
        messages = [*state["messages"], ("user", f"read file {n}")]
        state = await agent.ainvoke({"messages": messages})
    return (time.perf_counter() - start) / (2 * turns)


async def main(turns: int) -> int:
    alone: list[float] = []
    wrapped: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with cf.open_journal(f"sqlite:///{Path(tmp) / 'agent.db'}") as journal:
            for round_ in range(3):  # interleaved: the machine's noise hits both sides
                plain = create_agent(Instant(), tools=[read_file])
                alone.append(await conversation(plain, turns))
                middleware = ContextMiddleware(
                    budget=8_000, journal=journal, stream=f"chat/{round_}"
                )
                with_it = create_agent(Instant(), tools=[read_file], middleware=[middleware])
                wrapped.append(await conversation(with_it, turns))
    base, ours = statistics.median(alone), statistics.median(wrapped)
    print(
        f"per model call: agent alone {base * 1e3:.2f} ms, with the middleware {ours * 1e3:.2f} ms"
    )
    ratio = ours / base
    print(f"RATIO langchain_middleware_overhead {ratio:.2f} target <= {TARGET}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    sys.exit(asyncio.run(main(parser.parse_args().turns)))
