"""OpenAI Chat Completions: the request body from a `NeutralRequest`, and the answer back.

Request: roles map one to one: the protocol system text is the first ``system`` message, later
``system`` and ``developer`` messages keep their native roles, ``tool`` messages carry
``tool_call_id`` and directly follow the assistant message that made the calls; a user
message with images sends its text and an ``image_url`` part per image. Structured
output is ``response_format`` (``json_schema`` with its name, schema and ``strict``). No
``cache_control`` or other unknown field is sent: OpenAI caches prefixes automatically.

Answer: :func:`parse_response` reads a whole ``ChatCompletion``, :class:`StreamReader` a
stream of ``ChatCompletionChunk`` (fed one chunk at a time), and :func:`parse_usage` maps
``CompletionUsage``: ``prompt_tokens`` is already the whole prompt, its details give the
cache reads and writes, and ``completion_tokens`` includes the reasoning tokens. All pure:
the client does the I/O. OpenAI-compatible servers omit fields freely, so every optional
field is read as absent when missing.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..wire import ModelOutput, NeutralMessage, NeutralRequest, ToolCall, Usage, WrittenArray
from .assembly import Unassembled, assemble
from .pairing import order_tool_results

__all__ = ["StreamReader", "parse_response", "parse_usage", "render_openai_chat"]


def render_openai_chat(
    request: NeutralRequest, previous: WrittenArray | None = None
) -> dict[str, Any]:
    """The Chat Completions body as a fresh dict, its ``messages`` array serialized here (a
    ``JsonArray`` assembled from what is new since ``previous``, see ``assembly``). Raises
    RenderError on bad tool pairing."""
    body: dict[str, Any] = {"model": request.model}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.arguments_schema(),
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
    output = request.output_schema
    if output is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": output.name,
                "schema": output.answer_schema(),
                "strict": output.strict,
            },
        }
    # The growing history goes last, after everything that stays the same across requests.
    body["messages"] = _messages(request, previous)
    return body


def _messages(request: NeutralRequest, previous: WrittenArray | None) -> Any:
    """The messages array: assembled, or plain dicts when it cannot be (then the plain path
    raises the error: broken pairing here, a value that is not JSON when it is encoded)."""
    leading = [{"role": "system", "content": request.system}] if request.system else []
    if request.messages:
        try:
            lead = tuple(orjson.dumps(m) for m in leading)
            return assemble(request.messages, _units, lead, previous)
        except (Unassembled, TypeError):
            pass
    return [*leading, *(_message(m) for m in order_tool_results(request.messages))]


def _units(message: NeutralMessage) -> tuple[bytes, ...]:
    return (orjson.dumps(_message(message)),)


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
    if message.images:
        return {"role": message.role, "content": _parts(message)}
    return {"role": message.role, "content": message.content}


def _parts(message: NeutralMessage) -> list[dict[str, Any]]:
    """A user message with images as content parts: its text, then each image."""
    parts: list[dict[str, Any]] = []
    if message.content:
        parts.append({"type": "text", "text": message.content})
    parts.extend(
        {"type": "image_url", "image_url": {"url": image.data_url}} for image in message.images
    )
    return parts


def parse_usage(usage: Any) -> Usage | None:
    """The usage of a ``CompletionUsage`` (None when the server reported none)."""
    if usage is None:
        return None
    prompt = getattr(usage, "prompt_tokens_details", None)
    completion = getattr(usage, "completion_tokens_details", None)
    return Usage(
        input_tokens=getattr(usage, "prompt_tokens", None) or 0,
        output_tokens=getattr(usage, "completion_tokens", None) or 0,
        cached_input_tokens=getattr(prompt, "cached_tokens", None),
        cache_write_tokens=getattr(prompt, "cache_write_tokens", None),
        reasoning_tokens=getattr(completion, "reasoning_tokens", None),
    )


def parse_response(response: Any) -> ModelOutput:
    """The output of a whole ``ChatCompletion`` (its first choice)."""
    choice = response.choices[0]
    calls = tuple(
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "")
        for c in (choice.message.tool_calls or ())
    )
    return ModelOutput(
        text=choice.message.content or "",
        tool_calls=calls,
        usage=parse_usage(getattr(response, "usage", None)),
        finish_reason=choice.finish_reason or "stop",
        response_id=_text_or_none(getattr(response, "id", None)),
        response_model=_text_or_none(getattr(response, "model", None)),
    )


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class StreamReader:
    """Reads a streamed answer: :meth:`feed` each chunk in order (it returns the text
    fragments to show as they come), then :meth:`result`."""

    done = False
    """Chat streams have no final event (usage comes after the finish reason): read to the end."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}
        self._usage: Any = None
        self._finish = "stop"
        self._id: str | None = None
        self._model: str | None = None

    def feed(self, chunk: Any) -> tuple[tuple[str, str], ...]:
        """Take one ``ChatCompletionChunk``; returns its ``("text", fragment)`` deltas."""
        deltas: list[tuple[str, str]] = []
        if getattr(chunk, "usage", None) is not None:
            self._usage = chunk.usage  # the last chunk, when include_usage asked for it
        self._id = self._id or _text_or_none(getattr(chunk, "id", None))
        self._model = self._model or _text_or_none(getattr(chunk, "model", None))
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                self._text.append(delta.content)
                deltas.append(("text", delta.content))
            for call in delta.tool_calls or ():
                slot = self._calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                if call.id:
                    slot["id"] = call.id
                if call.function is not None:
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
            if choice.finish_reason:
                self._finish = choice.finish_reason
        return tuple(deltas)

    def result(self) -> ModelOutput:
        """The whole answer fed so far. Raises ValidationError for a call without id or name."""
        return ModelOutput(
            text="".join(self._text),
            tool_calls=tuple(ToolCall(**self._calls[i]) for i in sorted(self._calls)),
            usage=parse_usage(self._usage),
            finish_reason=self._finish,
            response_id=self._id,
            response_model=self._model,
        )
