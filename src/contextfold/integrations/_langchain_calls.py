"""LangChain's side of a recorded model call: its messages, request options, answer and usage
in contextfold's call records (:mod:`contextfold.context.calls`).

A message is recorded as LangChain's own JSON (``{"type": ..., "data": model_dump}``, what
``messages_from_dict`` reads back) with a readable form. Trust is decided here, once: a
system message marked as supplied by an untrusted actor (:func:`~contextfold.integrations.
langgraph.untrusted`) is converted to the human message it is sent as, before anything is
counted, digested or recorded, so no request can carry it with system precedence.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic_core import to_jsonable_python

from ..canonical import canonical_json, sha256_hex
from ..context.call_records import Message
from ..context.calls import CallTool, Readable, ReadableRole, summary_text
from ..context.trust import is_trusted, trusted_extensions
from ..wire import Usage
from ._langgraph_messages import _as_human, _system_like, actor_of

__all__ = [
    "FRAMEWORK",
    "Conversions",
    "Converted",
    "approx",
    "convert",
    "drop_unpaired",
    "model_name",
    "request_options",
    "summary_human",
    "usage_of",
]

FRAMEWORK = "langchain"
"""The framework name of every record this integration writes."""

Counter = Callable[[BaseMessage], float]


@dataclass(frozen=True, slots=True)
class Converted:
    """A message of the agent's history as one call uses it."""

    sent: BaseMessage
    """What the model is sent (an untrusted system message: as a human message)."""
    message: Message
    """Its JSON and readable form, for the call records."""
    sha256: str
    """``message_digest`` of its JSON."""
    tokens: float


def approx(canonical: bytes) -> float:
    """contextfold's ``approx_tokens`` of a value from its canonical JSON."""
    return float(math.ceil(len(canonical) / 4))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return orjson.dumps(content, default=str).decode()


def _readable(message: BaseMessage, role: ReadableRole, actor: str | None) -> Readable:
    if isinstance(message, AIMessage):
        calls = tuple(
            CallTool(
                id=call.get("id") or "",
                name=call["name"],
                arguments=orjson.dumps(call["args"], option=orjson.OPT_SORT_KEYS).decode(),
            )
            for call in message.tool_calls
        )
        return Readable(role="assistant", text=_text(message.content), tool_calls=calls)
    if isinstance(message, ToolMessage):
        return Readable(
            role="tool",
            text=_text(message.content),
            tool_call_id=message.tool_call_id,
            name=message.name,
            actor=actor,
        )
    return Readable(role=role, text=_text(message.content), actor=actor)


def _role(message: BaseMessage) -> ReadableRole:
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, ChatMessage):
        role = message.role
        return role if role in ("system", "developer", "assistant") else "user"  # type: ignore[return-value]
    return "user"


def convert(message: BaseMessage, count: Counter | None) -> Converted:
    """``message`` as a call sends and records it (``count``: the user's token counter;
    None: contextfold's ``approx_tokens`` of its JSON). Raises InvalidInputError for a
    malformed actor marking, PayloadError for content JSON cannot carry."""
    marked = actor_of(message)
    actor = None if marked is None else marked.type
    sent = message
    if _system_like(message) and not is_trusted(marked, trusted_extensions()):
        sent = _as_human(message)
    role = "user" if sent is not message else _role(message)
    json = {"type": sent.type, "data": sent.model_dump(mode="json")}
    canonical = canonical_json(json)
    tokens = approx(canonical) if count is None else count(sent)
    readable = _readable(sent, role, actor)
    digest = sha256_hex(canonical)
    return Converted(sent, Message(json, readable, digest), digest, tokens)


