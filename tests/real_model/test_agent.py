"""cf.Agent against a real model: llama.cpp's server with SmolLM2-135M-Instruct on loopback,
through each transport's official SDK. What is asserted is structure, never answer text: each
transport answers; the usage, cached tokens included, is recorded as the server reported it;
a compaction runs on the real usage; every request rebuilds with drift 0; no ``developer``
role and no time tail goes to a server that did not ask for them; the window is the server's.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from contextfold import open_journal
from contextfold.context.events import ContextAdded, LlmResponse
from contextfold.context.projection import AgentContext
from contextfold.context.rebuild import rebuild_request, verify_requests
from contextfold.context.request import DATE_PREFIX, TAIL_PREFIX, parse_item_header
from contextfold.journal import Journal
from contextfold.runtime.clients import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.wire import NeutralMessage, NeutralRequest, RenderedRequest, render_request
from tests.llamaserver import LlamaServer
from tests.runtime.helpers import STREAM, events_of, requests_of, user

QUESTIONS = (
    "What is 2 + 3?",
    "Name a colour of the sky.",
    "What is the capital of France?",
    "Say hello in one word.",
    "What is 10 minus 4?",
    "Name a fruit.",
    "How many days are in a week?",
    "Name an animal that can fly.",
)


@pytest.fixture
async def journal() -> AsyncIterator[Journal]:
    async with open_journal("memory://") as opened:
        yield opened


def client_for(transport: str, server: LlamaServer, **options: Any) -> Any:
    if transport == "openai-chat":
        return OpenAIChatModel(server.model, base_url=server.openai_url, **options)
    if transport == "openai-responses":
        return OpenAIResponsesModel(server.model, base_url=server.openai_url, **options)
    return AnthropicModel(server.model, base_url=server.url, api_key="no-key", **options)


async def converse(agent: Agent, journal: Journal, questions: tuple[str, ...]) -> None:
    await journal.append(STREAM, system_prompt("You are a helpful assistant. Answer briefly."))
    for question in questions:
        await journal.append(STREAM, user(question))
        report = await agent.run_until_idle()
        assert report.status == "idle", report.reason


async def chat(
    server: LlamaServer, journal: Journal, questions: tuple[str, ...], **options: Any
) -> Agent:
    """The agent of a Chat Completions conversation of ``questions`` (at temperature 0), held."""
    model = client_for("openai-chat", server)
    agent = Agent(journal, STREAM, model, temperature=0.0, **options)
    try:
        await converse(agent, journal, questions)
    finally:
        await model.client.close()
    return agent


async def responses(journal: Journal) -> list[LlmResponse]:
    return [event for _, event in await events_of(journal, STREAM, LlmResponse)]


@pytest.mark.parametrize("transport", ["openai-chat", "openai-responses", "anthropic"])
@pytest.mark.parametrize("streaming", [False, True])
async def test_every_transport_answers_records_usage_and_rebuilds(
    llama_server: LlamaServer, journal: Journal, transport: str, streaming: bool
) -> None:
    model = client_for(transport, llama_server)
    agent = Agent(
        journal, STREAM, model, max_tokens=48, temperature=0.0, stream_responses=streaming
    )
    try:
        await converse(agent, journal, QUESTIONS[:3])
    finally:
        await model.client.close()
    answers = await responses(journal)
    assert len(answers) == 3
    for answer in answers:
        assert answer.usage is not None, "llama.cpp reports usage on every transport"
        assert answer.usage.input_tokens > 0 and answer.usage.output_tokens > 0
    # The server keeps the conversation in its slot: each later turn reads most of its prompt
    # from the cache, and says so.
    for earlier, later in itertools.pairwise(answers):
        assert later.usage is not None and earlier.usage is not None
        assert later.usage.cached_input_tokens is not None
        assert later.usage.cached_input_tokens >= earlier.usage.input_tokens // 2
    offsets = await requests_of(journal, STREAM)
    assert len(offsets) == 3
    assert await verify_requests(journal, STREAM) == ()
    state = await journal.fold(AgentContext, STREAM)
    assert state.header is not None and state.header.layout == 2 and state.header.clock == "date"
    for offset in offsets:
        body = orjson.loads((await rebuild_request(journal, STREAM, offset)).body)
        assert b'"developer"' not in orjson.dumps(body), "the server never confirmed the role"
        texts = _message_texts(body)
        assert not any(text.startswith(TAIL_PREFIX) for text in texts)
        assert DATE_PREFIX.strip() in orjson.dumps(body).decode()


def _message_texts(body: dict[str, Any]) -> list[str]:
    """The text of every message of a body, whatever the transport."""
    texts: list[str] = []
    for message in body.get("messages", body.get("input", [])):
        content = message.get("content", message.get("output", ""))
        if isinstance(content, str):
            texts.append(content)
        else:
            texts += [part.get("text", "") for part in content if isinstance(part, dict)]
    return texts


async def test_the_agents_own_answers_go_back_without_headers(
    llama_server: LlamaServer, journal: Journal
) -> None:
    await chat(llama_server, journal, QUESTIONS[:3], max_tokens=32)
    offsets = await requests_of(journal, STREAM)
    body = orjson.loads((await rebuild_request(journal, STREAM, offsets[-1])).body)
    assistant = [m["content"] for m in body["messages"] if m["role"] == "assistant"]
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    assert len(assistant) == 2
    # An answer keeps a header only when its own text begins like one.
    assert all(parse_item_header(text) is None for text in assistant)
    assert all(parse_item_header(text) is not None for text in users)


async def test_a_compaction_runs_on_the_real_usage_and_every_request_rebuilds(
    llama_server: LlamaServer, journal: Journal
) -> None:
    # Half of an 800-token window: the first request is about 220 tokens and a turn adds 30
    # to 70, so a few turns cross it; what a compaction keeps (the protocol text, the prompt,
    # a summary and an answer of at most 48 tokens each, the question) stays under it.
    await chat(llama_server, journal, QUESTIONS, max_tokens=48, context_window=800)
    answers = await responses(journal)
    summaries = [
        event for _, event in await events_of(journal, STREAM, ContextAdded) if event.compaction
    ]
    assert summaries, "the real usage crossed the threshold: a compaction ran"
    for summary in summaries:
        assert summary.compaction is not None and summary.compaction.usage is not None
        assert summary.compaction.usage.input_tokens > 0
    assert all(answer.usage is not None for answer in answers)
    assert await verify_requests(journal, STREAM) == ()


async def test_an_unknown_models_window_is_the_servers(
    llama_server: LlamaServer, journal: Journal
) -> None:
    model = client_for("openai-chat", llama_server)
    assert await model.server_context_window() == llama_server.ctx_size
    await model.client.close()
    agent = await chat(llama_server, journal, QUESTIONS[:1], max_tokens=8)
    assert agent.settings.context_window == llama_server.ctx_size


async def test_a_stream_without_a_usage_chunk_is_recorded_as_unreported(
    llama_server: LlamaServer,
) -> None:
    """llama.cpp sends usage on a stream only when asked (``stream_options``): the answer to a
    body without the option records no usage, not zero tokens."""
    model = client_for("openai-chat", llama_server)
    request = NeutralRequest(
        model=model.model,
        system="Answer briefly.",
        messages=(NeutralMessage(role="user", content="Hi"),),
        max_tokens=8,
        stream=True,
    )
    body = orjson.loads(render_request(request, "openai-chat").body)
    del body["stream_options"]
    try:
        output = await model.complete(
            request, RenderedRequest(transport="openai-chat", body=orjson.dumps(body))
        )
    finally:
        await model.client.close()
    assert output.text
    assert output.usage is None
