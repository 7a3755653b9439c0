"""An agent's arguments are its settings: checked when it is made, read by every step (a
change shows in the next request's header, which rebuilds), and nothing else on the agent
can be set by mistake."""

from __future__ import annotations

import pytest

import contextfold as cf
from contextfold.context.rebuild import verify_requests
from contextfold.journal import Journal
from contextfold.runtime.loop import Agent, system_prompt
from tests.runtime.helpers import STREAM, events_of, lookup, lookup_then_answer


async def _turn(journal: Journal, agent: Agent, text: str) -> cf.RunReport:
    await journal.append(STREAM, cf.ContextAdded(role="user", content=text))
    return await agent.run_until_idle()


async def test_a_changed_setting_is_in_the_next_request_s_header(journal: Journal) -> None:
    await journal.append(STREAM, system_prompt("You read files."))
    sent: list[cf.NeutralRequest] = []

    def model(request: cf.NeutralRequest) -> cf.ModelOutput | str:
        sent.append(request)
        return lookup_then_answer(request)

    agent = Agent(journal, STREAM, cf.FunctionModel(model), tools=[lookup], temperature=0.2)
    await _turn(journal, agent, "read a.py")
    agent.settings.temperature = 0.7
    agent.settings.max_tokens = 300
    await _turn(journal, agent, "read b.py")
    requests = await events_of(journal, STREAM, cf.LlmRequestRequested)
    logged = [event.header for _, event in requests if event.header is not None]
    # Logged with the first request, then again only when the settings changed.
    assert [(h.temperature, h.max_tokens) for h in logged] == [(0.2, 1024), (0.7, 300)]
    assert [r.temperature for r in sent] == [0.2, 0.2, 0.7, 0.7]
    assert await verify_requests(journal, STREAM) == ()


def test_an_attribute_the_agent_does_not_have_cannot_be_set(journal: Journal) -> None:
    agent = Agent(journal, STREAM, cf.FunctionModel(lambda request: "ok"))
    with pytest.raises(AttributeError):
        agent.materialize_every = 10  # type: ignore[attr-defined]
    agent.settings.materialize_every = 10
    assert agent.settings.materialize_every == 10
    assert agent.model is agent.settings.model and agent.status == "idle"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"content_limit": 0}, "content_limit"),
        ({"context_window": -5}, "context_window"),
        ({"on_interrupted_tool": "retry"}, "on_interrupted_tool"),
    ],
)
def test_a_wrong_setting_is_refused_naming_it(
    journal: Journal, options: dict[str, object], named: str
) -> None:
    with pytest.raises(cf.InvalidInputError, match=named):
        Agent(journal, STREAM, cf.FunctionModel(lambda request: "ok"), **options)  # type: ignore[arg-type]