class Conversions:
    """The conversion memo of one middleware: each message's :class:`Converted` by its
    LangChain id (``add_messages`` gives every message of an agent's state one), reused only
    while the message equals the deep copy it was converted from, so a message replaced
    under its id or changed in place is converted again. System messages are converted on
    every call (whether their actor is trusted is decided when they are sent). Holds the
    ``size`` most recently used messages; thread-safe.

    Why: a model call converts the agent's whole history (its JSON, digest, readable form
    and tokens), and a long tool-heavy session made that conversion most of the
    middleware's cost per call, growing with the session."""

    def __init__(self, count: Counter | None, *, size: int = 16_384) -> None:
        self._count = count
        self._size = size
        self._entries: OrderedDict[str, tuple[BaseMessage, Converted]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, messages: Sequence[BaseMessage]) -> list[Converted]:
        """Each of ``messages`` converted; equal to ``[convert(m, count) for m in
        messages]``."""
        out: list[Converted] = []
        entries = self._entries
        with self._lock:
            for message in messages:
                key = message.id
                if key is None or _system_like(message):
                    out.append(convert(message, self._count))
                    continue
                hit = entries.get(key)
                if hit is not None and hit[0] == message:
                    entries.move_to_end(key)
                    done = hit[1]
                    if done.sent is not message:
                        done = Converted(message, done.message, done.sha256, done.tokens)
                    out.append(done)
                    continue
                done = convert(message, self._count)
                entries[key] = (message.model_copy(deep=True), done)
                entries.move_to_end(key)
                if len(entries) > self._size:
                    entries.popitem(last=False)
                out.append(done)
        return out


def drop_unpaired(history: Sequence[Converted]) -> list[Converted]:
    """``history`` without what a provider refuses: an assistant message whose tool calls
    are not all answered after it (with its results), and a tool result answering no
    earlier call."""
    made: dict[str, int] = {}
    pending: set[str] = set()
    orphans = False
    for index, item in enumerate(history):
        readable = item.message.readable
        answers = readable.tool_call_id
        if answers is not None:
            if answers in made:
                pending.discard(answers)
            else:
                orphans = True
        for call in readable.tool_calls:
            made[call.id] = index
            pending.add(call.id)
    if not orphans and not pending:
        return list(history)
    dropped = {made[call] for call in pending}
    kept: list[Converted] = []
    for index, item in enumerate(history):
        answers = item.message.readable.tool_call_id
        if index in dropped:
            continue
        if answers is not None:
            maker = made.get(answers)
            if maker is None or maker > index or maker in dropped:
                continue
        kept.append(item)
    return kept


def _jsonable(value: Any) -> Any:
    return to_jsonable_python(value, fallback=repr)


def _tool_json(tool: BaseTool | dict[str, Any]) -> Any:
    if isinstance(tool, BaseTool):
        return convert_to_openai_tool(tool)
    return _jsonable(tool)


def request_options(
    system: SystemMessage | None,
    tools: Sequence[BaseTool | dict[str, Any]],
    tool_choice: Any,
    settings: dict[str, Any],
    response_format: Any,
) -> dict[str, Any]:
    """A request's options as JSON: the system message (LangChain's JSON), the tools as
    JSON schemas (OpenAI's function form for LangChain tools, provider tools as given),
    the tool choice, the model settings and the response format, each when set."""
    options: dict[str, Any] = {}
    if system is not None:
        options["system"] = {"type": system.type, "data": system.model_dump(mode="json")}
    if tools:
        options["tools"] = [_tool_json(tool) for tool in tools]
    if tool_choice is not None:
        options["tool_choice"] = _jsonable(tool_choice)
    if settings:
        options["settings"] = _jsonable(settings)
    if response_format is not None:
        options["response_format"] = _jsonable(response_format)
    return options


def model_name(model: Any) -> str:
    """The name a chat model reports (``model_name``, ``model`` or ``model_id``), else its
    class name."""
    for attribute in ("model_name", "model", "model_id"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


def usage_of(message: AIMessage) -> Usage | None:
    """An answer's ``usage_metadata`` as contextfold's Usage (None when it has none)."""
    usage = message.usage_metadata
    if not usage:
        return None
    inputs = usage.get("input_token_details") or {}
    outputs = usage.get("output_token_details") or {}
    return Usage(
        input_tokens=max(usage.get("input_tokens") or 0, 0),
        output_tokens=max(usage.get("output_tokens") or 0, 0),
        cached_input_tokens=inputs.get("cache_read"),
        cache_write_tokens=inputs.get("cache_creation"),
        reasoning_tokens=outputs.get("reasoning"),
    )


def summary_human(summary: str) -> HumanMessage:
    """The human message a summary goes out as (a faithful summary may quote untrusted
    text: never as system), marked as LangChain marks a conversation summary the user did
    not type (``lc_source``, which its chat models do not send)."""
    return HumanMessage(
        content=summary_text(summary), additional_kwargs={"lc_source": "summarization"}
    )
