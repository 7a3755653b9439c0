"""Message content in the GenAI conventions' JSON form, for spans that capture it.

:func:`request_content` reads the exact body a request sent (the bytes
``contextfold.rebuild_request`` returns), for each transport: its messages
(``gen_ai.input.messages``), the instructions the transport carries apart from them
(``gen_ai.system_instructions``: Anthropic's ``system``, the Responses API's
``instructions``; a Chat Completions system message stays a message, as the conventions
ask) and its tool definitions (``gen_ai.tool.definitions``). :func:`output_content` is a
model's answer (``gen_ai.output.messages``). Pure functions of their input, called only
when content capture is on (``contextfold.telemetry.capture_content``).

A part the conventions have no type for keeps the provider's own ``type`` and fields.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
from opentelemetry.util.types import AttributeValue

from .. import telemetry as tm
from ..wire import ModelOutput, RenderedRequest

__all__ = ["arguments_value", "finish_reason", "output_content", "request_content"]

Part = dict[str, Any]
Message = dict[str, Any]

_FINISH = {
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "completed": "stop",
    "pause_turn": "stop",
    "tool_calls": "tool_call",
    "tool_use": "tool_call",
    "function_call": "tool_call",
    "length": "length",
    "max_tokens": "length",
    "max_output_tokens": "length",
    "model_context_window_exceeded": "length",
    "incomplete": "length",
    "content_filter": "content_filter",
    "refusal": "content_filter",
}


def finish_reason(reason: str) -> str:
    """A provider's stop reason as the conventions' output message names it (``stop``,
    ``length``, ``content_filter``, ``tool_call``); another is kept as the provider said."""
    return _FINISH.get(reason, reason)


def request_content(rendered: RenderedRequest) -> dict[str, AttributeValue]:
    """The input messages, system instructions and tool definitions ``rendered`` carries,
    each as JSON text; one the body does not hold is left out."""
    body: dict[str, Any] = orjson.loads(rendered.body)
    if rendered.transport == "anthropic":
        messages = [_anthropic_message(m) for m in body.get("messages", ())]
        system = body.get("system")
        instructions = [{"type": "text", "content": system}] if isinstance(system, str) else []
        if isinstance(system, list):
            instructions = [_anthropic_part(block) for block in system]
        tools = [
            _tool(t.get("name"), t.get("description"), t.get("input_schema"))
            for t in body.get("tools", ())
        ]
    elif rendered.transport == "openai-responses":
        messages = list(_responses_messages(body.get("input", ())))
        text = body.get("instructions")
        instructions = [{"type": "text", "content": text}] if text else []
        tools = [
            _tool(t.get("name"), t.get("description"), t.get("parameters"))
            for t in body.get("tools", ())
            if t.get("type") == "function"
        ]
    else:
        messages = [_chat_message(m) for m in body.get("messages", ())]
        instructions = []
        tools = [
            _tool(f.get("name"), f.get("description"), f.get("parameters"))
            for f in (t.get("function", {}) for t in body.get("tools", ()))
        ]
    found: dict[str, AttributeValue] = {tm.INPUT_MESSAGES: tm.json_text(messages)}
    if instructions:
        found[tm.SYSTEM_INSTRUCTIONS] = tm.json_text(instructions)
    if tools:
        found[tm.TOOL_DEFINITIONS] = tm.json_text(tools)
    return found


def output_content(output: ModelOutput) -> dict[str, AttributeValue]:
    """The answer as one assistant output message: reasoning, text, then tool calls."""
    parts: list[Part] = []
    if output.reasoning:
        parts.append({"type": "reasoning", "content": output.reasoning})
    if output.text:
        parts.append({"type": "text", "content": output.text})
    parts.extend(
        {"type": "tool_call", "id": c.id, "name": c.name, "arguments": arguments_value(c.arguments)}
        for c in output.tool_calls
    )
    message = {
        "role": "assistant",
        "parts": parts,
        "finish_reason": finish_reason(output.finish_reason),
    }
    return {tm.OUTPUT_MESSAGES: tm.json_text([message])}


def _tool(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"type": "function", "name": name}
    if description:
        found["description"] = description
    if parameters is not None:
        found["parameters"] = parameters
    return found


def arguments_value(text: str) -> Any:
    """Tool call arguments as the JSON value they are (the text itself when not JSON)."""
    if not text.strip():
        return {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _role(role: Any) -> str:
    return "system" if role == "developer" else str(role)


def _chat_message(message: dict[str, Any]) -> Message:
    role = message.get("role")
    if role == "tool":
        response = {"type": "tool_call_response", "id": message.get("tool_call_id")}
        return {"role": "tool", "parts": [{**response, "response": message.get("content")}]}
    content = message.get("content")
    parts = [_chat_part(p) for p in content] if isinstance(content, list) else []
    if isinstance(content, str) and content:
        parts = [{"type": "text", "content": content}]
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        arguments = arguments_value(function.get("arguments") or "")
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": function.get("name"),
                "arguments": arguments,
            }
        )
    return {"role": _role(role), "parts": parts}


def _chat_part(part: dict[str, Any]) -> Part:
    if part.get("type") == "text":
        return {"type": "text", "content": part.get("text", "")}
    if part.get("type") == "image_url":
        return _image_uri(part.get("image_url", {}).get("url", ""))
    return part


def _image_uri(url: str) -> Part:
    if url.startswith("data:") and ";base64," in url:
        head, data = url[5:].split(";base64,", 1)
        return {"type": "blob", "modality": "image", "mime_type": head, "content": data}
    return {"type": "uri", "modality": "image", "uri": url}


def _responses_messages(items: Any) -> Iterator[Message]:
    """Input items as messages: consecutive function calls join the assistant message
    before them, as the conventions' one message per turn."""
    last: Message | None = None
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            call: Part = {
                "type": "tool_call",
                "id": item.get("call_id"),
                "name": item.get("name"),
                "arguments": arguments_value(item.get("arguments") or ""),
            }
            if last is not None and last["role"] == "assistant":
                last["parts"].append(call)
                continue
            last = {"role": "assistant", "parts": [call]}
        elif kind == "function_call_output":
            response = {"type": "tool_call_response", "id": item.get("call_id")}
            last = {"role": "tool", "parts": [{**response, "response": item.get("output")}]}
        elif kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                parts = [{"type": "text", "content": content}] if content else []
            else:
                parts = [_responses_part(p) for p in content or ()]
            last = {"role": _role(item.get("role")), "parts": parts}
        else:
            last = {"role": "assistant", "parts": [dict(item)]}
        yield last


