"""A pydantic-ai history in the terms of contextfold's call records (``context.calls``).

Each ``ModelMessage`` is one :class:`~contextfold.context.call_records.Message`: its JSON as
``ModelMessagesTypeAdapter`` dumps it and a readable form. A ``ModelRequest`` holding tool
results (a ``ToolReturnPart``, a legacy ``RetryPromptPart`` naming a tool) reads as a tool
message answering every call it holds results for, so a response's ``ToolCallPart``\\ s and
the request answering them are one unit to the pair-safe view.

The first request's leading trusted ``SystemPromptPart``\\ s (the agent's system prompt) are
a message of their own, role system, so that trimming and compaction keep them first while
the user prompt after them may go; :func:`outgoing` joins them back: to the rest of that
request when both are sent (the request as pydantic-ai made it), else to the request sent
next (a summary, or the oldest request kept). A ``SystemPromptPart`` marked with an
untrusted actor is sent as a user prompt naming the actor (``_pydantic_ai_window``). Pure
functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage

from ..context.call_records import Message
from ..context.calls import CallTool, Readable, message_digest, summary_text
from ..context.trust import is_trusted, trusted_extensions
from ..wire import Usage
from ._pydantic_ai_window import actor_of, downgraded

__all__ = [
    "Count",
    "History",
    "Unit",
    "answer_of",
    "approx_count",
    "approx_tokens",
    "history_of",
    "outgoing",
    "readable_of",
    "summary_of",
    "usage_of",
]

_SUMMARY_TIME = datetime(1970, 1, 1, tzinfo=UTC)
"""The timestamp of a summary's prompt part: fixed, so a summary is one message however
often it is sent (timestamps never reach a model)."""


@dataclass(frozen=True, slots=True)
class Unit:
    """What one message of the history given became: its pieces (two for a split first
    request), each an engine message with its tokens."""

    source: ModelMessage
    whole: ModelMessage
    """The message as it goes out whole (its untrusted system prompts downgraded)."""
    objects: tuple[ModelMessage, ...]
    messages: tuple[Message, ...]
    tokens: tuple[float, ...]
    downgraded: int


@dataclass(frozen=True, slots=True)
class History:
    """A pydantic-ai history as the call engine reads it: ``messages[i]`` is ``objects[i]``
    and weighs ``tokens[i]``."""

    units: tuple[Unit, ...]
    messages: tuple[Message, ...]
    objects: tuple[ModelMessage, ...]
    tokens: tuple[float, ...]
    first: ModelRequest | None
    """The first request as given, when its system prompt is ``objects[0]`` and the rest of
    it ``objects[1]``; None when it was not split."""
    downgraded: int
    """Untrusted system prompt parts sent as user prompts."""


Count = Callable[[ModelMessage, Message], float]
"""The tokens of one piece: its pydantic-ai message and its engine message."""


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(item for item in content if isinstance(item, str))
    return ""


def _request_readable(message: ModelRequest, actor: str | None) -> Readable:
    answers: list[str] = []
    texts: list[str] = []
    name: str | None = None
    system = bool(message.parts)
    for part in message.parts:
        kind = part.part_kind
        system = system and kind == "system-prompt"
        if isinstance(part, ToolReturnPart):
            answers.append(part.tool_call_id)
            name = name or part.tool_name
            texts.append(part.model_response_str())
        elif kind == "retry-prompt" and getattr(part, "tool_name", None) is not None:
            answers.append(str(getattr(part, "tool_call_id", "")))
            name = name or str(getattr(part, "tool_name", ""))
            texts.append(str(part.model_response()))  # type: ignore[union-attr]
        elif isinstance(part, (SystemPromptPart, UserPromptPart)):
            texts.append(_text(part.content))
        elif kind in ("retry-prompt", "retry-feedback"):
            texts.append(str(part.model_response()))  # type: ignore[union-attr]
    text = "\n".join(t for t in texts if t)
    if answers:
        return Readable(
            role="tool",
            text=text,
            tool_call_id=answers[0],
            also_answers=tuple(answers[1:]),
            name=name,
            actor=actor,
        )
    return Readable(role="system" if system else "user", text=text, actor=actor)


def _response_readable(message: ModelResponse) -> Readable:
    calls = tuple(
        CallTool(id=part.tool_call_id, name=part.tool_name, arguments=part.args_as_json_str())
        for part in message.parts
        if isinstance(part, ToolCallPart)
    )
    text = "".join(part.content for part in message.parts if isinstance(part, TextPart))
    return Readable(role="assistant", text=text, tool_calls=calls)


def readable_of(message: ModelMessage, actor: str | None = None) -> Readable:
    """The readable form of one message (``actor``: who supplied its downgraded parts)."""
    if isinstance(message, ModelRequest):
        return _request_readable(message, actor)
    return _response_readable(message)


def _untrusted_actor(message: ModelRequest) -> str | None:
    for part in message.parts:
        if isinstance(part, SystemPromptPart):
            actor = actor_of(part)
            if actor is not None and not is_trusted(actor, trusted_extensions()):
                return actor.type
    return None


def _leading_system(first: ModelRequest) -> int:
    """How many of the first request's parts are its trusted system prompt, from the start."""
    count = 0
    for part in first.parts:
        if not isinstance(part, SystemPromptPart):
            break
        actor = actor_of(part)
        if actor is not None and not is_trusted(actor, trusted_extensions()):
            break
        count += 1
    return count


