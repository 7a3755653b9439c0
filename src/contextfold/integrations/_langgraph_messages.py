"""The model's view of a LangGraph message list: budgeted, pair-safe and trust-aware.

:func:`budget_messages` cuts a message list into units: a trusted system message is
pinned, an AI message with tool calls and the tool messages answering all its calls (right
after it) are one unit, any other message is a unit of its own. A tool call without all its
results, or a result without its call, is left out whole (``unpaired``): a provider refuses
either. Units are dropped from the oldest end until the view fits the budget, as
contextfold's :class:`~contextfold.ContextView` with ``drop_oldest`` drops segments; the
system messages and the newest ``keep_newest`` units are never dropped. A view costs what
it keeps: it walks back from the newest unit and stops at the first that does not fit
(system messages are found by their type), so only the kept units are read and counted;
what was left out is worked out when first asked for.

Trust follows contextfold's rule (``context.trust``): a message marked with an actor
(:func:`untrusted`, or ``additional_kwargs["contextfold_actor"]``) that is not trusted never
reaches the model as a system message; an untrusted system message is sent as a human
message, in its place, and is trimmed like any other unit.

:func:`budgeted_messages` wraps it as a LangGraph ``pre_model_hook`` (or node) that can also
record every message it sees, once, as a ``cf.ContextAdded`` item on a journal stream.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import orjson
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
)
from langchain_core.runnables import RunnableLambda
from pyrsistent import PSet, pset

from ..canonical import sha256_hex
from ..context.events import Actor, ContextAdded, Ref
from ..context.trust import is_trusted, trusted_extensions
from ..errors import InvalidInputError
from ..events import Envelope
from ..folds.fold import Fold
from ..journal import Journal, SyncJournal
from ..journal.encode import check_stream
from ..views.tokens import approx_tokens
from ..views.view import check_budget
from ..wire import ToolCall
from ._actors import ACTOR_KEY, marked_actor, untrusted_actor
from ._journal_bridge import JournalBridge
from ._pair_safe import checked_counter, costed, newest_fitting

__all__ = [
    "ACTOR_KEY",
    "MESSAGE_REF",
    "MessagesView",
    "actor_of",
    "budget_messages",
    "budgeted_messages",
    "untrusted",
]

M = TypeVar("M", bound=BaseMessage)
Counter = Callable[[BaseMessage], float]

MESSAGE_REF = "langgraph-message"
"""The ``Ref.type`` naming the LangGraph message a recorded ContextAdded item came from."""


@dataclass(frozen=True, slots=True)
class MessagesView:
    """What the model is handed, and what was left out of it (each oldest first; the
    left-out lists are worked out from the whole list when first read)."""

    messages: tuple[BaseMessage, ...]
    tokens: float
    budget: float
    dropped: Sequence[BaseMessage]
    """Whole units trimmed to fit the budget."""
    unpaired: Sequence[BaseMessage]
    """Tool calls missing a result, and results missing their call."""
    downgraded: Sequence[BaseMessage]
    """Untrusted system messages (as given), sent as human messages."""

    @property
    def over_budget(self) -> bool:
        """True when even the pinned messages do not fit."""
        return self.tokens > self.budget


def untrusted(message: M, *, actor: str, id: str | None = None) -> M:
    """A copy of ``message`` marked as content from an untrusted ``actor`` (``"slack"``,
    ``"email"``, ``"webhook"``, …). Raises InvalidInputError for a malformed or trusted type."""
    if not isinstance(message, BaseMessage):
        raise InvalidInputError(f"untrusted() takes a message, got {type(message).__name__}")
    marked = untrusted_actor(actor, id, what="untrusted()")
    kwargs = {**message.additional_kwargs, ACTOR_KEY: marked.model_dump(exclude_none=True)}
    return message.model_copy(update={"additional_kwargs": kwargs})


def actor_of(message: BaseMessage) -> Actor | None:
    """The actor a message is marked with, or None. Raises InvalidInputError naming the
    message when the marking is not an actor."""
    marking = message.additional_kwargs.get(ACTOR_KEY)
    if marking is None:
        return None
    return marked_actor(
        marking,
        where=f"message {message.id!r}: additional_kwargs[{ACTOR_KEY!r}]",
        how="mark messages with untrusted(message, actor=...)",
    )


def _system_like_type(cls: type) -> bool:
    return issubclass(cls, (SystemMessage, ChatMessage))


def _system_like(message: BaseMessage) -> bool:
    if isinstance(message, SystemMessage):
        return True
    return isinstance(message, ChatMessage) and message.role in ("system", "developer")


def _trusted(message: BaseMessage) -> bool:
    return is_trusted(actor_of(message), trusted_extensions())


def _as_human(message: BaseMessage) -> HumanMessage:
    return HumanMessage(
        content=message.content,
        id=message.id,
        name=message.name,
        additional_kwargs=message.additional_kwargs,
    )


@dataclass(frozen=True, slots=True)
class _Units:
    pinned: list[tuple[int, BaseMessage]]
    units: list[tuple[int, tuple[BaseMessage, ...]]]
    unpaired: list[BaseMessage]
    downgraded: list[BaseMessage]


def _units(messages: Sequence[BaseMessage], start: int = 0, stop: int | None = None) -> _Units:
    """The units of ``messages[start:stop]``, read from its first message on (``start`` must
    begin a unit or be 0, ``stop`` begin one or be the end)."""
    found = _Units([], [], [], [])
    end_of = len(messages) if stop is None else stop
    i = start
    while i < end_of:
        message = messages[i]
        if _system_like(message):
            if _trusted(message):
                found.pinned.append((i, message))
            else:
                found.downgraded.append(message)
                found.units.append((i, (_as_human(message),)))
            i += 1
        elif isinstance(message, AIMessage) and message.tool_calls:
            calls = [call.get("id") for call in message.tool_calls]
            answered: set[str] = set()
            end = i + 1
            while end < end_of:
                result = messages[end]
                if not isinstance(result, ToolMessage) or result.tool_call_id not in calls:
                    break
                if result.tool_call_id in answered:
                    break
                answered.add(result.tool_call_id)
                end += 1
            if None not in calls and answered == set(calls):
                found.units.append((i, tuple(messages[i:end])))
            else:
                found.unpaired.extend(messages[i:end])
            i = end
        elif isinstance(message, ToolMessage):
            found.unpaired.append(message)
            i += 1
        else:
            found.units.append((i, (message,)))
            i += 1
    return found


def _newest_first(messages: Sequence[BaseMessage]) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """The units of ``messages``, newest first, each read as a pass from the first message
    reads it: only tool messages continue a unit, so any other message begins one."""
    stop = len(messages)
    while stop > 0:
        head = stop - 1
        while head > 0 and isinstance(messages[head], ToolMessage):
            head -= 1
        yield from reversed(_units(messages, head, stop).units)
        stop = head


def _pinned(messages: Sequence[BaseMessage], types: list[type]) -> list[tuple[int, BaseMessage]]:
    """The trusted system messages of ``messages`` (``types``: the type of each), found by
    their type without reading the others."""
    system = [t for t in set(types) if issubclass(t, (SystemMessage, ChatMessage))]
    found: list[int] = []
    for kind in system:
        at = -1
        try:
            while True:
                at = types.index(kind, at + 1)
                found.append(at)
        except ValueError:
            pass
    found.sort()
    return [(i, messages[i]) for i in found if _system_like(messages[i]) and _trusted(messages[i])]


class _LeftOut:
    """What a view left out, worked out from the whole list once, when first asked."""

    __slots__ = ("_done", "_first_kept", "_messages")

    def __init__(self, messages: Sequence[BaseMessage], first_kept: int) -> None:
        self._messages, self._first_kept = messages, first_kept
        self._done: tuple[tuple[BaseMessage, ...], ...] | None = None

    def get(self, which: int) -> tuple[BaseMessage, ...]:
        if self._done is None:
            found = _units(self._messages)
            dropped = [m for start, unit in found.units if start < self._first_kept for m in unit]
            self._done = (tuple(dropped), tuple(found.unpaired), tuple(found.downgraded))
        return self._done[which]


class _Lazy(Sequence[BaseMessage]):
    """One of a view's left-out lists (a read-only sequence equal to the tuple it holds)."""

    __slots__ = ("_left_out", "_which")

    def __init__(self, left_out: _LeftOut, which: int) -> None:
        self._left_out, self._which = left_out, which

    @overload
    def __getitem__(self, index: int) -> BaseMessage: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[BaseMessage]: ...
    def __getitem__(self, index: int | slice) -> BaseMessage | Sequence[BaseMessage]:
        return self._left_out.get(self._which)[index]

    def __len__(self) -> int:
        return len(self._left_out.get(self._which))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return self._left_out.get(self._which) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._left_out.get(self._which))