def _responses_part(part: dict[str, Any]) -> Part:
    if part.get("type") in ("input_text", "output_text"):
        return {"type": "text", "content": part.get("text", "")}
    if part.get("type") == "input_image":
        return _image_uri(part.get("image_url", ""))
    return part


def _anthropic_message(message: dict[str, Any]) -> Message:
    content = message.get("content")
    if isinstance(content, str):
        return {"role": message.get("role"), "parts": [{"type": "text", "content": content}]}
    parts = [_anthropic_part(block) for block in content or ()]
    results = [p for p in parts if p["type"] == "tool_call_response"]
    # Tool results travel in a user turn; the conventions give them the tool role.
    role = "tool" if results and len(results) == len(parts) else message.get("role")
    return {"role": role, "parts": parts}


def _anthropic_part(block: dict[str, Any]) -> Part:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": block.get("text", "")}
    if kind == "tool_use":
        return {
            "type": "tool_call",
            "id": block.get("id"),
            "name": block.get("name"),
            "arguments": block.get("input"),
        }
    if kind == "tool_result":
        return {
            "type": "tool_call_response",
            "id": block.get("tool_use_id"),
            "response": block.get("content", ""),
        }
    if kind == "thinking":
        return {"type": "reasoning", "content": block.get("thinking", "")}
    if kind == "image":
        source = block.get("source", {})
        if source.get("type") == "base64":
            mime = source.get("media_type")
            return {
                "type": "blob",
                "modality": "image",
                "mime_type": mime,
                "content": source.get("data"),
            }
        return {"type": "uri", "modality": "image", "uri": source.get("url")}
    return {key: value for key, value in block.items() if key != "cache_control"}
