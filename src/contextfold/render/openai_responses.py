"""OpenAI Responses API wire body from a `NeutralRequest`.

The protocol system text is sent as ``instructions``; messages become ``input`` items
with their native roles (``developer`` stays developer), assistant tool calls become
``function_call`` items and tool messages ``function_call_output`` items directly after
them. Function tools always carry an explicit ``strict`` because the Responses API
defaults it to true, which would reject ordinary schemas. No ``cache_control`` or other
unknown field is sent: OpenAI caches prefixes automatically.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from contextfold.render.neutral import NeutralMessage, NeutralRequest, order_tool_results

__all__ = ["render_openai_responses"]


def render_openai_responses(request: NeutralRequest) -> dict[str, Any]:
    """The Responses body as a fresh dict. Raises RenderError on bad tool pairing."""
    items: list[dict[str, Any]] = []
    for message in order_tool_results(request.messages):
        items.extend(_items(message))
    body: dict[str, Any] = {"model": request.model}
    if request.system:
        body["instructions"] = request.system
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters(),
                "strict": tool.strict,
            }
            for tool in request.tools
        ]
    if request.max_tokens is not None:
        body["max_output_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.stream:
        body["stream"] = True
    # The growing history goes last, after everything that stays the same across requests.
    body["input"] = items
    return body


def _items(message: NeutralMessage) -> Iterator[dict[str, Any]]:
    if message.role == "tool":
        yield {
            "type": "function_call_output",
            "call_id": message.tool_call_id,
            "output": message.content,
        }
        return
    if message.content or not message.tool_calls:
        yield {"type": "message", "role": message.role, "content": message.content}
    for call in message.tool_calls:
        yield {
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
        }
