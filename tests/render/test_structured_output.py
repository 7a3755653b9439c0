"""Structured output on the wire: a request's ``OutputSchema`` in each transport's own form,
sent unchanged by the official clients and by contextfold's model clients to a loopback
server, logged in the request header so a rebuild renders it again."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from pydantic import ValidationError

import contextfold as cf
from contextfold.context.events import RequestHeader
from contextfold.wire import (
    TRANSPORTS,
    NeutralMessage,
    NeutralRequest,
    OutputSchema,
    Transport,
    render_request,
)
from tests.integrations.helpers import response_json, responses_server

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}},
    "required": ["city", "degrees"],
    "additionalProperties": False,
}
OUTPUT = OutputSchema.from_schema(name="final_output", schema=SCHEMA, strict=True)
ANSWER = '{"city":"Paris","degrees":21}'

CHAT_REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "gpt-test",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": ANSWER},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
RESPONSES_REPLY = response_json(
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
    }
)
MESSAGES_REPLY = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "content": [{"type": "text", "text": ANSWER}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 1},
}
REPLIES = {
    "openai-chat": CHAT_REPLY,
    "openai-responses": RESPONSES_REPLY,
    "anthropic": MESSAGES_REPLY,
}


def request(output: OutputSchema | None = OUTPUT) -> NeutralRequest:
    return NeutralRequest(
        model="test-model",
        system="Answer with the weather as JSON.",
        messages=(NeutralMessage(role="user", content="@2\nWeather in Paris?"),),
        max_tokens=256,
        output_schema=output,
    )


def test_each_transport_has_its_own_form() -> None:
    responses = render_request(request(), "openai-responses").json()
    assert responses["text"] == {
        "format": {"type": "json_schema", "name": "final_output", "schema": SCHEMA, "strict": True}
    }
    chat = render_request(request(), "openai-chat").json()
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "final_output", "schema": SCHEMA, "strict": True},
    }
    messages = render_request(request(), "anthropic").json()
    assert messages["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    # Before the history, so a conversation's bodies still share their prefix.
    for body, history in ((responses, "input"), (chat, "messages"), (messages, "messages")):
        assert list(body)[-1] == history


def test_free_text_requests_render_as_before() -> None:
    for transport in TRANSPORTS:
        body = render_request(request(None), transport).json()
        assert not {"text", "response_format", "output_config"} & set(body)


def test_a_schema_is_canonical_json_and_needs_a_name() -> None:
    shuffled = dict(reversed(list(SCHEMA.items())))
    assert OutputSchema.from_schema(name="final_output", schema=shuffled, strict=True) == OUTPUT
    assert OUTPUT.answer_schema() == SCHEMA
    with pytest.raises(ValidationError, match="name"):
        OutputSchema.from_schema(name="has space", schema=SCHEMA)
    with pytest.raises(ValidationError, match="JSON schema object"):
        OutputSchema(name="x", json_schema="[1]")


def _official(transport: str, base_url: str, body: dict[str, Any]) -> str:
    if transport == "openai-chat":
        with openai.OpenAI(base_url=base_url, api_key="test", max_retries=0) as client:
            completion = client.chat.completions.create(**body)
            return str(completion.choices[0].message.content)
    if transport == "openai-responses":
        with openai.OpenAI(base_url=base_url, api_key="test", max_retries=0) as client:
            response = client.responses.create(**body)
            return str(response.output_text)
    with anthropic.Anthropic(
        base_url=base_url.removesuffix("/v1"), api_key="test", max_retries=0
    ) as client:
        block = client.messages.create(**body).content[0]
        assert block.type == "text"
        return str(block.text)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_official_client_sends_the_body_unchanged(transport: Transport) -> None:
    body = render_request(request(), transport).json()
    with responses_server([REPLIES[transport]]) as server:
        assert _official(transport, server.base_url, body) == ANSWER
    assert json.loads(server.received[0].body) == body


def _client(transport: Transport, base_url: str) -> cf.ModelClient:
    if transport == "openai-chat":
        return cf.OpenAIChatModel("test-model", base_url=base_url, api_key="test")
    if transport == "openai-responses":
        return cf.OpenAIResponsesModel("test-model", base_url=base_url, api_key="test")
    return cf.AnthropicModel("test-model", base_url=base_url.removesuffix("/v1"), api_key="test")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_contextfold_clients_send_the_rendered_bytes(transport: Transport) -> None:
    neutral = request()
    rendered = render_request(neutral, transport)
    with responses_server([REPLIES[transport]]) as server:
        client = _client(transport, server.base_url)
        output = await client.complete(neutral, rendered)
    assert output.text == ANSWER
    assert server.received[0].body == rendered.body


def test_the_header_logs_the_schema_and_a_rebuild_renders_it() -> None:
    header = RequestHeader(transport="openai-responses", model="m", output_schema=OUTPUT)
    stored = header.model_dump(mode="json")
    assert stored["output_schema"]["json_schema"] == OUTPUT.json_schema
    assert RequestHeader.model_validate(stored) == header
    # A header without one is stored as before the field existed.
    assert "output_schema" not in RequestHeader(transport="anthropic", model="m").model_dump()
    state = cf.AgentContextState(request_time="2026-01-01T00:00:00+00:00")
    built = cf.build_request(state, header)
    assert built.output_schema == OUTPUT
    assert render_request(built, "openai-responses").json()["text"]["format"]["strict"] is True
