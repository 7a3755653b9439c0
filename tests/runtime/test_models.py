"""Model clients: every failure is a ModelError (stream iteration included), cancellation stays
a cancellation, SDK streams are closed whatever ends them, and usage counts the whole prompt."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

import contextfold as cf
from contextfold.context.events import ContextAdded, LlmResponse
from contextfold.errors import ContextfoldError, ModelError
from contextfold.journal import Journal
from contextfold.render import anthropic, openai_chat, openai_responses
from contextfold.runtime.clients import (
    AnthropicModel,
    FunctionModel,
    ModelClient,
    OpenAIChatModel,
    OpenAIResponsesModel,
)
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.transcript import TranscriptObserver
from contextfold.transcript import TranscriptBus, TranscriptWriter, open_transcript_store
from contextfold.transcript.parts import StepFinishPart
from contextfold.wire import ModelOutput, NeutralMessage, NeutralRequest, render_request
from tests.runtime.helpers import STREAM, anthropic_text_stream, events_of, loopback, user
from tests.runtime.helpers import _Stream as SSE

REQUEST = NeutralRequest(
    model="m",
    system="protocol",
    messages=(NeutralMessage(role="user", content="hi"),),
    max_tokens=16,
    stream=True,
)

# The first streamed event of each transport: a text delta "Hel".
FIRST: dict[str, Any] = {
    "openai-chat": SimpleNamespace(
        usage=None,
        choices=[
            SimpleNamespace(
                delta=SimpleNamespace(content="Hel", tool_calls=None), finish_reason=None
            )
        ],
    ),
    "openai-responses": SimpleNamespace(type="response.output_text.delta", delta="Hel"),
    "anthropic": SimpleNamespace(
        type="content_block_delta", index=0, delta=SimpleNamespace(type="text_delta", text="Hel")
    ),
}


class FakeStream:
    """An SDK stream: yields one event, then raises ``then`` or stalls forever."""

    def __init__(self, first: Any, then: BaseException | None = None) -> None:
        self.first, self.then = first, then
        self.started = asyncio.Event()
        self.closed = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> Any:
        if not self.started.is_set():
            self.started.set()
            return self.first
        if self.then is not None:
            raise self.then
        await asyncio.Event().wait()
        raise StopAsyncIteration

    async def close(self) -> None:
        self.closed = True


def client_for(transport: str, stream: FakeStream) -> ModelClient:
    async def post(path: str, **kwargs: Any) -> FakeStream:
        assert kwargs["stream"] is True
        return stream

    return model_for(transport, post)


def model_for(transport: str, post: Any) -> ModelClient:
    """A client of ``transport`` whose SDK's low-level ``post`` is ``post``."""
    sdk = SimpleNamespace(post=post, timeout=None)
    if transport == "openai-chat":
        return OpenAIChatModel("gpt-4o", client=sdk)
    if transport == "openai-responses":
        return OpenAIResponsesModel("gpt-4o", client=sdk)
    return AnthropicModel("claude-x", client=sdk)


