"""Anthropic Messages: the request body from a `NeutralRequest`, and the answer back.

Request role mapping (Anthropic has no developer role and only a top-level ``system``):

- The protocol system text, then the leading run of ``system`` and ``developer``
  messages (those before any user, assistant or tool message), become the text blocks
  of the ``system`` parameter. Nothing is reordered: they already come first.
- No system precedence mid-history on Anthropic: a ``system`` or ``developer`` message
  after history has started becomes ``user`` text, preceded by its own marker text block
  (`DEMOTED_MARKERS`). Moving it into ``system`` would reorder the conversation and
  rewrite the cached prefix of every later request. The marker is a separate block so
  the message's text block still starts with its own first line (an item's header).
- ``assistant`` tool calls become ``tool_use`` blocks (``input`` is the parsed arguments
  object); ``tool`` messages become ``tool_result`` blocks in the user turn that directly
  follows, ahead of any text in that turn, as the API requires.
- A user message's images become ``image`` blocks after its text (``base64`` or ``url``
  source).
- Consecutive turns of one wire role merge into one message with several blocks, so
  user and assistant strictly alternate. Empty text is not sent (the API refuses it).

Structured output: ``output_config.format`` (``json_schema`` with the schema only).

Sampling: ``temperature`` is never sent. The API version the official SDK 2.x sends
(``2026-10-21``) refuses every sampling parameter with HTTP 400, and the SDK no longer
accepts one, so a body carrying it could not pass through the client.

Prompt caching: ``cache_control: {"type": "ephemeral"}`` marks the system parameter's
last block, the last block of every message with ``cache_breakpoint=True`` and the last
block of the final message. The API allows at most `MAX_CACHE_BREAKPOINTS`; when more
are marked, the latest ones are kept, which always keeps the tail and the last prefix
marker and drops the earliest others.

Answer: :func:`parse_response` reads a whole ``Message``, :class:`StreamReader` a stream
of ``RawMessageStreamEvent``, and :func:`parse_usage` maps Anthropic's usage reports.
Anthropic counts the prompt in three parts (uncached ``input_tokens``, cache reads and
cache writes): the whole prompt is their sum, the reads and writes its breakdowns;
``output_tokens`` includes the thinking tokens, reported as the reasoning part. All pure:
the client does the I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..canonical import loads
from ..errors import RenderError
from ..wire import (
    ImagePart,
    ModelOutput,
    NeutralMessage,
    NeutralRequest,
    ToolCall,
    Usage,
    WrittenArray,
)
from .pairing import order_tool_results

__all__ = [
    "DEMOTED_MARKERS",
    "MAX_CACHE_BREAKPOINTS",
    "StreamReader",
    "parse_response",
    "parse_usage",
    "render_anthropic",
]

MAX_CACHE_BREAKPOINTS = 4
"""Anthropic's limit on ``cache_control`` blocks per request."""

DEMOTED_MARKERS: dict[str, str] = {
    "system": "[system message]",
    "developer": "[developer message]",
}
"""The text block put before mid-history system/developer content sent as user text."""

_EPHEMERAL = {"type": "ephemeral"}


@dataclass(slots=True)
class _Block:
    data: dict[str, Any]
    breakpoint: bool = False


@dataclass(slots=True)
class _Turn:
    role: str
    blocks: list[_Block]


