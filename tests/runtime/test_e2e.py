"""End to end through the official SDKs against a loopback server, streaming: the server gets
exactly the recorded bytes (the hash of its raw request body is the recorded hash), deltas
reach the observer, tools run, requests verify."""

from __future__ import annotations

import json
from typing import Any

from contextfold.canonical import sha256_hex
from contextfold.context.events import (
    ContextAdded,
    LlmResponse,
    ToolCallResult,
)
from contextfold.context.rebuild import rebuild_request, verify_requests
from contextfold.journal import Journal
from contextfold.runtime.clients import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from contextfold.runtime.events import DeltaReceived
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.wire import ToolCall
from tests.runtime.helpers import (
    STREAM,
    Observer,
    anthropic_text_stream,
    anthropic_tool_stream,
    events_of,
    loopback,
    openai_responses_text_stream,
    openai_text_stream,
    openai_tool_stream,
    recorded_of,
    user,
)


def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"sunny in {city}"


ARGUMENTS = '{"city": "Paris"}'
ANSWER = ["It is ", "sunny ", "in Paris."]


async def check_wire(journal: Journal, observer: Observer, received: list[Any]) -> None:
    """The server received exactly the bytes we recorded, request by request: the hash of
    the raw request body on the wire is the journal's RequestRecorded.sha256."""
    recorded = await recorded_of(journal, STREAM)
    offsets = sorted(observer.sent)
    assert len(received) == len(offsets)
    for offset, got in zip(offsets, received, strict=True):
        [rendered] = observer.sent[offset]
        assert got.raw == rendered.body
        assert recorded[offset] == [sha256_hex(got.raw)]
        assert sha256_hex(got.raw) == rendered.sha256
        assert got.body == json.loads(rendered.body)
        assert (await rebuild_request(journal, STREAM, offset)).sha256 == sha256_hex(got.raw)
    assert await verify_requests(journal, STREAM) == ()


async def assistant_items(journal: Journal) -> list[ContextAdded]:
    return [e for _, e in await events_of(journal, STREAM, ContextAdded) if e.role == "assistant"]


async def test_openai_chat_streaming_tool_call_then_text(journal: Journal) -> None:
    replies = [openai_tool_stream("call_1", "get_weather", ARGUMENTS), openai_text_stream(ANSWER)]
    observer = Observer()
    with loopback(replies) as server:
        model = OpenAIChatModel("gpt-4o-mini", base_url=f"{server.base_url}/v1", api_key="test")
        try:
            await journal.append(STREAM, system_prompt("You answer weather questions."))
            await journal.append(STREAM, user("What is the weather in Paris?"))
            agent = Agent(
                journal,
                STREAM,
                model,
                tools=[get_weather],
                stream_responses=True,
                observer=observer,
            )
            report = await agent.run_until_idle()
        finally:
            await model.client.close()
    assert report.status == "idle" and report.tool_calls == 1 and len(report.requests) == 2
    assert [r.path for r in server.received] == ["/v1/chat/completions"] * 2
    first, second = (r.body for r in server.received)
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    assert first["tools"][0]["function"]["name"] == "get_weather"
    # Not OpenAI's own API: the request ends with the question, its date in the system text.
    assert first["messages"][-1]["content"].endswith("What is the weather in Paris?")
    assert "\nCurrent date: " in first["messages"][0]["content"]
    await check_wire(journal, observer, server.received)

    # The streamed call was assembled from its fragments and the tool ran.
    responses = [e for _, e in await events_of(journal, STREAM, LlmResponse)]
    assert responses[0].tool_calls == (
        ToolCall(id="call_1", name="get_weather", arguments=ARGUMENTS),
    )
    assert responses[0].stop_reason == "tool_calls"
    assert responses[0].usage is not None and responses[0].usage.input_tokens == 50
    [result] = [e for _, e in await events_of(journal, STREAM, ToolCallResult)]
    assert (result.tool_call_id, result.content) == ("call_1", "sunny in Paris")
    calls = [m for m in second["messages"] if m.get("tool_calls")]
    assert calls[0]["tool_calls"][0]["id"] == "call_1"
    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    assert tool_messages == [
        {"role": "tool", "tool_call_id": "call_1", "content": tool_messages[0]["content"]}
    ]
    assert tool_messages[0]["content"].endswith("\nsunny in Paris")

    # The text deltas reached the observer, in order, for the second request.
    deltas = observer.of(DeltaReceived)
    assert [d.text for d in deltas] == ANSWER
    assert {d.offset for d in deltas} == {report.requests[1]}
    assert {d.channel for d in deltas} == {"text"}
    # The final answer is in the journal.
    final = (await assistant_items(journal))[-1]
    assert final.content == "".join(ANSWER)
    assert final.llm_request_offset == report.requests[1]
    assert responses[1].usage is not None and responses[1].usage.input_tokens == 80


async def test_anthropic_streaming_tool_call_then_text(journal: Journal) -> None:
    replies = [
        anthropic_tool_stream("toolu_1", "get_weather", ARGUMENTS),
        anthropic_text_stream(ANSWER),
    ]
    observer = Observer()
    with loopback(replies) as server:
        model = AnthropicModel("claude-3-5-haiku-latest", base_url=server.base_url, api_key="test")
        try:
            await journal.append(STREAM, system_prompt("You answer weather questions."))
            await journal.append(STREAM, user("Weather in Paris?"))
            report = await Agent(
                journal,
                STREAM,
                model,
                tools=[get_weather],
                stream_responses=True,
                observer=observer,
                max_tokens=256,
            ).run_until_idle()
        finally:
            await model.client.close()
    assert report.tool_calls == 1 and len(report.requests) == 2
    assert [r.path for r in server.received] == ["/v1/messages"] * 2
    first, second = (r.body for r in server.received)
    assert first["stream"] is True and first["max_tokens"] == 256
    assert isinstance(first["system"], list) and first["messages"][-1]["role"] == "user"
    await check_wire(journal, observer, server.received)
    [result] = [e for _, e in await events_of(journal, STREAM, ToolCallResult)]
    assert (result.tool_call_id, result.content) == ("toolu_1", "sunny in Paris")
    uses = [
        block
        for m in second["messages"]
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for block in m["content"]
        if block["type"] == "tool_use"
    ]
    assert [(u["id"], u["name"], u["input"]) for u in uses] == [
        ("toolu_1", "get_weather", {"city": "Paris"})
    ]
    assert [d.text for d in observer.of(DeltaReceived)] == ANSWER
    assert (await assistant_items(journal))[-1].content == "".join(ANSWER)


async def test_openai_responses_streaming_text(journal: Journal) -> None:
    observer = Observer()
    with loopback([openai_responses_text_stream(ANSWER)]) as server:
        model = OpenAIResponsesModel("gpt-4o-mini", base_url=f"{server.base_url}/v1", api_key="t")
        try:
            await journal.append(STREAM, system_prompt("You answer weather questions."))
            await journal.append(STREAM, user("Weather in Paris?"))
            report = await Agent(
                journal, STREAM, model, stream_responses=True, observer=observer
            ).run_until_idle()
        finally:
            await model.client.close()
    assert report.status == "idle" and len(report.requests) == 1
    assert [r.path for r in server.received] == ["/v1/responses"]
    assert server.received[0].body["stream"] is True
    await check_wire(journal, observer, server.received)
    assert [d.text for d in observer.of(DeltaReceived)] == ANSWER
    assert (await assistant_items(journal))[-1].content == "".join(ANSWER)
    [response] = [e for _, e in await events_of(journal, STREAM, LlmResponse)]
    assert response.usage is not None and response.usage.input_tokens == 80
