"""ADK's model requests in the terms of contextfold's call records (``context.calls``).

Each ``types.Content`` of an ``LlmRequest`` is one
:class:`~contextfold.context.call_records.Message`: its JSON
(``model_dump(mode="json", exclude_none=True)``) and a readable form. A model content's
``function_call`` parts are its tool calls; a content holding ``function_response`` parts is
a tool message answering each of them, so a call and its response go together in the
pair-safe view. ADK leaves its own call ids out of requests to most models: a call without
an id is known by its function's name, and ADK places each response right after its call.

Trust: an ADK event whose ``custom_metadata`` marks it as supplied by an untrusted actor
(:func:`untrusted_metadata`, ``custom_metadata["contextfold_actor"]``) has its content sent
as a user content whose first line names the actor: never with system precedence (ADK has
none in contents) nor as the model's own words. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from google.adk.events.event import Event
from google.adk.models.llm_request import LlmRequest
from google.genai import types
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ..context.call_records import Message
from ..context.calls import CallTool, Readable, message_digest, summary_text
from ..context.events import Actor
from ..context.trust import is_trusted, trusted_extensions
from ..errors import InvalidInputError
from ..wire import Usage
from ._actors import ACTOR_KEY, actor_header, marked_actor, untrusted_actor

__all__ = [
    "Count",
    "History",
    "Marked",
    "answer_of",
    "approx_count",
    "approx_json_tokens",
    "check_count",
    "history_of",
    "marked_contents",
    "options_of",
    "readable_of",
    "summary_of",
    "untrusted_content",
    "untrusted_metadata",
    "usage_of",
]

Count = Callable[[types.Content], float]
"""Sizes one content in tokens."""


def _json(content: types.Content) -> dict[str, Any]:
    dumped: dict[str, Any] = content.model_dump(mode="json", exclude_none=True)
    return dumped


def approx_json_tokens(value: Any) -> float:
    """⌈length of ``value``'s JSON / 4⌉."""
    return float(math.ceil(len(orjson.dumps(value)) / 4))


def approx_count(content: types.Content) -> float:
    """⌈length of the content's JSON / 4⌉: the default counter."""
    return approx_json_tokens(_json(content))


# -- readable forms ----------------------------------------------------------------------------