def _pieces(
    index: int, message: ModelMessage
) -> tuple[ModelMessage, list[ModelMessage], str | None, int]:
    """The message at ``index`` as it goes out whole, its pieces, the untrusted actor whose
    parts it sends as user prompts, and how many."""
    if not isinstance(message, ModelRequest):
        return message, [message], None, 0
    actor = _untrusted_actor(message)
    changed = 0
    if actor is not None:
        message, changed = downgraded(message)
    if index == 0:
        lead = _leading_system(message)
        if 0 < lead < len(message.parts):
            system = replace(message, parts=list(message.parts[:lead]))
            rest = replace(message, parts=list(message.parts[lead:]))
            return message, [system, rest], actor, changed
    return message, [message], actor, changed


def _unit(index: int, message: ModelMessage, count: Count) -> Unit:
    whole, objects, actor, changed = _pieces(index, message)
    dumped: list[Any] = ModelMessagesTypeAdapter.dump_python(objects, mode="json")
    messages = []
    for json, piece in zip(dumped, objects, strict=True):
        readable = readable_of(piece, actor if piece is objects[-1] else None)
        messages.append(Message(json, readable, message_digest(json)))
    tokens = tuple(float(count(o, m)) for o, m in zip(objects, messages, strict=True))
    return Unit(message, whole, tuple(objects), tuple(messages), tokens, changed)


def history_of(
    messages: Sequence[ModelMessage], *, count: Count, previous: History | None = None
) -> History:
    """The engine's view of ``messages`` (see the module), each piece weighed by
    ``count``. Raises InvalidInputError for a malformed actor marking.

    ``previous`` is a history this function returned for the same ``count``: each message
    equal to the one at its index there is taken from it as it was built (what it becomes
    depends on it and its index only), so a growing conversation builds its new messages
    only."""
    done = previous.units if previous is not None else ()
    units = [
        done[index]
        if index < len(done) and done[index].source == message
        else _unit(index, message, count)
        for index, message in enumerate(messages)
    ]
    first = units[0].whole if units and len(units[0].objects) == 2 else None
    return History(
        units=tuple(units),
        messages=tuple(m for unit in units for m in unit.messages),
        objects=tuple(o for unit in units for o in unit.objects),
        tokens=tuple(t for unit in units for t in unit.tokens),
        first=first if isinstance(first, ModelRequest) else None,
        downgraded=sum(unit.downgraded for unit in units),
    )


def approx_tokens(message: Message) -> float:
    """⌈length of the message's JSON / 4⌉: ``approx_message_tokens`` of the same message."""
    return float(math.ceil(len(orjson.dumps(message.json)) / 4))


def approx_count(_: ModelMessage, message: Message) -> float:
    """:func:`approx_tokens` as a :data:`Count`."""
    return approx_tokens(message)


def summary_of(text: str) -> tuple[ModelRequest, Message]:
    """The request a summary goes out as (a user prompt), and its engine message."""
    request = ModelRequest(parts=[UserPromptPart(summary_text(text), timestamp=_SUMMARY_TIME)])
    json = ModelMessagesTypeAdapter.dump_python([request], mode="json")[0]
    return request, Message(json, readable_of(request))


def outgoing(
    order: Sequence[int | None], history: History, summary: ModelRequest | None
) -> list[ModelMessage]:
    """The messages sent for the engine's ``order`` (indices into ``history``, None for
    the summary). Where the engine put two requests side by side that the history did not
    hold so (the system prompt before a summary, a summary before the oldest request kept),
    they go as one request, as pydantic-ai sends consecutive requests; the split first
    request sent whole is the request as given."""
    out: list[ModelMessage] = []
    for k, index in enumerate(order):
        message = summary if index is None else history.objects[index]
        if message is None:
            continue
        before = order[k - 1] if k else None
        if out and history.first is not None and before == 0 and index == 1:
            out[-1] = history.first
            continue
        adjacent = index is not None and before is not None and index == before + 1
        last = out[-1] if out else None
        if not adjacent and isinstance(last, ModelRequest) and isinstance(message, ModelRequest):
            out[-1] = replace(
                message,
                parts=[*last.parts, *message.parts],
                instructions=message.instructions or last.instructions,
            )
            continue
        out.append(message)
    return out


def usage_of(usage: RequestUsage) -> Usage:
    """pydantic-ai's usage of one request as contextfold's (breakdowns it reports as 0 are
    None: pydantic-ai does not tell 0 from unreported)."""
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_input_tokens=usage.cache_read_tokens or None,
        cache_write_tokens=usage.cache_write_tokens or None,
        reasoning_tokens=usage.output_reasoning_tokens or None,
    )


def answer_of(response: ModelResponse) -> Message:
    """A model's answer as an engine message."""
    json = ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]
    return Message(json, readable_of(response))
