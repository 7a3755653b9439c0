"""Benchmark: what contextfold's ContextPlugin adds to an ADK agent's model call.

One ``LlmAgent`` with an instant model (a function call, then an answer, per user message)
holds a conversation of ``--turns`` turns under a ``Runner`` on ADK's in-memory sessions,
once alone and once with ``ContextPlugin`` (a budget, and every call recorded on a SQLite
journal), in the same run. Claim:

  adk_engine_overhead  seconds per model call with the plugin against the agent alone,
                       both with an instant model (<= 1.2)

A real model call takes 300 ms to 30 s; the instant model makes the framework's own work
the whole of the baseline, so this is the worst case.

Run: .venv/bin/python benchmarks/adk_engine.py [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path

from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.models import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.genai import types

import contextfold as cf
from contextfold.integrations.adk import ContextPlugin

TARGET = 1.2


def read_file(path: str) -> str:
    """Read a file of the workspace."""
    return f"{path}: " + "x" * 2_000


class Instant(BaseLlm):
    """A function call per user message, then an answer; costs nothing."""

    model: str = "instant"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1].parts or []
        if any(p.function_response for p in last):
            part = types.Part(text="done")
        else:
            call = types.FunctionCall(name="read_file", args={"path": "a.py"})
            part = types.Part(function_call=call)
        usage = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=len(llm_request.contents), candidates_token_count=1
        )
        yield LlmResponse(content=types.Content(role="model", parts=[part]), usage_metadata=usage)


async def conversation(plugins: list[BasePlugin], turns: int) -> float:
    """Seconds per model call over ``turns`` turns (two model calls each)."""
    agent = LlmAgent(name="reader", model=Instant(), instruction="Read files.", tools=[read_file])
    service = InMemorySessionService()
    runner = Runner(
        app=App(name="bench", root_agent=agent, plugins=plugins), session_service=service
    )
    session = await service.create_session(app_name="bench", user_id="u")
    start = time.perf_counter()
    for n in range(turns):
        message = types.Content(role="user", parts=[types.Part(text=f"read file {n}")])
        async for _ in runner.run_async(user_id="u", session_id=session.id, new_message=message):
            pass
    elapsed = (time.perf_counter() - start) / (2 * turns)
    await runner.close()
    return elapsed


async def main(turns: int) -> int:
    alone: list[float] = []
    wrapped: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with cf.open_journal(f"sqlite:///{Path(tmp) / 'agent.db'}") as journal:
            # One-time costs (schemas built on first use) are no call's overhead.
            await conversation([ContextPlugin(journal, budget=8_000)], 2)
            for _ in range(3):  # interleaved: the machine's noise hits both sides
                alone.append(await conversation([], turns))
                wrapped.append(await conversation([ContextPlugin(journal, budget=8_000)], turns))
    base, ours = statistics.median(alone), statistics.median(wrapped)
    print(f"per model call: agent alone {base * 1e3:.2f} ms, with the plugin {ours * 1e3:.2f} ms")
    ratio = ours / base
    print(f"RATIO adk_engine_overhead {ratio:.2f} target <= {TARGET}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    sys.exit(asyncio.run(main(parser.parse_args().turns)))