def _checked_counter(count_tokens: Counter | None) -> Counter:
    return checked_counter(count_tokens, default=approx_tokens, what=_named)


def _named(message: BaseMessage) -> str:
    return f"message {message.id!r}"


def _checked_budget(budget: object, keep_newest: object) -> float:
    if isinstance(keep_newest, bool) or not isinstance(keep_newest, int) or keep_newest < 0:
        raise InvalidInputError(f"keep_newest must be an int >= 0, got {keep_newest!r}")
    return check_budget(budget)


def budget_messages(
    messages: Iterable[Any],
    *,
    budget: float,
    count_tokens: Counter | None = None,
    keep_newest: int = 1,
) -> MessagesView:
    """The view of ``messages`` the model gets (see the module docstring); pure.

    ``count_tokens`` sizes one message (default: contextfold's ``approx_tokens``). The
    view fits ``budget`` whenever its pinned part (trusted system messages and the newest
    ``keep_newest`` units) does. Raises InvalidInputError for a bad budget, keep_newest or
    count, or input that is not a message list.
    """
    limit = _checked_budget(budget, keep_newest)
    given = _as_messages(messages)
    count = _checked_counter(count_tokens)
    types = list(map(type, given))
    if any(issubclass(t, ToolMessage) and _system_like_type(t) for t in set(types)):
        whole = _units(given)  # a system message that can answer a tool call: read them all
        pinned, units = whole.pinned, iter(reversed(whole.units))
    else:
        pinned, units = _pinned(given, types), _newest_first(given)
    # As a ContextView with drop_oldest(keep_from=newest(keep_newest)) over the units with
    # the pinned messages as its summary: counted in the same order, so the same tokens.
    base: float = sum(count(m) for _, m in pinned) if pinned else 0.0
    kept, total = newest_fitting(
        costed(units, cost=lambda unit: sum(count(m) for m in unit[1]), base=base),
        budget=limit,
        keep=keep_newest,
        empty=base,
    )
    chosen = [*pinned, *((start + i, m) for start, unit in kept for i, m in enumerate(unit))]
    chosen.sort(key=lambda pair: pair[0])
    left_out = _LeftOut(given, kept[-1][0] if kept else len(given))
    return MessagesView(
        messages=tuple(m for _, m in chosen),
        tokens=float(total),
        budget=limit,
        dropped=_Lazy(left_out, 0),
        unpaired=_Lazy(left_out, 1),
        downgraded=_Lazy(left_out, 2),
    )


