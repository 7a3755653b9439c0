"""OpenAI Responses API: the request body from a `NeutralRequest`, and the answer back.

Request: the protocol system text is sent as ``instructions``; messages become ``input`` items
with their native roles (``developer`` stays developer), assistant tool calls become
``function_call`` items and tool messages ``function_call_output`` items directly after
them; a user message with images sends ``input_text`` then an ``input_image`` per image
(``detail: auto``). Function tools always carry an explicit ``strict`` because the Responses API
defaults it to true, which would reject ordinary schemas. Structured output is
``text.format`` (``json_schema`` with its name, schema and ``strict``). No ``cache_control``
or other unknown field is sent: OpenAI caches prefixes automatically.

Answer: :func:`parse_response` reads a whole ``Response``, :class:`StreamReader` a stream
of ``ResponseStreamEvent`` (its ``response.completed`` event carries the whole answer),
and :func:`parse_usage` maps ``ResponseUsage``: ``input_tokens`` is already the whole
prompt, its details give the cache reads and writes, and ``output_tokens`` includes the
reasoning tokens. All pure: the client does the I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from ..wire import ModelOutput, NeutralMessage, NeutralRequest, ToolCall, Usage, WrittenArray
from .assembly import Unassembled, assemble
from .pairing import order_tool_results

__all__ = ["StreamReader", "parse_response", "parse_usage", "render_openai_responses"]


def render_openai_responses(
    request: NeutralRequest, previous: WrittenArray | None = None
) -> dict[str, Any]:
    """The Responses body as a fresh dict, its ``input`` array serialized here (a
    ``JsonArray`` assembled from what is new since ``previous``, see ``assembly``). Raises
    RenderError on bad tool pairing."""
    body: dict[str, Any] = {"model": request.model}
    if request.system:
        body["instructions"] = request.system
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.arguments_schema(),
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
    output = request.output_schema
    if output is not None:
        body["text"] = {
            "format": {
                "type": "json_schema",
                "name": output.name,
                "schema": output.answer_schema(),
                "strict": output.strict,
            }
        }
    # The growing history goes last, after everything that stays the same across requests.
    body["input"] = _input(request, previous)
    return body


def _input(request: NeutralRequest, previous: WrittenArray | None) -> Any:
    """The input array: assembled, or plain dicts when it cannot be (then the plain path
    raises the error: broken pairing here, a value that is not JSON when it is encoded)."""
    if request.messages:
        try:
            return assemble(request.messages, _units, previous=previous)
        except (Unassembled, TypeError):
            pass
    return [item for message in order_tool_results(request.messages) for item in _items(message)]


def _units(message: NeutralMessage) -> tuple[bytes, ...]:
    return tuple(orjson.dumps(item) for item in _items(message))


def _items(message: NeutralMessage) -> Iterator[dict[str, Any]]:
    if message.role == "tool":
        yield {
            "type": "function_call_output",
            "call_id": message.tool_call_id,
            "output": message.content,
        }
        return
    if message.images:
        yield {"type": "message", "role": message.role, "content": _parts(message)}
    elif message.content or not message.tool_calls:
        yield {"type": "message", "role": message.role, "content": message.content}
    for call in message.tool_calls:
        yield {
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
        }


def _parts(message: NeutralMessage) -> list[dict[str, Any]]:
    """A user message with images as input parts: its text, then each image."""
    parts: list[dict[str, Any]] = []
    if message.content:
        parts.append({"type": "input_text", "text": message.content})
    parts.extend(
        {"type": "input_image", "image_url": image.data_url, "detail": "auto"}
        for image in message.images
    )
    return parts


def parse_usage(usage: Any) -> Usage | None:
    """The usage of a ``ResponseUsage`` (None when the server reported none)."""
    if usage is None:
        return None
    prompt = getattr(usage, "input_tokens_details", None)
    output = getattr(usage, "output_tokens_details", None)
    return Usage(
        input_tokens=getattr(usage, "input_tokens", None) or 0,
        output_tokens=getattr(usage, "output_tokens", None) or 0,
        cached_input_tokens=getattr(prompt, "cached_tokens", None),
        cache_write_tokens=getattr(prompt, "cache_write_tokens", None),
        reasoning_tokens=getattr(output, "reasoning_tokens", None),
    )


def parse_response(response: Any) -> ModelOutput:
    """The output of a whole ``Response``: its output text and function calls."""
    text: list[str] = []
    calls: list[ToolCall] = []
    for item in response.output:
        if item.type == "message":
            text.extend(
                part.text for part in item.content if getattr(part, "type", "") == "output_text"
            )
        elif item.type == "function_call":
            calls.append(ToolCall(id=item.call_id, name=item.name, arguments=item.arguments or ""))
    return ModelOutput(
        text="".join(text),
        tool_calls=tuple(calls),
        usage=parse_usage(getattr(response, "usage", None)),
        finish_reason=response.status or "completed",
        response_id=_text_or_none(getattr(response, "id", None)),
        response_model=_text_or_none(getattr(response, "model", None)),
    )


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class StreamReader:
    """Reads a streamed answer: :meth:`feed` each event in order (it returns the text
    fragments to show as they come), then :meth:`result`."""

    def __init__(self) -> None:
        self._completed: ModelOutput | None = None

    @property
    def done(self) -> bool:
        """True once ``response.completed`` arrived: nothing after it changes the answer."""
        return self._completed is not None

    def feed(self, event: Any) -> tuple[tuple[str, str], ...]:
        """Take one ``ResponseStreamEvent``; returns its ``("text", fragment)`` deltas."""
        if event.type == "response.output_text.delta":
            return (("text", event.delta),)
        if event.type == "response.completed":
            self._completed = parse_response(event.response)
        return ()

    def result(self) -> ModelOutput | None:
        """The answer ``response.completed`` carried; None when the stream had none."""
        return self._completed