def render_anthropic(
    request: NeutralRequest, previous: WrittenArray | None = None
) -> dict[str, Any]:
    """The Messages body as a fresh dict, built whole: ``previous`` is not read (turns merge
    across messages and the cache markers move with each request).

    Raises RenderError when ``max_tokens`` is missing, no user or assistant message
    remains, tool pairing is broken, or tool call arguments are not a JSON object.
    """
    if request.max_tokens is None:
        raise RenderError("NeutralRequest.max_tokens is required for anthropic; set it")
    messages = order_tool_results(request.messages)
    system: list[_Block] = []
    if request.system:
        system.append(_Block(_text(request.system)))
    start = 0
    while start < len(messages) and messages[start].role in ("system", "developer"):
        _add(system, _text_blocks(messages[start].content), messages[start].cache_breakpoint)
        start += 1
    if system:
        system[-1].breakpoint = True

    turns: list[_Turn] = []
    for message in messages[start:]:
        blocks = _blocks(message)
        if not blocks:
            if message.cache_breakpoint:
                # Nothing to send: the segment ends where the previous block ends.
                last = turns[-1].blocks if turns else system
                if last:
                    last[-1].breakpoint = True
            continue
        role = "assistant" if message.role == "assistant" else "user"
        if not turns or turns[-1].role != role:
            turns.append(_Turn(role, []))
        _add(turns[-1].blocks, blocks, message.cache_breakpoint)
    if not turns:
        raise RenderError(
            "anthropic needs at least one user, assistant or tool message after the "
            "leading system/developer messages"
        )
    for turn in turns:
        if turn.role == "user":
            # tool_result blocks must open the user turn after a tool_use turn.
            turn.blocks.sort(key=lambda block: block.data["type"] != "tool_result")
    turns[-1].blocks[-1].breakpoint = True
    _limit_breakpoints([*system, *(block for turn in turns for block in turn.blocks)])

    # Provider read order (tools, system, messages), the growing history last: a request's
    # bytes then extend the previous one's as far as its content does.
    body: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens}
    if request.stream:
        body["stream"] = True
    if request.tools:
        body["tools"] = [
            {
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.arguments_schema(),
            }
            for tool in request.tools
        ]
    if request.output_schema is not None:
        # Anthropic's structured output: the schema alone (it has no name or strict flag).
        format_ = {"type": "json_schema", "schema": request.output_schema.answer_schema()}
        body["output_config"] = {"format": format_}
    if system:
        body["system"] = [_emit(block) for block in system]
    body["messages"] = [
        {"role": turn.role, "content": [_emit(block) for block in turn.blocks]} for turn in turns
    ]
    return body


def _blocks(message: NeutralMessage) -> list[_Block]:
    if message.role == "tool":
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
        if message.content:
            result["content"] = message.content
        return [_Block(result)]
    if message.role in DEMOTED_MARKERS:
        if not message.content:
            return []
        # Its own block: the content's block keeps its first line (an item header) first.
        return [_Block(_text(DEMOTED_MARKERS[message.role])), _Block(_text(message.content))]
    blocks = _text_blocks(message.content)
    blocks.extend(_Block(_image(image)) for image in message.images)
    blocks.extend(_Block(_tool_use(call)) for call in message.tool_calls)
    return blocks


def _image(image: ImagePart) -> dict[str, Any]:
    if image.data is not None:
        source = {"type": "base64", "media_type": image.media_type, "data": image.data}
    else:
        source = {"type": "url", "url": image.data_url}
    return {"type": "image", "source": source}


def _tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = loads(call.arguments) if call.arguments.strip() else {}
    except ValueError as exc:
        raise RenderError(
            f"tool_call_id {call.id!r}: arguments are not valid JSON; anthropic needs an object"
        ) from exc
    if not isinstance(arguments, dict):
        raise RenderError(
            f"tool_call_id {call.id!r}: arguments are JSON {type(arguments).__name__}, "
            "anthropic needs an object"
        )
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _text_blocks(text: str) -> list[_Block]:
    return [_Block(_text(text))] if text else []


def _add(target: list[_Block], blocks: list[_Block], breakpoint: bool) -> None:
    if breakpoint:
        if blocks:
            blocks[-1].breakpoint = True
        elif target:
            target[-1].breakpoint = True
    target.extend(blocks)


def _limit_breakpoints(blocks: list[_Block]) -> None:
    marked = [block for block in blocks if block.breakpoint]
    for block in marked[:-MAX_CACHE_BREAKPOINTS]:
        block.breakpoint = False


