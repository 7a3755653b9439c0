"""OpenAI Chat Completions wire body from a `NeutralRequest`.

Roles map one to one: the protocol system text is the first ``system`` message, later
``system`` and ``developer`` messages keep their native roles, ``tool`` messages carry
``tool_call_id`` and directly follow the assistant message that made the calls. No
``cache_control`` or other unknown field is sent: OpenAI caches prefixes automatically.
"""

from __future__ import annotations

from typing import Any

from contextfold.render.neutral import NeutralMessage, NeutralRequest, order_tool_results

__all__ = ["render_openai_chat"]


def render_openai_chat(request: NeutralRequest) -> dict[str, Any]:
    """The Chat Completions body as a fresh dict. Raises RenderError on bad tool pairing."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    messages.extend(_message(m) for m in order_tool_results(request.messages))
    body: dict[str, Any] = {"model": request.model}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters(),
                    **({"strict": True} if tool.strict else {}),
                },
            }
            for tool in request.tools
        ]
    if request.max_tokens is not None:
        # max_tokens is deprecated on Chat Completions and refused by reasoning models.
        body["max_completion_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.stream:
        body["stream"] = True
        # Usage arrives only on request when streaming; compaction needs it.
        body["stream_options"] = {"include_usage": True}
    # The growing history goes last, after everything that stays the same across requests.
    body["messages"] = messages
    return body


def _message(message: NeutralMessage) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        item: dict[str, Any] = {"role": "assistant"}
        if message.content:
            item["content"] = message.content
        item["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
        return item
    return {"role": message.role, "content": message.content}
