"""A request is built once: the one the pressure gate estimated goes out, timed at the
request, unless the context changed between the estimate and the request event (another
writer's item), when it is built again; either way it rebuilds byte for byte."""

from __future__ import annotations

from typing import Any

import pytest

import contextfold as cf
from contextfold import wire
from contextfold.context import request
from contextfold.context.rebuild import verify_requests
from contextfold.journal import Journal
from contextfold.runtime import compacting, instance, turn
from contextfold.runtime.loop import Agent, system_prompt
from tests.runtime.helpers import STREAM, lookup, lookup_then_answer


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the requests the agent builds (every build goes through ``Run.build``)."""
    built: list[int] = []
    original = request.build

    def counting(*args: Any, **options: Any) -> Any:
        built.append(1)
        return original(*args, **options)

    monkeypatch.setattr(instance, "build", counting)
    return built


async def _turns(journal: Journal, agent: Agent, n: int) -> list[int]:
    requests: list[int] = []
    for k in range(n):
        await journal.append(STREAM, cf.ContextAdded(role="user", content=f"read file {k}"))
        report = await agent.run_until_idle()
        requests.extend(report.requests)
    return requests


async def _agent_after_a_turn(journal: Journal) -> Agent:
    """An agent that made its first request (which has no previous: no estimate)."""
    await journal.append(STREAM, system_prompt("You read files."))
    agent = Agent(journal, STREAM, cf.FunctionModel(lookup_then_answer), tools=[lookup])
    await _turns(journal, agent, 1)
    return agent


async def test_a_request_the_gate_estimated_is_built_once(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await _agent_after_a_turn(journal)
    built = _count_builds(monkeypatch)
    requests = await _turns(journal, agent, 4)
    assert len(requests) == 8
    assert len(built) == len(requests)  # was two per request: the estimate, then the send
    assert await verify_requests(journal, STREAM) == ()


async def test_an_item_landing_after_the_estimate_is_in_the_request(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await _agent_after_a_turn(journal)
    gate = compacting.relieve_pressure
    landed: list[int] = []

    async def another_writer_meanwhile(*args: Any) -> Any:
        result = await gate(*args)
        done = await journal.append(STREAM, cf.ContextAdded(role="user", content="also this"))
        landed.append(done.first_position)
        return result

    monkeypatch.setattr(turn, "relieve_pressure", another_writer_meanwhile)
    sent: list[cf.NeutralRequest] = []

    def answer(request: cf.NeutralRequest) -> str:
        sent.append(request)
        return "ok"

    agent.settings.model = cf.FunctionModel(answer)
    await journal.append(STREAM, cf.ContextAdded(role="user", content="one more"))
    await agent.run_until_idle()
    assert landed
    offsets = [m.content.split("\n", 1)[0].split(" ")[0] for m in sent[0].messages]
    assert f"@{landed[0]}" in offsets  # built again: the estimate did not have it
    assert await verify_requests(journal, STREAM) == ()


async def test_a_request_the_gate_estimated_is_rendered_once_and_measured_as_sent(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await _agent_after_a_turn(journal)
    rendered: list[bytes] = []
    original = wire.render_request

    def counting(*args: Any, **options: Any) -> Any:
        made = original(*args, **options)
        rendered.append(made.body)
        return made

    monkeypatch.setattr(instance, "render_request", counting)
    measured: list[int] = []

    def measuring(*args: Any) -> int:
        measured.append(1)
        return 0

    monkeypatch.setattr(compacting, "body_size", measuring)
    sent: list[bytes] = []
    original_complete = agent.model.complete

    async def complete(request: Any, body: Any, **options: Any) -> Any:
        sent.append(body.body)
        return await original_complete(request, body, **options)

    monkeypatch.setattr(agent.model, "complete", complete)
    requests = await _turns(journal, agent, 3)
    assert len(requests) == 6
    # Was two renders per request (the gate measured one body, the send rendered another,
    # retimed) and a measure: now the gate's body, timed at the request event, goes out.
    assert rendered == sent
    assert measured == []
    assert await verify_requests(journal, STREAM) == ()
