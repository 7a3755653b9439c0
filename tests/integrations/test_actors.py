"""Every integration marks untrusted content through one check: the same refusals (a
trusted type, a malformed type, an id no journal can store) with the same words, one
metadata key, and stored markings read back as actors or refused naming where they are."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from langchain_core.messages import SystemMessage
from pydantic_ai.messages import SystemPromptPart

import contextfold as cf
from contextfold.integrations import langgraph, pydantic_ai
from contextfold.integrations._actors import ACTOR_KEY, marked_actor, untrusted_actor
from contextfold.integrations.openai_agents import JournalSession

_BAD: list[tuple[str, str | None, str]] = [
    ("agent", None, "actor type 'agent' is trusted; mark external content with its source"),
    ("Not A Token", None, "lowercase token"),
    ("email", "\ud800", "id must be a str of valid Unicode"),
]


async def _openai(actor: str, id: str | None) -> Any:
    async with cf.open_journal("memory://") as journal:
        session = JournalSession(journal, "actors")
        try:
            return await session.add_untrusted("hi", actor=actor, id=id)
        except cf.InvalidInputError:
            assert await journal.version(session.stream) == 0  # nothing was written
            raise


def _sync(call: Callable[[str, str | None], Any]) -> Callable[[str, str | None], Awaitable[Any]]:
    async def run(actor: str, id: str | None) -> Any:
        return call(actor, id)

    return run


MARKERS: dict[str, Callable[[str, str | None], Awaitable[Any]]] = {
    "langgraph": _sync(lambda a, i: langgraph.untrusted(SystemMessage("x"), actor=a, id=i)),
    "pydantic-ai": _sync(lambda a, i: pydantic_ai.untrusted(SystemPromptPart("x"), actor=a, id=i)),
    "pydantic-ai prompt": _sync(lambda a, i: pydantic_ai.untrusted_prompt("x", actor=a, id=i)),
    "openai-agents": _openai,
}


@pytest.mark.parametrize("marker", sorted(MARKERS))
@pytest.mark.parametrize(("actor", "id", "message"), _BAD)
async def test_each_integration_refuses_the_same_actors_in_the_same_words(
    marker: str, actor: str, id: str | None, message: str
) -> None:
    with pytest.raises(cf.InvalidInputError, match=message):
        await MARKERS[marker](actor, id)


@pytest.mark.parametrize("marker", sorted(MARKERS))
async def test_each_integration_accepts_an_untrusted_source(marker: str) -> None:
    assert await MARKERS[marker]("slack", "U42") is not None


def test_one_key_holds_the_marking_in_every_framework() -> None:
    assert langgraph.ACTOR_KEY == pydantic_ai.ACTOR_KEY == ACTOR_KEY
    message = langgraph.untrusted(SystemMessage("x"), actor="webhook", id="h")
    part = pydantic_ai.untrusted(SystemPromptPart("x"), actor="webhook", id="h")
    assert message.additional_kwargs[ACTOR_KEY] == part.metadata[ACTOR_KEY]  # type: ignore[index]


def test_the_actor_names_its_origin_and_refuses_with_the_caller_named() -> None:
    actor = untrusted_actor("email", "eve@example.com", origin="inbox", what="w()")
    assert actor == cf.Actor(type="email", id="eve@example.com", origin="inbox")
    with pytest.raises(cf.InvalidInputError, match=r"^w\(\): id must be"):
        untrusted_actor("email", 7, what="w()")


def test_a_stored_marking_is_read_as_an_actor_or_refused_naming_where_it_is() -> None:
    assert marked_actor({"type": "slack"}, where="here", how="mark it") == cf.Actor(type="slack")
    with pytest.raises(cf.InvalidInputError, match=r"^here is not an actor \(.*\): mark it$"):
        marked_actor("slack", where="here", how="mark it")
