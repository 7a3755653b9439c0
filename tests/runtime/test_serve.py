"""``Agent.serve``: a long-running agent answers items appended while it waits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import pytest

import contextfold as cf


async def test_serve_answers_items_appended_while_it_waits() -> None:
    journal = cf.open_journal("memory://")
    answered: list[str] = []

    def model(request: cf.NeutralRequest) -> str:
        # The newest user item (the last message is the request's timestamp tail). A question
        # may land while the previous request is in flight, so it can precede that answer.
        users = [m for m in request.messages[:-1] if m.role == "user"]
        answered.append(users[-1].content.splitlines()[-1])
        return f"answer {len(answered)}"

    agent = cf.Agent(journal, "s", cf.FunctionModel(model))
    await journal.append("s", cf.system_prompt("Be brief."))
    task = asyncio.create_task(agent.serve(poll_interval=0.01))
    try:
        for question in ("first?", "second?", "third?"):
            await journal.append("s", cf.ContextAdded(role="user", content=question))
            for _ in range(3000):  # up to 30 s: CI machines can be slow
                if question in answered:
                    break
                await asyncio.sleep(0.01)
        assert answered == ["first?", "second?", "third?"]
        # The model has answered; the agent appends that answer just after, so wait for it.
        for _ in range(3000):
            state = await journal.fold(cf.AgentContext, "s")
            answers = [i.content for i in state.history if i.role == "assistant"]
            if len(answers) == 3:
                break
            await asyncio.sleep(0.01)
        assert answers == ["answer 1", "answer 2", "answer 3"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await journal.close()


async def test_serve_survives_provider_errors_and_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A provider error does not end ``serve``: it logs, waits, retries the unanswered
    request, and goes on answering."""
    journal = cf.open_journal("memory://")
    calls = 0

    def model(request: cf.NeutralRequest) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            time.sleep(0.03)  # a slow machine's hiccup: the pauses are checked, not clocks
        if calls <= 2:
            raise RuntimeError("HTTP 529 overloaded")
        return f"answer {calls}"

    agent = cf.Agent(journal, "s", cf.FunctionModel(model))
    await journal.append("s", cf.system_prompt("Be brief."))
    task = asyncio.create_task(agent.serve(poll_interval=0.01))
    try:
        with caplog.at_level(logging.WARNING, logger="contextfold.runtime"):
            await journal.append("s", cf.ContextAdded(role="user", content="hi"))
            for _ in range(3000):
                state = await journal.fold(cf.AgentContext, "s")
                if any(i.role == "assistant" for i in state.history) or task.done():
                    break
                await asyncio.sleep(0.01)
        assert not task.done()
        assert calls == 3
        logged = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
        assert [m.rsplit(" ", 1)[-1] for m in logged] == ["0.02s", "0.04s"]  # growing pauses
        await journal.append("s", cf.ContextAdded(role="user", content="again?"))
        for _ in range(3000):
            if calls == 4:
                break
            await asyncio.sleep(0.01)
        assert calls == 4 and not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await journal.close()


def test_agent_takes_no_actor() -> None:
    """The runtime always appends as ``agent``: an ``actor`` argument would do nothing."""
    with pytest.raises(TypeError):
        cf.Agent(
            cf.open_journal("memory://"),
            "s",
            cf.FunctionModel(lambda r: "ok"),
            actor=cf.Actor(type="user"),  # type: ignore[call-arg]
        )


async def test_a_model_call_cancelled_from_inside_is_a_provider_error() -> None:
    """A model (an SDK, a user's function) that raises CancelledError although nobody
    cancelled the agent failed like a provider: ``serve`` retries, it does not end as if
    it had been cancelled."""
    journal = cf.open_journal("memory://")
    calls = 0

    async def model(request: cf.NeutralRequest) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            gone: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            gone.cancel()  # e.g. a shared connection another caller closed
            return await gone
        return "answer"

    agent = cf.Agent(journal, "s", cf.FunctionModel(model))
    await journal.append("s", cf.system_prompt("Be brief."))
    await journal.append("s", cf.ContextAdded(role="user", content="hi"))
    task = asyncio.create_task(agent.serve(poll_interval=0.01))
    try:
        for _ in range(3000):
            state = await journal.fold(cf.AgentContext, "s")
            if any(i.role == "assistant" for i in state.history) or task.done():
                break
            await asyncio.sleep(0.01)
        assert not task.done() and calls == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await journal.close()


@pytest.mark.parametrize(
    ("method", "at"),
    # A step reads its two folds as of one head look (Journal._fold_at each).
    [("_fold_at", 1), ("_fold_at", 2), ("latest", 1)],
    ids=["a step's fold", "its second fold", "the request's manifest look-up"],
)
async def test_a_cancel_a_library_swallowed_stops_the_agent_before_the_model_call(
    method: str, at: int
) -> None:
    """On Python 3.11 a driver's ``wait_for`` can swallow a cancel that lands as its query
    completes (the task still counts it): the agent must not go on to call the model."""
    journal = cf.open_journal("memory://")
    read = getattr(journal, method)
    in_fold, swallow = asyncio.Event(), asyncio.Event()
    folds = 0

    async def swallowing(*args: Any, **options: Any) -> Any:
        nonlocal folds
        folds += swallow.is_set()
        if folds == at and not in_fold.is_set():
            in_fold.set()
            # What wait_for does when the query's result was ready: the cancel is dropped.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(60)
        return await read(*args, **options)

    setattr(journal, method, swallowing)
    called: list[cf.NeutralRequest] = []

    def model(request: cf.NeutralRequest) -> str:
        called.append(request)
        return "answer"

    agent = cf.Agent(journal, "s", cf.FunctionModel(model))
    try:
        await journal.append("s", cf.system_prompt("Be brief."))
        await journal.append("s", cf.ContextAdded(role="user", content="hi"))
        swallow.set()
        task = asyncio.create_task(agent.run_until_idle())
        await asyncio.wait_for(in_fold.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        assert called == []
    finally:
        await journal.close()
