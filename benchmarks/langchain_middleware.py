"""Benchmark: what contextfold's middleware adds to a LangChain v1 agent's model call.

One ``create_agent`` agent with an instant scripted model (a tool call, then an answer,
per user message) holds a conversation of ``--turns`` turns, without middleware and with
``ContextMiddleware`` (budget, and recording every call and answer on a SQLite journal),
interleaved over ``--rounds`` rounds of one run. Claim:

  langchain_middleware_overhead  seconds per model call with the middleware against the
                                 agent alone, both with an instant model (<= 1.2)

A real model call takes 300 ms to 30 s; the instant model makes the framework's own work
the whole of the baseline, so this is the worst case. Two floors are printed beside it,
measured in the same rounds: a middleware that only passes the call through (what
LangChain's own wrap_model_call machinery costs), and one that only appends one small
record before the call and one after it to the same journal (what recording a request and
its answer, each in its own durable append, costs at the least). The ratio is of wall-clock
medians; CPU times (less disturbed by other work on the machine) are printed too.

Run: .venv/bin/python benchmarks/langchain_middleware.py [--turns N] [--rounds N]
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
from langchain.agents.middleware import AgentMiddleware
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


class Mark(cf.Event, type="benchmark/langchain-call-mark"):
    """A minimal record of a call (what the appends-only floor writes)."""

    n: int


class PassThrough(AgentMiddleware):
    """A middleware that only hands the call on."""

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        return await handler(request)


class AppendsOnly(AgentMiddleware):
    """A middleware that appends one record before the call and one after it."""

    def __init__(self, journal: cf.Journal, stream: str) -> None:
        super().__init__()
        self.journal, self.stream = journal, stream

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        await self.journal.append(self.stream, [Mark(n=len(request.messages))])
        response = await handler(request)
        await self.journal.append(self.stream, [Mark(n=0)])
        return response


async def conversation(agent: Any, turns: int) -> tuple[float, float]:
    """Seconds per model call over ``turns`` turns (two model calls each): wall clock, and
    the process's CPU time (every thread's: the store's included)."""
    state: dict[str, Any] = {"messages": []}
    start, cpu = time.perf_counter(), time.process_time()
    for n in range(turns):
        messages = [*state["messages"], ("user", f"read file {n}")]
        state = await agent.ainvoke({"messages": messages})
    calls = 2 * turns
    return (time.perf_counter() - start) / calls, (time.process_time() - cpu) / calls


async def main(turns: int, rounds: int) -> int:
    sides: dict[str, list[tuple[float, float]]] = {
        "alone": [],
        "pass": [],
        "appends": [],
        "context": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        async with cf.open_journal(f"sqlite:///{Path(tmp) / 'agent.db'}") as journal:
            for round_ in range(rounds):  # interleaved: the machine's noise hits every side
                middleware: dict[str, list[Any]] = {
                    "alone": [],
                    "pass": [PassThrough()],
                    "appends": [AppendsOnly(journal, f"marks/{round_}")],
                    "context": [
                        ContextMiddleware(budget=8_000, journal=journal, stream=f"chat/{round_}")
                    ],
                }
                for name, used in middleware.items():
                    agent = create_agent(Instant(), tools=[read_file], middleware=used)
                    sides[name].append(await conversation(agent, turns))
    for clock, label in ((1, "CPU time"), (0, "wall clock")):
        ms = {
            name: statistics.median(t[clock] for t in times) * 1e3 for name, times in sides.items()
        }
        print(
            f"per model call ({label}): agent alone {ms['alone']:.2f} ms; a pass-through "
            f"middleware {ms['pass']:.2f} ms ({ms['pass'] / ms['alone']:.2f}x); appending a "
            f"record before and after each call {ms['appends']:.2f} ms "
            f"({ms['appends'] / ms['alone']:.2f}x); ContextMiddleware {ms['context']:.2f} ms "
            f"({ms['context'] / ms['alone']:.2f}x)"
        )
    ratio = statistics.median(t[0] for t in sides["context"]) / statistics.median(
        t[0] for t in sides["alone"]
    )
    print(f"RATIO langchain_middleware_overhead {ratio:.2f} target <= {TARGET}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.turns, args.rounds)))
