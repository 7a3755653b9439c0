"""Model clients: every failure is a ModelError (stream iteration included), cancellation stays
a cancellation, SDK streams are closed whatever ends them, and usage counts the whole prompt."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from loopback import anthropic_text_stream, loopback
from runtime_helpers import STREAM, events_of, user

import contextfold as cf
from contextfold.context.events import LlmResponse
from contextfold.errors import ContextfoldError
from contextfold.journal import Journal
from contextfold.render.neutral import NeutralMessage, NeutralRequest, render_request
from contextfold.runtime import models
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.models import (
    AnthropicModel,
    FunctionModel,
    ModelClient,
    ModelError,
    OpenAIChatModel,
    OpenAIResponsesModel,
)

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
    # One class in the one error tree, importable from where it was.
    assert ModelError is cf.ModelError is cf.errors.ModelError is models.ModelError
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