def _as_messages(messages: Iterable[Any]) -> list[BaseMessage]:
    if isinstance(messages, (list, tuple)):
        given = list(messages)
        if all(issubclass(t, BaseMessage) for t in set(map(type, given))):
            return given
    try:
        return convert_to_messages(messages)
    except (NotImplementedError, ValueError, TypeError) as exc:
        raise InvalidInputError(f"budget_messages takes a list of messages: {exc}") from exc


# -- recording --------------------------------------------------------------------------------

_RECORDED: Fold[PSet[str]] = Fold(
    "langgraph_recorded_messages", initial=lambda: pset(), checkpoints=False
)


@_RECORDED.on(ContextAdded)
def _recorded(state: PSet[str], env: Envelope[ContextAdded]) -> PSet[str]:
    for ref in env.payload.refs:
        if ref.type == MESSAGE_REF:
            state = state.add(ref.path)
    return state


def _ref(message: BaseMessage, index: int) -> str:
    # LangGraph's add_messages gives every message an id; a list without them is keyed
    # by position, which holds for lists that only grow.
    return f"langgraph/message/{message.id}" if message.id else f"langgraph/message/@{index}"


def _context_item(message: BaseMessage, ref: str) -> ContextAdded:
    """A message as the context item recording it (role and actor by contextfold's rules)."""
    content = message.content
    text = content if isinstance(content, str) else orjson.dumps(content, default=str).decode()
    refs = (Ref(path=ref, type=MESSAGE_REF),)
    actor = actor_of(message)
    if isinstance(message, ToolMessage):
        tool_actor = actor or Actor(type="tool")
        call_id = message.tool_call_id or None
        return ContextAdded(
            role="user", content=text, actor=tool_actor, tool_call_id=call_id, refs=refs
        )
    if isinstance(message, AIMessage):
        calls = tuple(
            ToolCall(id=c["id"], name=c["name"], arguments=orjson.dumps(c["args"]).decode())
            for c in message.tool_calls
            if c.get("id") and c.get("name")
        )
        return ContextAdded(
            role="assistant", content=text, actor=actor, tool_calls=calls, refs=refs
        )
    if _system_like(message):
        developer = isinstance(message, ChatMessage) and message.role == "developer"
        role = "developer" if developer else "system"
        return ContextAdded(role=role, content=text, actor=actor, refs=refs)
    return ContextAdded(role="user", content=text, actor=actor or Actor(type="user"), refs=refs)


