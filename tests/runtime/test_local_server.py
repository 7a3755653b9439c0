"""OpenAI-compatible local servers (vLLM, Ollama) take no API key: a base URL is enough,
for the model clients and for the demo."""

from __future__ import annotations

import pytest

from contextfold import Agent, ContextAdded, Journal, LlmResponse, OpenAIChatModel, system_prompt
from contextfold.demo import pick_model
from contextfold.runtime.clients import LOCAL_SERVER_KEY
from tests.runtime.helpers import loopback, openai_text_stream

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
