"""An instant model (its answer ready when the call starts) is not watched for interrupts:
the request is answered without a look-up of it or a tail; a model still answering is
watched, and an interrupt still ends its request (see test_scheduling)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from contextfold.context.events import LlmRequestRequested
from contextfold.events import Event
from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.wire import NeutralRequest
from tests.runtime.helpers import STREAM, user


def _spy(journal: Journal) -> tuple[list[str | None], list[tuple[str, ...]]]:
    tails: list[str | None] = []
    looked_up: list[tuple[str, ...]] = []
    subscribe, latest = journal.subscribe, journal.latest

    def spy_subscribe(stream: str, **kwargs: Any) -> Any:
        tails.append(kwargs.get("after"))
        return subscribe(stream, **kwargs)

    async def spy_latest(stream: str, types: Sequence[str | type[Event]], **kwargs: Any) -> Any:
        looked_up.append(tuple(t if isinstance(t, str) else t.event_type for t in types))
        return await latest(stream, types, **kwargs)

    journal.subscribe = spy_subscribe  # type: ignore[method-assign]
    journal.latest = spy_latest  # type: ignore[method-assign]
    return tails, looked_up


async def test_an_instant_answer_is_not_watched(journal: Journal) -> None:
    await journal.append(STREAM, system_prompt("You are a test agent."))
    await journal.append(STREAM, user("hello?"))
    tails, looked_up = _spy(journal)
    report = await Agent(journal, STREAM, FunctionModel(lambda request: "hi")).run_until_idle()
    assert len(report.requests) == 1 and report.status == "idle"
    assert tails == []
    assert (LlmRequestRequested.event_type,) not in looked_up


async def test_a_model_still_answering_is_watched_from_its_request(journal: Journal) -> None:
    await journal.append(STREAM, system_prompt("You are a test agent."))
    await journal.append(STREAM, user("hello?"))
    tails, _ = _spy(journal)

    async def slow(request: NeutralRequest) -> str:
        for _ in range(1000):  # until the watcher tails
            if tails:
                break
            await asyncio.sleep(0)
        return "hi"

    report = await Agent(journal, STREAM, FunctionModel(slow)).run_until_idle()
    [request] = report.requests
    [stored] = await journal.latest(STREAM, [LlmRequestRequested])
    assert stored.position == request
    assert tails == [stored.cursor]