def _emit(block: _Block) -> dict[str, Any]:
    if block.breakpoint:
        return {**block.data, "cache_control": dict(_EPHEMERAL)}
    return dict(block.data)


_PROMPT = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def parse_usage(reports: Iterable[Any]) -> Usage | None:
    """The usage of one answer from its reports in order (in a stream, the ``message_start``
    one then ``message_delta`` ones); None when there is none. Later reports are cumulative:
    each field takes the last value given."""
    fields: dict[str, Any] = dict.fromkeys((*_PROMPT, "output_tokens", "thinking_tokens"))
    reports = [report for report in reports if report is not None]
    if not reports:
        return None
    for report in reports:
        for name in (*_PROMPT, "output_tokens"):
            value = getattr(report, name, None)
            if value is not None:
                fields[name] = value
        thinking = getattr(getattr(report, "output_tokens_details", None), "thinking_tokens", None)
        if thinking is not None:
            fields["thinking_tokens"] = thinking
    return Usage(
        input_tokens=sum(fields[name] or 0 for name in _PROMPT),
        output_tokens=fields["output_tokens"] or 0,
        cached_input_tokens=fields["cache_read_input_tokens"],
        cache_write_tokens=fields["cache_creation_input_tokens"],
        reasoning_tokens=fields["thinking_tokens"],
    )


def parse_response(response: Any) -> ModelOutput:
    """The output of a whole ``Message``: its text blocks and tool uses."""
    text = "".join(block.text for block in response.content if block.type == "text")
    calls = tuple(
        # Sorted keys: the arguments text is recorded, and a dict has no wire order of its own.
        ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input, sort_keys=True))
        for block in response.content
        if block.type == "tool_use"
    )
    return ModelOutput(
        text=text,
        tool_calls=calls,
        usage=parse_usage([response.usage]),
        finish_reason=response.stop_reason or "end_turn",
        response_id=_text_or_none(getattr(response, "id", None)),
        response_model=_text_or_none(getattr(response, "model", None)),
    )


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class StreamReader:
    """Reads a streamed answer: :meth:`feed` each event in order (it returns the text
    fragments to show as they come), then :meth:`result`."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}
        self._reports: list[Any] = []
        self._stop = "end_turn"
        self._id: str | None = None
        self._model: str | None = None
        self.done = False  # message_stop arrived: nothing after it changes the answer

    def feed(self, event: Any) -> tuple[tuple[str, str], ...]:
        """Take one ``RawMessageStreamEvent``; returns its ``("text", fragment)`` deltas."""
        kind = event.type
        if kind == "message_start":
            self._reports.append(event.message.usage)
            self._id = _text_or_none(getattr(event.message, "id", None))
            self._model = _text_or_none(getattr(event.message, "model", None))
        elif kind == "content_block_start" and event.content_block.type == "tool_use":
            block = event.content_block
            self._calls[event.index] = {"id": block.id, "name": block.name, "arguments": ""}
        elif kind == "content_block_delta":
            if event.delta.type == "text_delta":
                self._text.append(event.delta.text)
                return (("text", event.delta.text),)
            if event.delta.type == "input_json_delta" and event.index in self._calls:
                self._calls[event.index]["arguments"] += event.delta.partial_json
        elif kind == "message_delta":
            self._reports.append(event.usage)
            self._stop = event.delta.stop_reason or self._stop
        elif kind == "message_stop":
            self.done = True
        return ()

    def result(self) -> ModelOutput:
        """The whole answer fed so far."""
        return ModelOutput(
            text="".join(self._text),
            tool_calls=tuple(ToolCall(**self._calls[i]) for i in sorted(self._calls)),
            usage=parse_usage(self._reports),
            finish_reason=self._stop,
            response_id=self._id,
            response_model=self._model,
        )