def _arguments(args: object) -> str:
    try:
        return orjson.dumps(args or {}, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return orjson.dumps(to_jsonable_python(args, fallback=repr)).decode()


def readable_of(content: types.Content, actor: str | None = None) -> Readable:
    """The readable form of one content (``actor``: who supplied it, when marked)."""
    parts = content.parts or []
    texts = [part.text for part in parts if part.text and not part.thought]
    if content.role == "model":
        calls = tuple(
            CallTool(
                id=part.function_call.id or part.function_call.name or "",
                name=part.function_call.name or "",
                arguments=_arguments(part.function_call.args),
            )
            for part in parts
            if part.function_call is not None
        )
        return Readable(role="assistant", text="".join(texts), tool_calls=calls, actor=actor)
    responses = [part.function_response for part in parts if part.function_response is not None]
    if responses:
        ids = [r.id or r.name or "" for r in responses]
        texts += [_arguments(r.response) for r in responses]
        return Readable(
            role="tool",
            text="\n".join(texts),
            tool_call_id=ids[0],
            also_answers=tuple(ids[1:]),
            name=responses[0].name,
            actor=actor,
        )
    return Readable(role="user", text="\n".join(texts), actor=actor)


# -- trust -------------------------------------------------------------------------------------


def untrusted_metadata(actor: str, id: str | None = None) -> dict[str, Any]:
    """The ``custom_metadata`` marking an event as supplied by an untrusted ``actor``: give
    it to ``Event(custom_metadata=...)``, or to ``RunConfig(custom_metadata=...)`` for a run
    whose new message came from outside (ADK copies it onto that message's event). Raises
    InvalidInputError for a malformed or trusted actor type."""
    marked = untrusted_actor(actor, id, what="untrusted_metadata()")
    return {ACTOR_KEY: marked.model_dump(exclude_none=True)}


def untrusted_content(text: str, *, actor: str, id: str | None = None) -> types.Content:
    """External text (a Slack message, an email, a webhook body) as a user content whose
    first line names its actor. Raises InvalidInputError for a malformed or trusted actor
    type."""
    marked = untrusted_actor(actor, id, what="untrusted_content()")
    return types.Content(role="user", parts=[types.Part(text=f"{actor_header(marked)}\n{text}")])


@dataclass(frozen=True, slots=True)
class Marked:
    """The content of an event marked as external, as JSON, and who supplied it."""

    json: dict[str, Any]
    actor: Actor


def marked_contents(events: Iterable[Event]) -> list[Marked]:
    """The contents of the session's events marked with an untrusted actor (events with
    function calls or responses are tools' and the model's: never changed). Raises
    InvalidInputError for a marking that is no actor."""
    found: list[Marked] = []
    for event in events:
        metadata = event.custom_metadata
        if not metadata or ACTOR_KEY not in metadata or event.content is None:
            continue
        actor = marked_actor(
            metadata[ACTOR_KEY],
            where=f"event {event.id!r}: custom_metadata[{ACTOR_KEY!r}]",
            how="mark events with custom_metadata=untrusted_metadata(actor=...)",
        )
        parts = event.content.parts or []
        if is_trusted(actor, trusted_extensions()) or any(
            p.function_call or p.function_response for p in parts
        ):
            continue
        found.append(Marked(_json(event.content), actor))
    return found


def _downgraded(content: types.Content, actor: Actor) -> types.Content:
    """``content`` as a user content led by the actor's header line (once)."""
    header = actor_header(actor)
    parts = list(content.parts or [])
    first = parts[0] if parts else None
    if first is not None and first.text is not None and not first.thought:
        if first.text != header and not first.text.startswith(header + "\n"):
            parts[0] = first.model_copy(update={"text": f"{header}\n{first.text}"})
    else:
        parts.insert(0, types.Part(text=header))
    return types.Content(role="user", parts=parts)


# -- histories ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class History:
    """A request's contents as the call engine reads them: ``messages[i]`` is
    ``contents[i]`` as sent (marked ones downgraded) and weighs ``tokens[i]``."""

    sources: tuple[types.Content, ...]
    contents: tuple[types.Content, ...]
    messages: tuple[Message, ...]
    tokens: tuple[float, ...]
    marked: tuple[Marked, ...]
    """The marked contents it was built with."""

    @property
    def downgraded(self) -> int:
        """How many contents go out as an untrusted actor's user content."""
        return sum(1 for message in self.messages if message.readable.actor is not None)


def _built(
    content: types.Content, marked: Sequence[Marked], count: Count
) -> tuple[types.Content, Message, float]:
    json = _json(content)
    for mark in marked:
        if mark.json == json:
            sent = _downgraded(content, mark.actor)
            downgraded = _json(sent)
            message = Message(
                downgraded, readable_of(sent, mark.actor.type), message_digest(downgraded)
            )
            return sent, message, float(count(sent))
    return content, Message(json, readable_of(content), message_digest(json)), float(count(content))


def history_of(
    contents: Sequence[types.Content],
    *,
    marked: Sequence[Marked] = (),
    count: Count = approx_count,
    previous: History | None = None,
) -> History:
    """The engine's view of ``contents``. ``previous``: a history this function returned
    for the same ``count``; when it was built with the same ``marked``, a content equal to
    the one at its index there is taken from it as it was built."""
    reuse = previous if previous is not None and previous.marked == tuple(marked) else None
    sent: list[types.Content] = []
    messages: list[Message] = []
    tokens: list[float] = []
    for index, content in enumerate(contents):
        if reuse is not None and index < len(reuse.sources) and reuse.sources[index] == content:
            sent.append(reuse.contents[index])
            messages.append(reuse.messages[index])
            tokens.append(reuse.tokens[index])
            continue
        built, message, weight = _built(content, marked, count)
        sent.append(built)
        messages.append(message)
        tokens.append(weight)
    return History(tuple(contents), tuple(sent), tuple(messages), tuple(tokens), tuple(marked))


def summary_of(text: str) -> tuple[types.Content, Message]:
    """The user content a summary goes out as, and its engine message."""
    content = types.Content(role="user", parts=[types.Part(text=summary_text(text))])
    return content, Message(_json(content), readable_of(content))


def answer_of(content: types.Content) -> Message:
    """A model's answer as an engine message."""
    return Message(_json(content), readable_of(content))


# -- options and usage -------------------------------------------------------------------------


def options_of(request: LlmRequest) -> dict[str, Any]:
    """What a request sends besides its contents, as JSON: its model and its config (system
    instruction, tools' declarations, generation settings)."""
    config: Any = None
    if request.config is not None:
        try:
            config = request.config.model_dump(mode="json", exclude_none=True)
        except PydanticSerializationError:  # a value no encoder knows: its repr
            config = to_jsonable_python(request.config, fallback=repr, exclude_none=True)
    return {"model": request.model, "config": config}


def usage_of(metadata: types.GenerateContentResponseUsageMetadata | None) -> Usage | None:
    """Gemini's usage of one call as contextfold's (output with the thinking tokens)."""
    if metadata is None:
        return None
    thoughts = metadata.thoughts_token_count
    return Usage(
        input_tokens=metadata.prompt_token_count or 0,
        output_tokens=(metadata.candidates_token_count or 0) + (thoughts or 0),
        cached_input_tokens=metadata.cached_content_token_count,
        reasoning_tokens=thoughts,
    )


def check_count(count: object) -> Count:
    """``count`` when it is callable. Raises InvalidInputError otherwise."""
    if not callable(count):
        raise InvalidInputError(f"count_tokens must be callable, got {type(count).__name__}")
    return count
