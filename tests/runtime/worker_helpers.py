"""Shared helpers of the worker tests: agent streams, answered checks, waiting on conditions."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from runtime_helpers import user

from contextfold.context.projection import AgentContext
from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.scheduling import Scheduler, TurnBudgets, decide
from contextfold.runtime.worker import Worker

__all__ = ["answered", "echo_app", "eventually", "new_agent_stream", "running"]


async def new_agent_stream(journal: Journal, stream: str, text: str = "hello") -> None:
    await journal.append(stream, system_prompt("You answer."))
    await journal.append(stream, user(text))


async def answered(journal: Journal, stream: str) -> bool:
    """Whether the stream's agent has nothing left to do (every trigger answered)."""
    context = await journal.fold(AgentContext, stream)
    sched = await journal.fold(Scheduler, stream)
    return decide(sched, context, TurnBudgets()).action == "idle"


async def eventually(check: Callable[[], Awaitable[bool]], *, what: str, limit: float = 60) -> None:
    """Wait until ``check()`` holds; fail (naming ``what``) if it does not within ``limit``
    seconds, a bound against a hang, never a timing assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


def echo_app(answer: str = "ok") -> Callable[[Journal, str], Agent]:
    model = FunctionModel(lambda request: answer)

    def app(journal: Journal, stream: str) -> Agent:
        return Agent(journal, stream, model)

    return app


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """The worker running in a task; stopped (gracefully) and awaited at the end."""
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 60)
