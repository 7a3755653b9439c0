"""What :class:`~contextfold.integrations.openai_agents.JournalModel` reads from the SDK's
input: which items of a call are new to its stream, and the contextfold events they are.

The Runner hands a model its whole input on every call: the session's items (all of them,
or a window: the newest within a limit or a budget, or a session compaction's summary and
what it kept), the items of the run so far, then new input. The stream records the digest
of every item it took in, in order, and the model's newest answer (:class:`ModelRecord`).
A call's input continues the stream when a run of it ends with the newest of those: the
answer as the SDK replays it, else the newest item taken in. The items after that run are
new; the items before it are a window of what the stream recorded (or a session
compaction's summary of it): the stream has them already, and contextfold's own view of
the journal decides what the model sees (:func:`continuation`).

Pure: nothing here reads a journal or calls the SDK.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pyrsistent import PMap, PVector, pmap, pvector

from ..canonical import canonical_json, sha256_hex
from ..context.events import Actor, ContextAdded, LlmResponse, ToolCallResult, tool_result_item
from ..context.projection import TOOL_WRITER
from ..errors import InvalidInputError, RenderError
from ..events import Envelope, Event
from ..folds.fold import Fold
from ..wire import ToolCall

__all__ = [
    "MODEL_RECORD",
    "Continuation",
    "Group",
    "ModelInputRecorded",
    "ModelRecord",
    "continuation",
    "input_events",
    "item_digest",
]

# How far back from the newest recorded item two runs of the input that both end with it
# are compared to pick the longer one (an answer's text may recur, a call id does not).
_COMPARED = 8


class ModelInputRecorded(Event, type="openai-agents/model-input", runtime_only=True):
    """The SDK input items a request took in after those before it (the model's replayed
    answer and the new items), by the SHA-256 of each item's canonical JSON, in order."""

    digests: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """What a stream's requests saw: the digest of every input item taken in so far, the
    model's newest answer as the items the SDK will replay (``("message", text)``,
    ``("function_call", call_id)``), and each call's tool name."""

    digests: PVector[str] = field(default_factory=lambda: pvector())
    answer: tuple[tuple[str, str], ...] = ()
    names: PMap[str, str] = field(default_factory=lambda: pmap())


MODEL_RECORD: Fold[ModelRecord] = Fold(
    "openai_agents_model_record", initial=ModelRecord, checkpoints=False
)


@MODEL_RECORD.on(ModelInputRecorded)
def _input(record: ModelRecord, ev: Envelope[ModelInputRecorded]) -> ModelRecord:
    return ModelRecord(record.digests.extend(ev.payload.digests), (), record.names)


@MODEL_RECORD.on(LlmResponse)
def _answer(record: ModelRecord, ev: Envelope[LlmResponse]) -> ModelRecord:
    calls = ev.payload.tool_calls
    answer = [("message", ev.payload.text)] if ev.payload.text or not calls else []
    answer.extend(("function_call", call.id) for call in calls)
    names = record.names.update({call.id: call.name for call in calls})
    return ModelRecord(record.digests, tuple(answer), names)


def item_digest(item: Any, index: int) -> str:
    """SHA-256 of an input item's canonical JSON. Raises InvalidInputError for one that is
    not JSON, naming ``input[index]``."""
    try:
        return sha256_hex(canonical_json(item))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"input[{index}] is not JSON: {exc}") from exc