async def _record(journal: Journal, stream: str, messages: Sequence[BaseMessage]) -> None:
    """Append every message not recorded on ``stream`` yet, in order, in one append."""
    recorded = await journal.fold(_RECORDED, stream)
    fresh = [(_ref(m, i), m) for i, m in enumerate(messages)]
    fresh = [(ref, m) for ref, m in fresh if ref not in recorded]
    if not fresh:
        return
    items = [_context_item(m, ref) for ref, m in fresh]
    key = "langgraph-messages:" + sha256_hex("\x1f".join(ref for ref, _ in fresh))
    await journal.append(stream, items, idempotency_key=key)


def _messages_of(state: Any) -> list[BaseMessage]:
    if isinstance(state, Mapping):
        found = state.get("messages")
    else:
        found = getattr(state, "messages", None)
    if found is None:
        raise InvalidInputError(
            "budgeted_messages reads state['messages']: the graph state has no messages"
        )
    try:
        return convert_to_messages(found)
    except (NotImplementedError, ValueError, TypeError) as exc:
        raise InvalidInputError(f"state['messages'] is not a list of messages: {exc}") from exc


def budgeted_messages(
    *,
    budget: float,
    count_tokens: Counter | None = None,
    keep_newest: int = 1,
    journal: Journal | SyncJournal | None = None,
    stream: str | None = None,
    key: str = "llm_input_messages",
) -> RunnableLambda[Any, dict[str, Any]]:
    """A LangGraph ``pre_model_hook`` (or node): ``state -> {key: view}``, where the view is
    :func:`budget_messages` of ``state["messages"]``; the graph state itself is unchanged.

    With ``journal`` and ``stream``, each call first records the messages the stream has
    not recorded yet as ``cf.ContextAdded`` items (so a model's answer is recorded by the
    next call; add the hook after the model too to record answers at once). Sync graphs
    need a SyncJournal; async ones take either. Raises InvalidInputError for bad options.
    """
    _checked_budget(budget, keep_newest)
    _checked_counter(count_tokens)
    if (journal is None) != (stream is None):
        raise InvalidInputError("budgeted_messages takes journal= and stream= together")
    bridge = JournalBridge(journal, what="budgeted_messages") if journal is not None else None
    target = check_stream(stream) if stream is not None else ""
    view = functools.partial(
        budget_messages, budget=budget, count_tokens=count_tokens, keep_newest=keep_newest
    )

    def hook(state: Any) -> dict[str, Any]:
        messages = _messages_of(state)
        if bridge is not None:
            bridge.run(functools.partial(_record, bridge.journal, target, messages))
        return {key: list(view(messages).messages)}

    async def ahook(state: Any) -> dict[str, Any]:
        messages = _messages_of(state)
        if bridge is not None:
            await bridge.arun(functools.partial(_record, bridge.journal, target, messages))
        return {key: list(view(messages).messages)}

    return RunnableLambda(hook, afunc=ahook, name="budgeted_messages")