TRANSPORTS = ["openai-chat", "openai-responses", "anthropic"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_stream_failing_midway_is_a_model_error_and_is_closed(transport: str) -> None:
    stream = FakeStream(FIRST[transport], ConnectionResetError("connection reset by peer"))
    model = client_for(transport, stream)
    deltas: list[str] = []

    async def on_delta(kind: str, text: str) -> None:
        deltas.append(text)

    rendered = render_request(REQUEST, model.transport)
    with pytest.raises(ModelError, match=f"{transport} request to model") as failed:
        await model.complete(REQUEST, rendered, on_delta=on_delta)
    assert model.model in str(failed.value) and "connection reset" in str(failed.value)
    assert isinstance(failed.value.__cause__, ConnectionResetError)
    assert deltas == ["Hel"] and stream.closed


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_cancelled_stream_is_closed_and_the_cancel_propagates(transport: str) -> None:
    stream = FakeStream(FIRST[transport])
    model = client_for(transport, stream)
    call = asyncio.create_task(model.complete(REQUEST, render_request(REQUEST, model.transport)))
    await asyncio.wait_for(stream.started.wait(), 5)
    await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert stream.closed


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_cancel_the_sdk_swallowed_as_the_stream_opened_still_cancels(
    transport: str,
) -> None:
    """On Python 3.11 an SDK's ``wait_for`` can return the stream although the call was
    cancelled as it opened (the task still counts the cancel): the stream is closed, not
    read to its end (which may be minutes away)."""
    stream = FakeStream(FIRST[transport])
    posting = asyncio.Event()

    async def post(path: str, **kwargs: Any) -> FakeStream:
        posting.set()
        # What wait_for does when the response was ready: the cancel is dropped.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(60)
        return stream

    model = model_for(transport, post)
    call = asyncio.create_task(model.complete(REQUEST, render_request(REQUEST, model.transport)))
    await asyncio.wait_for(posting.wait(), 5)
    call.cancel()
    done, _ = await asyncio.wait({call}, timeout=5)
    assert done and call.cancelled()
    assert stream.closed and not stream.started.is_set()


# A whole (not streamed) answer "Hello" of each transport.
WHOLE: dict[str, Any] = {
    "openai-chat": SimpleNamespace(
        usage=None,
        choices=[
            SimpleNamespace(
                message=SimpleNamespace(content="Hello", tool_calls=None), finish_reason="stop"
            )
        ],
    ),
    "openai-responses": SimpleNamespace(
        usage=None,
        status="completed",
        output=[
            SimpleNamespace(
                type="message", content=[SimpleNamespace(type="output_text", text="Hello")]
            )
        ],
    ),
    "anthropic": SimpleNamespace(
        usage=SimpleNamespace(input_tokens=3, output_tokens=1),
        stop_reason="end_turn",
        content=[SimpleNamespace(type="text", text="Hello")],
    ),
}


PATHS = {
    "openai-chat": "/chat/completions",
    "openai-responses": "/responses",
    "anthropic": "/v1/messages",
}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_whole_response_is_read_by_its_transport(transport: str) -> None:
    sent: list[tuple[str, Any, bool]] = []

    async def post(path: str, **kwargs: Any) -> Any:
        sent.append((path, kwargs["content"], kwargs["stream"]))
        return WHOLE[transport]

    model = model_for(transport, post)
    request = replace(REQUEST, stream=False)
    rendered = render_request(request, model.transport)
    output = await model.complete(request, rendered)
    assert output.text == "Hello" and output.tool_calls == ()
    # The exact rendered bytes are posted, not a re-serialized dict.
    assert sent == [(PATHS[transport], rendered.body, False)]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_failing_sdk_call_is_a_model_error(transport: str) -> None:
    async def post(path: str, **kwargs: Any) -> Any:
        raise ConnectionRefusedError("connection refused")

    model = model_for(transport, post)
    with pytest.raises(ModelError, match=f"{transport} request to model") as failed:
        await model.complete(REQUEST, render_request(REQUEST, model.transport))
    assert isinstance(failed.value.__cause__, ConnectionRefusedError)


async def test_a_failing_function_model_is_a_model_error() -> None:
    def fn(request: NeutralRequest) -> str:
        raise ConnectionError("provider unreachable")

    model = FunctionModel(fn, model="local-llm", transport="anthropic")
    with pytest.raises(ModelError, match="anthropic request to model 'local-llm'") as failed:
        await model.complete(REQUEST, render_request(REQUEST, "anthropic"))
    assert isinstance(failed.value.__cause__, ConnectionError)
    # One class in the one error tree.
    assert ModelError is cf.ModelError is cf.errors.ModelError
    assert issubclass(ModelError, ContextfoldError)


async def test_an_observer_failing_on_a_delta_is_not_a_provider_error() -> None:
    def on_delta(kind: str, text: str) -> None:
        raise KeyError("observer bug")

    model = FunctionModel(lambda request: "streamed text", stream_chunk=4)
    with pytest.raises(KeyError, match="observer bug"):
        await model.complete(REQUEST, render_request(REQUEST, "openai-chat"), on_delta=on_delta)


def anthropic_message(**usage: int) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": "cached answer"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_usage_counts_cached_prompt_tokens(journal: Journal, stream: bool) -> None:
    """The prompt is input + cache reads + cache writes; cache reads are the cached part."""
    if stream:
        reply: Any = anthropic_text_stream(
            ["cached ", "answer"], input_tokens=10, cache_read=1000, cache_write=200
        )
    else:
        reply = anthropic_message(
            input_tokens=10,
            cache_read_input_tokens=1000,
            cache_creation_input_tokens=200,
            output_tokens=5,
        )
    with loopback([reply]) as server:
        model = AnthropicModel("claude-3-5-haiku-latest", base_url=server.base_url, api_key="t")
        try:
            await journal.append(STREAM, system_prompt("Agent."))
            await journal.append(STREAM, user("hi"))
            await Agent(journal, STREAM, model, stream_responses=stream).run_until_idle()
        finally:
            await model.client.close()
    [(_, response)] = await events_of(journal, STREAM, LlmResponse)
    assert isinstance(response, LlmResponse) and response.usage is not None
    assert response.usage.input_tokens == 1210
    assert response.usage.cached_input_tokens == 1000
    assert response.text == "cached answer"


# -- usage, per provider, from recorded payloads: response, transcript and compaction paths ---

PAYLOADS = Path(__file__).parent.parent / "render" / "payloads"
RECORDED = [f"{t}{s}" for t in TRANSPORTS for s in ("", "-stream")]


def recorded(name: str) -> Any:
    return json.loads((PAYLOADS / f"{name}.json").read_text(encoding="utf-8"))


def text_only(name: str, data: Any) -> Any:
    """The same answer without its tool calls (a final answer after the tool result)."""
    data = copy.deepcopy(data)
    if name == "openai-chat":
        message = data["choices"][0]
        message["message"].pop("tool_calls")
        message["message"]["content"], message["finish_reason"] = "Done.", "stop"
    elif name == "openai-responses":
        data["output"] = [item for item in data["output"] if item["type"] != "function_call"]
    elif name == "anthropic":
        data["content"] = [block for block in data["content"] if block["type"] == "text"]
        data["stop_reason"] = "end_turn"
    elif name == "anthropic-stream":
        data = [e for e in data if e["data"].get("index") != 1]
        data[-2]["data"]["delta"]["stop_reason"] = "end_turn"
    return data


def reply(name: str, data: Any) -> Any:
    """What the loopback server sends: the JSON, or the server-sent events of a stream."""
    return SSE([(e["event"], e["data"]) for e in data]) if name.endswith("-stream") else data


def usage_of(name: str, data: Any) -> cf.Usage:
    """The usage the provider module reads from the payload, typed by the SDK as clients get it."""
    transport = name.removesuffix("-stream")
    module: Any = {
        "openai-chat": openai_chat,
        "openai-responses": openai_responses,
        "anthropic": anthropic,
    }[transport]
    if not name.endswith("-stream"):
        sdk_type: Any = {
            "openai-chat": ChatCompletion,
            "openai-responses": Response,
            "anthropic": Message,
        }[transport]
        output = module.parse_response(sdk_type.model_validate(data))
    else:
        event_type: Any = {
            "openai-chat": ChatCompletionChunk,
            "openai-responses": ResponseStreamEvent,
            "anthropic": RawMessageStreamEvent,
        }[transport]
        reader = module.StreamReader()
        for event in data:
            if isinstance(event["data"], dict) and event["event"] != "ping":
                reader.feed(TypeAdapter(event_type).validate_python(event["data"]))
        output = reader.result()
    assert isinstance(output, ModelOutput) and output.usage is not None
    return output.usage


def sdk_model(name: str, base_url: str) -> ModelClient:
    transport = name.removesuffix("-stream")
    if transport == "openai-chat":
        return OpenAIChatModel("gpt-4o", base_url=base_url, api_key="t")
    if transport == "openai-responses":
        return OpenAIResponsesModel("gpt-4o", base_url=base_url, api_key="t")
    return AnthropicModel("claude-x", base_url=base_url, api_key="t")


async def run_agent(journal: Journal, name: str, replies: list[Any], **options: Any) -> None:
    with loopback(replies) as server:
        model = sdk_model(name, server.base_url)
        try:
            await journal.append(STREAM, system_prompt("Agent."))
            await journal.append(STREAM, user("check the tests"))
            agent = Agent(
                journal, STREAM, model, stream_responses=name.endswith("-stream"), **options
            )
            await agent.run_until_idle()
        finally:
            await model.client.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", RECORDED)
async def test_usage_is_recorded_and_transcribed_as_the_provider_reported_it(
    journal: Journal, name: str
) -> None:
    first = recorded(name)
    final = text_only(name, first)  # answers the tool call's result, when there is one
    store = open_transcript_store("sqlite:///:memory:")
    await store.open()
    try:
        writer = TranscriptWriter(store, TranscriptBus())
        rows = TranscriptObserver(writer, "s", clock=lambda: "2026-01-01T00:00:00+00:00")
        await run_agent(journal, name, [reply(name, first), reply(name, final)], observer=rows)
        responses = await events_of(journal, STREAM, LlmResponse)
        expected = [usage_of(name, first), usage_of(name, final)][: len(responses)]
        assert [response.usage for _, response in responses] == expected
        assert expected[0].cached_input_tokens is not None  # every payload reports cache reads
        steps = [await store.get_part("s", f"step-finish-{r.request_offset}") for _, r in responses]
        assert [step.usage for step in steps if isinstance(step, StepFinishPart)] == expected
    finally:
        await store.close()


@pytest.mark.parametrize("name", RECORDED)
async def test_a_summary_records_the_summarizer_usage_the_provider_reported(
    journal: Journal, name: str
) -> None:
    answer = text_only(name, recorded(name))
    # The answer's prompt crosses the (tiny) threshold: the same payload answers the summary.
    await run_agent(
        journal, name, [reply(name, answer), reply(name, answer)], compaction_threshold=0.005
    )
    summaries = [e for _, e in await events_of(journal, STREAM, ContextAdded) if e.compaction]
    [summary] = summaries
    assert summary.compaction is not None
    assert summary.compaction.usage == usage_of(name, answer)