def _text(content: Any, index: int, parts: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in parts:
                raise RenderError(
                    f"input[{index}]: a {kind!r} content part is not in contextfold's wire "
                    f"model (text only: {', '.join(parts)})"
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise RenderError(f"input[{index}]: message content must be text, got {content!r:.60}")


def _replays(item: Any, expected: tuple[str, str]) -> bool:
    """Whether ``item`` is the SDK's replay of one item of the model's answer."""
    kind, key = expected
    if not isinstance(item, dict):
        return False
    if kind == "function_call":
        return item.get("type") == "function_call" and item.get("call_id") == key
    if item.get("role") != "assistant" or item.get("type", "message") != "message":
        return False
    try:
        return _text(item.get("content", ""), 0, ("output_text", "input_text", "text")) == key
    except RenderError:
        return False


@dataclass(frozen=True, slots=True)
class Continuation:
    """How a call's input continues its stream's conversation."""

    new: int
    """Index of the first new item: the items from it on are new to the stream."""
    replayed: int
    """How many items before ``new`` are the model's answer as the SDK replays it."""
    digests: tuple[str, ...]
    """The digests to record: of the replayed answer items, then of the new items."""


def continuation(record: ModelRecord, items: Sequence[Any]) -> Continuation:
    """Which of ``items`` are new to the stream ``record`` is of (see the module).

    The recorded conversation is every item taken in, then the model's newest answer (when
    no input was taken in since). Of the runs of ``items`` that end with its newest item,
    as compared back over the answer and a few items more, the longest wins (the latest of
    equals); everything after it is new. Without such a run (an empty window, a run
    without a session) every item is new. Raises InvalidInputError for an item that is not
    JSON."""
    digests = record.digests
    answer = record.answer
    known = len(digests)
    total = known + len(answer)
    cache: dict[int, str] = {}

    def digest(index: int) -> str:
        found = cache.get(index)
        if found is None:
            found = cache[index] = item_digest(items[index], index)
        return found

    def same(index: int, position: int) -> bool:
        """Whether input ``index`` is the recorded conversation's item ``position``."""
        if position >= known:
            return _replays(items[index], answer[position - known])
        return digest(index) == digests[position]

    best: tuple[int, int] | None = None  # (length of the run, index after it)
    if total:
        reach = len(answer) + _COMPARED
        for end in range(len(items), 0, -1):
            if not same(end - 1, total - 1):
                continue
            length = 1
            limit = min(end, total, reach)
            while length < limit and same(end - 1 - length, total - 1 - length):
                length += 1
            if best is None or length > best[0]:
                best = (length, end)
            if length >= min(len(answer) + 1, total):
                break  # the whole answer and the item before it: no earlier run is better
    if best is None:
        return Continuation(0, 0, tuple(digest(i) for i in range(len(items))))
    length, end = best
    replayed = min(length, len(answer))
    recorded = tuple(digest(i) for i in range(end - replayed, len(items)))
    return Continuation(end, replayed, recorded)


@dataclass(frozen=True, slots=True)
class Group:
    """Events of one append, all by one journal writer."""

    writer: str | None
    events: tuple[Event, ...]


def input_events(items: Sequence[Any], first: int, names: PMap[str, str]) -> list[Group]:
    """The contextfold events of new input items (``items``, the first of them at
    ``input[first]``), grouped by journal writer in order. ``names``: the tool name of each
    call the model made before. Raises RenderError for an item outside contextfold's wire
    model, naming it."""
    groups: list[Group] = []

    def add(writer: str | None, *events: Event) -> None:
        if groups and groups[-1].writer == writer:
            groups[-1] = Group(writer, (*groups[-1].events, *events))
        else:
            groups.append(Group(writer, events))

    calls: dict[str, str] = {}  # the calls of these items; earlier ones are in names
    for offset, item in enumerate(items):
        index = first + offset
        if not isinstance(item, dict):
            raise RenderError(f"input[{index}] is a {type(item).__name__}, not an input item")
        kind = item.get("type", "message")
        try:
            if kind == "message" and item.get("role") in ("user", "system", "developer"):
                role = item["role"]
                text = _text(item.get("content"), index, ("input_text", "text"))
                actor = Actor(type="user") if role == "user" else None
                add(None, ContextAdded(role=role, content=text, actor=actor))
            elif kind == "message" and item.get("role") == "assistant":
                text = _text(item.get("content"), index, ("output_text", "input_text", "text"))
                add(None, ContextAdded(role="assistant", content=text))
            elif kind == "function_call":
                call = ToolCall(
                    id=item["call_id"], name=item["name"], arguments=item.get("arguments", "")
                )
                calls[call.id] = call.name
                # Another model's call: the projection sends it as text, never as a call.
                add(None, ContextAdded(role="assistant", tool_calls=(call,)))
            elif kind == "function_call_output":
                content = _text(item.get("output"), index, ("input_text",))
                result = ToolCallResult(
                    tool_call_id=item["call_id"],
                    name=calls.get(item["call_id"]) or names.get(item["call_id"], "unknown"),
                    content=content,
                )
                add(TOOL_WRITER, result, tool_result_item(result))
            else:
                raise RenderError(
                    f"input[{index}]: a {kind!r} item is not in contextfold's wire model "
                    "(messages, function calls and their outputs)"
                )
        except (KeyError, ValidationError) as exc:
            raise RenderError(f"input[{index}] ({kind}) is malformed: {exc}") from exc
    return groups
