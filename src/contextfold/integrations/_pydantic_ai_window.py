"""The model's view of a pydantic-ai history: trimmed pair-safe to a budget, with the system
prompt pinned and untrusted content kept out of system precedence. Pure functions.

Trimming keeps a suffix of the history and starts it only where a ``ModelRequest`` begins
and no later message answers a tool call made before it: a ``ToolCallPart``'s response and
the request holding its ``ToolReturnPart`` (or ``RetryPromptPart``) are kept or dropped
together, and the newest such unit is always kept. The first request's trusted
``SystemPromptPart``\\ s (with its ``instructions``) are never dropped: when the first request
falls out of the budget, a copy of it holding only them leads the view.

Trust follows contextfold's rule (``context.trust``): a ``SystemPromptPart`` marked with an
untrusted actor (:func:`untrusted`, ``metadata["contextfold_actor"]``) is sent as a
``UserPromptPart`` in its place, its content after a header line naming the actor, the
same form :func:`untrusted_prompt` gives external content from the start.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    UserContent,
    UserPromptPart,
)

from ..context.events import Actor
from ..context.trust import is_trusted, trusted_extensions
from ..errors import InvalidInputError
from ..views.view import check_budget
from ._actors import ACTOR_KEY, actor_header, marked_actor, untrusted_actor
from ._pair_safe import checked_counter, link_of, newest_fitting, pair_safe_starts

__all__ = [
    "ACTOR_KEY",
    "Counter",
    "HistoryView",
    "Shape",
    "actor_header",
    "actor_of",
    "approx_message_tokens",
    "budget_history",
    "budgeted",
    "checked_counter_of",
    "checked_messages",
    "choose_start",
    "downgraded",
    "links",
    "message_json",
    "shape_of",
    "shape_of_json",
    "system_only",
    "untrusted",
    "untrusted_prompt",
]

Counter = Callable[[ModelMessage], float]
"""Sizes one message in tokens."""


@dataclass(frozen=True, slots=True)
class HistoryView:
    """The messages the model is handed, oldest first, and what trimming did."""

    messages: tuple[ModelMessage, ...]
    tokens: float
    budget: float
    dropped: int
    """Messages of the history left out (the first one's system prompt may lead the view)."""
    downgraded: int
    """Untrusted system prompt parts sent as user prompts."""

    @property
    def over_budget(self) -> bool:
        """True when even the pinned system prompt and the newest unit do not fit."""
        return self.tokens > self.budget


@dataclass(frozen=True, slots=True)
class Shape:
    """What trimming reads of one message."""

    request: bool
    calls: frozenset[str]
    """Tool call ids a response asks for (its ``ToolCallPart``\\ s)."""
    answers: frozenset[str]
    """Tool call ids a request answers (``ToolReturnPart``, a ``RetryPromptPart`` of a tool)."""
    system: bool
    """It holds a trusted ``SystemPromptPart``."""
    untrusted: bool
    """It holds a ``SystemPromptPart`` marked with an untrusted actor."""


# -- actors and trust --------------------------------------------------------------------------


def untrusted_prompt(
    content: str | Sequence[UserContent], *, actor: str, id: str | None = None
) -> UserPromptPart:
    """External content (a Slack message, an email, a webhook body) as a user prompt: its
    first line names the actor, the content follows. Pass it in ``Agent.run(user_prompt=[...])``
    or a ``ModelRequest``; it never becomes a system prompt.

    Raises InvalidInputError for a malformed or trusted actor type, or content that is not a
    str or a sequence of pydantic-ai user content.
    """
    marked = untrusted_actor(actor, id, what="untrusted_prompt()")
    header = actor_header(marked)
    if isinstance(content, str):
        return UserPromptPart(f"{header}\n{content}")
    if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
        raise InvalidInputError(
            f"untrusted_prompt() takes a str or a sequence of user content, got "
            f"{type(content).__name__}"
        )
    try:
        return UserPromptPart([header, *content])
    except ValueError as exc:
        raise InvalidInputError(f"untrusted_prompt(): {exc}") from exc


def untrusted(part: SystemPromptPart, *, actor: str, id: str | None = None) -> SystemPromptPart:
    """A copy of ``part`` marked as supplied by an untrusted ``actor``: :func:`budgeted`
    sends it as a user prompt. Raises InvalidInputError for another part, or a malformed or
    trusted actor type."""
    if not isinstance(part, SystemPromptPart):
        raise InvalidInputError(f"untrusted() takes a SystemPromptPart, got {type(part).__name__}")
    marked = untrusted_actor(actor, id, what="untrusted()")
    metadata = {**(part.metadata or {}), ACTOR_KEY: marked.model_dump(exclude_none=True)}
    return replace(part, metadata=metadata)


def _marking(metadata: object, where: str) -> Actor | None:
    if not isinstance(metadata, Mapping) or ACTOR_KEY not in metadata:
        return None
    return marked_actor(
        metadata[ACTOR_KEY],
        where=f"{where}: metadata[{ACTOR_KEY!r}]",
        how="mark system prompts with untrusted(part, actor=...)",
    )


def actor_of(part: SystemPromptPart) -> Actor | None:
    """The actor a system prompt part is marked with, or None. Raises InvalidInputError
    when the marking is not an actor."""
    return _marking(part.metadata, "system prompt part")


def _trusted(actor: Actor | None) -> bool:
    return is_trusted(actor, trusted_extensions())


# -- shapes ------------------------------------------------------------------------------------


def _shape(
    request: bool, parts: Sequence[Any], get: Callable[[Any, str], Any], where: str
) -> Shape:
    calls: set[str] = set()
    answers: set[str] = set()
    system = untrusted_ = False
    for index, part in enumerate(parts):
        kind = get(part, "part_kind")
        if request:
            if kind == "system-prompt":
                actor = _marking(get(part, "metadata"), f"{where}.parts[{index}]")
                if _trusted(actor):
                    system = True
                else:
                    untrusted_ = True
            elif kind == "tool-return" or (
                kind == "retry-prompt" and get(part, "tool_name") is not None
            ):
                answers.add(str(get(part, "tool_call_id")))
        elif kind == "tool-call":
            calls.add(str(get(part, "tool_call_id")))
    return Shape(request, frozenset(calls), frozenset(answers), system, untrusted_)


def shape_of(message: ModelMessage, *, where: str = "message") -> Shape:
    """The shape of a message. Raises InvalidInputError for a malformed actor marking."""
    return _shape(isinstance(message, ModelRequest), message.parts, getattr, where)


def shape_of_json(message: Mapping[str, Any], *, where: str = "message") -> Shape:
    """The shape of a message as ``ModelMessagesTypeAdapter`` dumps it; equal to
    :func:`shape_of` of the message itself."""
    return _shape(message.get("kind") == "request", message.get("parts", ()), _item, where)


def _item(part: Any, key: str) -> Any:
    return part.get(key) if isinstance(part, Mapping) else None


def links(shapes: Sequence[Shape]) -> list[int]:
    """For each message, the index of the oldest message it must be kept with: the latest
    earlier response making a call it answers, else itself."""
    latest: dict[str, int] = {}
    found: list[int] = []
    for index, shape in enumerate(shapes):
        found.append(link_of(index, shape.answers, latest))
        for call in shape.calls:
            latest[call] = index
    return found


def choose_start(
    count: int,
    *,
    request: Callable[[int], bool],
    link: Callable[[int], int],
    tokens: Callable[[int], float],
    budget: float,
    pinned: float,
) -> tuple[int, float]:
    """The index of the oldest message kept and the view's tokens, reading the messages
    newest first and stopping at the first unit over the budget (so it costs what it keeps).

    A cut is allowed before a request no later message links behind; ``pinned`` is the cost
    of the first request's system prompt alone, paid by every view that drops index 0. The
    newest unit is kept whatever it costs.
    """
    starts = pair_safe_starts(count, link=link, tokens=tokens, may_start=request)
    views = ((index, walked + pinned if index else walked) for index, walked in starts)
    kept, total = newest_fitting(views, budget=budget, keep=1)
    return (kept[-1], total) if kept else (count, total)


# -- messages ----------------------------------------------------------------------------------


def message_json(message: ModelMessage) -> bytes:
    """One message as ``ModelMessagesTypeAdapter`` dumps it (JSON mode), compact."""
    return orjson.dumps(ModelMessagesTypeAdapter.dump_python([message], mode="json")[0])


def approx_message_tokens(message: ModelMessage) -> int:
    """⌈length of the message's JSON / 4⌉: the default counter, the one the journal
    history's fold uses."""
    return math.ceil(len(message_json(message)) / 4)


def system_only(first: ModelRequest) -> ModelRequest:
    """``first`` holding only its trusted system prompt parts (everything else kept)."""
    parts = [
        part
        for part in first.parts
        if isinstance(part, SystemPromptPart) and _trusted(_marking(part.metadata, "first request"))
    ]
    return replace(first, parts=parts)


def downgraded(message: ModelRequest) -> tuple[ModelRequest, int]:
    """``message`` with each untrusted system prompt part sent as a user prompt, and how many."""
    parts: list[Any] = []
    changed = 0
    for index, part in enumerate(message.parts):
        if isinstance(part, SystemPromptPart):
            actor = _marking(part.metadata, f"request part {index}")
            if actor is not None and not _trusted(actor):
                header = actor_header(actor)
                part = UserPromptPart(f"{header}\n{part.content}", timestamp=part.timestamp)
                changed += 1
        parts.append(part)
    return (replace(message, parts=parts), changed) if changed else (message, 0)


def checked_counter_of(count_tokens: Counter | None) -> Counter:
    """``count_tokens``, checked (default :func:`approx_message_tokens`). Raises
    InvalidInputError for a counter that is not callable."""
    return checked_counter(count_tokens, default=approx_message_tokens, what=_named)


def _named(message: ModelMessage) -> str:
    return f"a {type(message).__name__}"


def checked_messages(messages: object, *, takes: str, what: str = "") -> list[ModelMessage]:
    """``messages`` as a list of pydantic-ai messages. Raises InvalidInputError saying what
    ``takes`` them when they are no sequence, or naming the first that is no message (its
    message led by ``what``)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidInputError(f"{takes}, got {type(messages).__name__}")
    for index, message in enumerate(messages):
        if not isinstance(message, (ModelRequest, ModelResponse)):
            raise InvalidInputError(
                f"{what}messages[{index}] is a {type(message).__name__}, not a ModelRequest or "
                "ModelResponse"
            )
    return list(messages)


def budget_history(
    messages: Sequence[ModelMessage], *, budget: float, count_tokens: Counter | None = None
) -> HistoryView:
    """The view of ``messages`` the model gets (see the module docstring); pure: the
    messages given are not changed.

    ``count_tokens`` sizes one message (default :func:`approx_message_tokens`); it is asked
    only about the messages the view keeps, and one unit more. Raises InvalidInputError for
    a bad budget or count, a malformed actor marking, or input that is not a message list.
    """
    limit = check_budget(budget)
    count = checked_counter_of(count_tokens)
    given = checked_messages(messages, takes="budget_history takes a list of pydantic-ai messages")
    shapes = [shape_of(message, where=f"messages[{i}]") for i, message in enumerate(given)]
    linked = links(shapes)
    first = given[0] if given else None
    pinned = system_only(first) if isinstance(first, ModelRequest) and shapes[0].system else None
    start, tokens = choose_start(
        len(given),
        request=lambda i: shapes[i].request,
        link=linked.__getitem__,
        tokens=lambda i: count(given[i]),
        budget=limit,
        pinned=count(pinned) if pinned is not None else 0.0,
    )
    view: list[ModelMessage] = [pinned] if pinned is not None and start > 0 else []
    changed = 0
    for index in range(start, len(given)):
        message = given[index]
        if shapes[index].untrusted and isinstance(message, ModelRequest):
            message, n = downgraded(message)
            changed += n
        view.append(message)
    return HistoryView(tuple(view), tokens, limit, start, changed)


def budgeted(
    budget: float, *, count_tokens: Counter | None = None
) -> Callable[[list[ModelMessage]], list[ModelMessage]]:
    """A pydantic-ai history processor: ``messages -> budget_history(messages).messages``.

    Give it to the agent as ``capabilities=[ProcessHistory(budgeted(30_000))]`` (older
    pydantic-ai: ``history_processors=[budgeted(30_000)]``). Raises InvalidInputError for a
    bad budget or counter now, and for bad messages when it runs.
    """
    check_budget(budget)
    checked_counter_of(count_tokens)

    def contextfold_budgeted(messages: list[ModelMessage]) -> list[ModelMessage]:
        return list(budget_history(messages, budget=budget, count_tokens=count_tokens).messages)

    return contextfold_budgeted
