"""Images attached to context items reach each provider as its own image part, through the
official SDKs to a loopback server, and the request rebuilds byte for byte from the journal."""

from __future__ import annotations

import base64
from typing import Any

import anthropic
import openai
import pytest

import contextfold as cf
from contextfold.context.events import Actor, ContextAdded, FileAttachment
from contextfold.journal import Journal
from contextfold.runtime.clients import (
    AnthropicModel,
    ModelClient,
    OpenAIChatModel,
    OpenAIResponsesModel,
)
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.wire import Transport
from tests.runtime.helpers import STREAM, loopback

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n a cat, in bytes").decode()
CAT = FileAttachment(uri=f"data:image/png;base64,{PNG}", media_type="image/png", name="cat.png")
DOG = FileAttachment(uri="https://example.test/dog.webp", media_type="image/webp", name="dog")

REPLIES: dict[str, dict[str, Any]] = {
    "openai-chat": {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "A cat and a dog."},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35},
    },
    "openai-responses": {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": "gpt-4o",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "A cat and a dog.", "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 30,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 35,
        },
    },
    "anthropic": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": "A cat and a dog."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 30, "output_tokens": 5},
    },
}

# The image parts of the user message, as each provider's API documents them.
EXPECTED: dict[str, list[dict[str, Any]]] = {
    "openai-chat": [
        {"type": "image_url", "image_url": {"url": CAT.uri}},
        {"type": "image_url", "image_url": {"url": DOG.uri}},
    ],
    "openai-responses": [
        {"type": "input_image", "image_url": CAT.uri, "detail": "auto"},
        {"type": "input_image", "image_url": DOG.uri, "detail": "auto"},
    ],
    "anthropic": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": DOG.uri}},
    ],
}

TRANSPORTS: list[Transport] = ["openai-chat", "openai-responses", "anthropic"]


def sdk_model(transport: Transport, base_url: str) -> ModelClient:
    if transport == "openai-chat":
        return OpenAIChatModel("gpt-4o", base_url=base_url, api_key="t")
    if transport == "openai-responses":
        return OpenAIResponsesModel("gpt-4o", base_url=base_url, api_key="t")
    return AnthropicModel("claude-x", base_url=base_url, api_key="t")


def user_parts(body: dict[str, Any], transport: Transport) -> list[dict[str, Any]]:
    """The content parts of the body's one user message with parts."""
    messages = body["input"] if transport == "openai-responses" else body["messages"]
    [parts] = [
        m["content"]
        for m in messages
        if m.get("role") == "user" and isinstance(m.get("content"), list)
    ]
    assert isinstance(parts, list)
    return parts


def images_of(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kinds = ("image_url", "input_image", "image")
    return [
        {k: v for k, v in p.items() if k != "cache_control"} for p in parts if p["type"] in kinds
    ]


async def ask_about_pictures(journal: Journal) -> None:
    await journal.append(STREAM, system_prompt("You describe pictures."))
    await journal.append(
        STREAM,
        ContextAdded(
            role="user", actor=Actor(type="user"), content="What are these?", files=(CAT, DOG)
        ),
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_images_go_out_as_image_parts_and_rebuild_byte_for_byte(
    journal: Journal, transport: Transport
) -> None:
    await ask_about_pictures(journal)
    with loopback([REPLIES[transport]]) as server:
        model = sdk_model(transport, server.base_url)
        try:
            report = await Agent(journal, STREAM, model).run_until_idle()
        finally:
            await model.client.close()  # type: ignore[attr-defined]
    [received] = server.received
    [offset] = report.requests
    rebuilt = await cf.rebuild_request(journal, STREAM, offset)
    assert received.raw == rebuilt.body
    assert await cf.verify_requests(journal, STREAM) == ()
    parts = user_parts(received.body, transport)
    assert images_of(parts) == EXPECTED[transport]
    text = parts[0]["text"]
    assert text.endswith(
        "What are these?\n[File attached: cat.png (image/png)]\n[File attached: dog (image/webp)]"
    )
    assert text.split("\n", 1)[0] == f'@2 actor=user files=["{DOG.uri}"]'  # inline data: no ref
    answer = (await journal.fold(cf.AgentContext, STREAM)).history[-1]
    assert (answer.role, answer.content) == ("assistant", "A cat and a dog.")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_official_sdks_take_the_image_parts_as_they_are(
    journal: Journal, transport: Transport
) -> None:
    await ask_about_pictures(journal)
    await journal.append(
        STREAM,
        cf.LlmRequestRequested(
            header=cf.RequestHeader(transport=transport, model="m", max_tokens=64)
        ),
    )
    state = await journal.fold(cf.AgentContext, STREAM)
    body = cf.render(state).json()
    with loopback([REPLIES[transport]]) as server:
        if transport == "anthropic":
            with anthropic.Anthropic(base_url=server.base_url, api_key="t", max_retries=0) as sdk:
                sdk.messages.create(**body)
        else:
            base = server.base_url + "/v1"
            with openai.OpenAI(base_url=base, api_key="t", max_retries=0) as client:
                if transport == "openai-chat":
                    client.chat.completions.create(**body)
                else:
                    client.responses.create(**body)
    [received] = server.received
    assert received.body == body  # nothing added, dropped or changed by the SDK
    assert images_of(user_parts(received.body, transport)) == EXPECTED[transport]
