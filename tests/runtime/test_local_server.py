"""OpenAI-compatible local servers (vLLM, Ollama, llama.cpp) take no API key: a base URL is
enough, for the model clients and for the demo; and they get trusted context as ``system``,
since only OpenAI's own API is known to take the ``developer`` role."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

import contextfold as cf
from contextfold import (
    Agent,
    ContextAdded,
    Journal,
    LlmResponse,
    OpenAIChatModel,
    OpenAIResponsesModel,
    system_prompt,
)
from contextfold.context.compaction import COMPACTION_INSTRUCTION
from contextfold.context.rebuild import rebuild_state
from contextfold.demo import pick_model
from contextfold.runtime.clients import LOCAL_SERVER_KEY, developer_role_of
from tests.runtime.helpers import loopback, openai_responses_text_stream, openai_text_stream

STREAM = "local"


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)


async def test_a_base_url_without_a_key_reaches_the_server(journal: Journal) -> None:
    with loopback([openai_text_stream(["local ", "answer"])]) as server:
        model = OpenAIChatModel("llama3", base_url=server.base_url + "/v1")
        try:
            assert model.client.api_key == LOCAL_SERVER_KEY
            await journal.append(STREAM, system_prompt("Agent."))
            await journal.append(STREAM, ContextAdded(role="user", content="hi"))
            await Agent(journal, STREAM, model, stream_responses=True).run_until_idle()
        finally:
            await model.client.close()
        assert [received.path for received in server.received] == ["/v1/chat/completions"]
    latest = await journal.latest(STREAM, [LlmResponse])
    response = latest[0].decode()
    assert isinstance(response, LlmResponse) and response.text == "local answer"


async def test_the_base_url_from_the_environment_needs_no_key_either(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    model, described = pick_model()
    assert isinstance(model, OpenAIChatModel) and described.startswith("OpenAI")
    try:
        assert model.client.api_key == LOCAL_SERVER_KEY
        assert str(model.client.base_url) == "http://127.0.0.1:1/v1/"
    finally:
        await model.client.close()


async def test_a_key_that_is_set_is_used() -> None:
    model = OpenAIChatModel("gpt", base_url="http://127.0.0.1:1/v1", api_key="sk-real")
    try:
        assert model.client.api_key == "sk-real"
    finally:
        await model.client.close()


# -- the developer role: native only on OpenAI's own API unless a caller confirms it ---------

RULE = "Answer in French."


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages (Chat) or input items (Responses) of a request body."""
    found: list[dict[str, Any]] = body["messages"] if "messages" in body else body["input"]
    return found


def _role_of(body: dict[str, Any], text: str) -> str:
    """The wire role of the one message holding ``text``."""
    [role] = [m["role"] for m in _messages(body) if text in json.dumps(m)]
    return str(role)


def _roles(body: dict[str, Any]) -> set[str]:
    return {str(m["role"]) for m in _messages(body) if "role" in m}


def _client(transport: str, base_url: str, developer_role: bool | None) -> Any:
    cls = OpenAIChatModel if transport == "openai-chat" else OpenAIResponsesModel
    return cls("llama3", base_url=base_url + "/v1", developer_role=developer_role)


def _reply(transport: str, text: str, usage: tuple[int, int] = (80, 12)) -> Any:
    if transport == "openai-chat":
        return openai_text_stream([text], usage=usage)
    return openai_responses_text_stream([text], usage=usage)


@pytest.mark.parametrize("transport", ["openai-chat", "openai-responses"])
@pytest.mark.parametrize(("confirmed", "role"), [(None, "system"), (True, "developer")])
async def test_a_server_not_openais_own_gets_trusted_context_as_system_unless_confirmed(
    journal: Journal, transport: str, confirmed: bool | None, role: str
) -> None:
    with loopback([_reply(transport, "oui")]) as server:
        model = _client(transport, server.base_url, confirmed)
        try:
            await journal.append(STREAM, system_prompt("Agent."))
            await journal.append(STREAM, ContextAdded(role="developer", content=RULE))
            await journal.append(STREAM, ContextAdded(role="user", content="hi"))
            agent = Agent(journal, STREAM, model, stream_responses=True)
            [offset] = (await agent.run_until_idle()).requests
        finally:
            await model.client.close()
    [received] = server.received
    assert _role_of(received.body, RULE) == role
    assert ("developer" in _roles(received.body)) is (confirmed is True)
    # The choice is in the request's header: a rebuild, which no client takes part in,
    # gives the bytes the server got.
    state = await rebuild_state(journal, STREAM, offset)
    assert state.header is not None and state.header.developer_role is (confirmed is True)
    assert (await cf.rebuild_request(journal, STREAM, offset)).body == received.raw
    assert await cf.verify_requests(journal, STREAM) == ()


async def test_a_compaction_on_such_a_server_sends_no_developer_message(journal: Journal) -> None:
    """The summary instruction (and every trusted item) goes out as roles the server knows."""
    big = (100_000, 10)  # over half of the context window: the answer's report compacts
    replies = [_reply("openai-chat", "noted", big), _reply("openai-chat", "SUMMARY")]
    with loopback(replies) as server:
        model = _client("openai-chat", server.base_url, None)
        try:
            await journal.append(STREAM, system_prompt("Agent."))
            await journal.append(STREAM, ContextAdded(role="developer", content=RULE))
            await journal.append(STREAM, ContextAdded(role="user", content="hi"))
            agent = Agent(journal, STREAM, model, stream_responses=True, compaction_threshold=0.5)
            report = await agent.run_until_idle()
        finally:
            await model.client.close()
    assert len(report.compactions) == 1
    request, summary = server.received
    assert summary.body["messages"][:-1] == request.body["messages"]  # the exact request
    assert summary.body["messages"][-1] == {"role": "user", "content": COMPACTION_INSTRUCTION}
    assert "developer" not in _roles(request.body) | _roles(summary.body)
    assert await cf.verify_requests(journal, STREAM) == ()


async def test_openais_own_api_keeps_the_transports_default() -> None:
    """Requests to OpenAI record no developer_role, as before the setting existed, so
    their headers (and streams recorded then) are unchanged; False opts out there too."""
    given = openai.AsyncOpenAI(api_key="k")
    try:
        assert OpenAIChatModel("gpt-4.1", client=given).developer_role is None
        assert OpenAIResponsesModel("gpt-4.1", client=given).developer_role is None
        own = OpenAIChatModel("gpt-4.1", client=given, developer_role=False)
        assert own.developer_role is False
    finally:
        await given.close()
    away = OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1", developer_role=True)
    assert away.developer_role is True
    await away.client.close()
    with pytest.raises(cf.ConfigurationError, match="developer_role must be True, False or None"):
        OpenAIChatModel("m", client=given, developer_role="yes")  # type: ignore[arg-type]
    odd = cf.FunctionModel(lambda request: "hi", developer_role="no")  # type: ignore[arg-type]
    with pytest.raises(cf.ConfigurationError, match=r"FunctionModel\.developer_role must be"):
        developer_role_of(odd)


async def test_the_base_url_from_the_environment_is_not_openais_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    model, _ = pick_model()
    assert isinstance(model, OpenAIChatModel)
    try:
        assert model.developer_role is False
    finally:
        await model.client.close()
