"""What a :class:`~contextfold.integrations.openai_agents.JournalSession` stores, and how it
reads it back: the session events, the session fold and the pair-safe windows.

Private to :mod:`contextfold.integrations.openai_agents`, which documents the scheme and
re-exports the public names. Pure: nothing here needs the SDK, a journal or a clock.

Units. Some items must reach the model together or not at all: a tool call with its
output (matched by ``call_id``; an MCP approval request with its response, by id), the
items a program call issued with that call, and a reasoning item with the item after
it. Each stored item records the index of the earliest item it must travel with
(``link``), so a window may start at index ``i`` only when no item from ``i`` on links
before ``i``. A window is then a run of whole units, however the items interleave.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from pydantic import Field
from pyrsistent import PMap, PVector, pmap, pvector

from ..canonical import sha256_hex
from ..context.events import Actor
from ..errors import MissingSegmentError
from ..events import Envelope, Event
from ..folds.fold import Fold
from ._pair_safe import newest_fitting, pair_safe_starts

__all__ = [
    "SESSION_FOLD",
    "ItemAdded",
    "ItemRetracted",
    "SessionCleared",
    "SessionCompacted",
    "SessionState",
    "StoredItem",
    "Window",
    "item_kind",
    "item_sha256",
    "newest_window",
]

# A call's item type -> the type of the output answering it (the Responses API's pairs).
_OUTPUT_OF: dict[str, str] = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
    "program": "program_output",
}
_OUTPUTS = frozenset(_OUTPUT_OF.values())


# -- events -----------------------------------------------------------------------------------


class ItemAdded(Event, type="openai-agents/item-added", runtime_only=True):
    """One session item, as the SDK gave it (a Responses API input item)."""

    item: dict[str, Any]
    actor: Actor | None = None
    """Who supplied it, for untrusted input added with ``add_untrusted`` (None: the app)."""


class ItemRetracted(Event, type="openai-agents/item-retracted", runtime_only=True):
    """``pop_item``: the item stored at ``position`` leaves the session; its record stays.

    Appended with the version the session read, so it retracts the item it names or
    nothing."""

    position: int = Field(ge=1)
    sha256: str
    """SHA-256 of the retracted item's stored JSON."""


class SessionCleared(Event, type="openai-agents/session-cleared", runtime_only=True):
    """``clear_session``: every item before it leaves the session; the records stay."""

    items: int = Field(default=0, ge=0)
    """How many items the session had."""


class SessionCompacted(Event, type="openai-agents/session-compacted", runtime_only=True):
    """The SDK's compaction: the items from ``replaces_from`` on (every item when None)
    give way to the ``items`` item-added events that follow it in the same append."""

    replaces_from: int | None = Field(default=None, ge=1)
    """Stream position of the first replaced item; None replaces the whole history."""
    replaced: int = Field(ge=0)
    items: int = Field(ge=0)


# -- state ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredItem:
    """One live item: where it is stored, its JSON, and what it must travel with."""

    position: int
    data: bytes
    kind: str
    opens: str | None
    """The key an answer to this item looks up (``"function_call_output:call_1"``)."""
    link: int
    """Index of the earliest item this one must be sent with (its own index when none)."""
    tokens: int
    """⌈len(data) / 4⌉, contextfold's default estimate (``approx_tokens``)."""
    actor: Actor | None = None

    def decode(self) -> dict[str, Any]:
        """A fresh copy of the item (callers may change it)."""
        value: dict[str, Any] = orjson.loads(self.data)
        return value


@dataclass(frozen=True, slots=True)
class SessionState:
    """The live items of a session, oldest first: ``items[:length]``.

    Items leave only from the end (a pop, a compaction of the newest items) or all at once
    (a clear), so an item's index never changes while it is live; slots past ``length``
    are overwritten by the next items. ``calls`` maps an answer key to the index of the
    newest item opening it (checked against the item on lookup: it may be stale).
    """

    items: PVector[StoredItem] = field(default_factory=lambda: pvector())
    length: int = 0
    calls: PMap[str, int] = field(default_factory=lambda: pmap())
    last_position: int = 0
    """Stream position of the newest session event folded (0: none)."""

    def __len__(self) -> int:
        return self.length

    def item(self, index: int) -> StoredItem:
        if not 0 <= index < self.length:
            raise IndexError(index)
        stored: StoredItem = self.items[index]
        return stored

    def __iter__(self) -> Iterator[StoredItem]:
        for index in range(self.length):
            yield self.items[index]

    def index_of(self, position: int) -> int | None:
        """The index of the live item stored at ``position`` (positions grow with index)."""
        low, high = 0, self.length
        while low < high:
            middle = (low + high) // 2
            if self.items[middle].position < position:
                low = middle + 1
            else:
                high = middle
        return low if low < self.length and self.items[low].position == position else None

    def _opener(self, key: str) -> int | None:
        index = self.calls.get(key)
        if index is None or index >= self.length or self.items[index].opens != key:
            return None
        return index

    def added(self, position: int, item: dict[str, Any], actor: Actor | None) -> SessionState:
        data = orjson.dumps(item)
        index = self.length
        kind = item_kind(item)
        link = index
        call_id = item.get("call_id")
        opens = None
        if kind in _OUTPUT_OF and isinstance(call_id, str):
            opens = f"{_OUTPUT_OF[kind]}:{call_id}"
        elif kind == "mcp_approval_request" and isinstance(item.get("id"), str):
            opens = f"mcp_approval_response:{item['id']}"
        answers = None
        if kind in _OUTPUTS and isinstance(call_id, str):
            answers = f"{kind}:{call_id}"
        elif kind == "mcp_approval_response" and isinstance(item.get("approval_request_id"), str):
            answers = f"mcp_approval_response:{item['approval_request_id']}"
        for key in (answers, _program_key(item)):
            opener = self._opener(key) if key is not None else None
            if opener is not None:
                link = min(link, opener)
        if index and self.items[index - 1].kind == "reasoning":
            link = min(link, index - 1)  # a reasoning item belongs to the item after it
        stored = StoredItem(position, data, kind, opens, link, math.ceil(len(data) / 4), actor)
        items = (
            self.items.set(index, stored) if index < len(self.items) else self.items.append(stored)
        )
        calls = self.calls.set(opens, index) if opens is not None else self.calls
        return SessionState(items, index + 1, calls, position)

    def truncated(self, length: int, position: int) -> SessionState:
        if length == 0:
            return SessionState(last_position=position)
        return replace(self, length=length, last_position=position)


def item_kind(item: dict[str, Any]) -> str:
    """An item's type; an easy input message (``{"role", "content"}``) is a message."""
    kind = item.get("type")
    if isinstance(kind, str):
        return kind
    return "message" if "role" in item else ""


def _program_key(item: dict[str, Any]) -> str | None:
    caller = item.get("caller")
    if isinstance(caller, dict) and caller.get("type") == "program":
        caller_id = caller.get("caller_id")
        if isinstance(caller_id, str):
            return f"program_output:{caller_id}"
    return None


# -- the fold ---------------------------------------------------------------------------------

SESSION_FOLD: Fold[SessionState] = Fold(
    "openai_agents_session",
    initial=SessionState,
    # Always the fold of its events: a pop or compaction must see the items it names.
    checkpoints=False,
)
"""The session's live items, folded from its stream."""


@SESSION_FOLD.on(ItemAdded)
def _added(state: SessionState, ev: Envelope[ItemAdded]) -> SessionState:
    return state.added(ev.position, ev.payload.item, ev.payload.actor)


@SESSION_FOLD.on(ItemRetracted)
def _retracted(state: SessionState, ev: Envelope[ItemRetracted]) -> SessionState:
    if not state.length or state.items[state.length - 1].position != ev.payload.position:
        # Only ever appended for the newest item at the version it read: another writer's.
        raise MissingSegmentError(f"item @{ev.payload.position} is not the session's newest")
    return state.truncated(state.length - 1, ev.position)


@SESSION_FOLD.on(SessionCleared)
def _cleared(state: SessionState, ev: Envelope[SessionCleared]) -> SessionState:
    return state.truncated(0, ev.position)


@SESSION_FOLD.on(SessionCompacted)
def _compacted(state: SessionState, ev: Envelope[SessionCompacted]) -> SessionState:
    start = ev.payload.replaces_from
    if start is None:
        return state.truncated(0, ev.position)
    index = state.index_of(start)
    if index is None:
        raise MissingSegmentError(f"item @{start} is not in the session")
    return state.truncated(index, ev.position)


# -- windows ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """The newest whole units of a session that fit a limit and a budget."""

    start: int
    """Index of the window's first item (``len(state)``: an empty window)."""
    tokens: float
    """Tokens of the items in the window, by the counter used."""


def newest_window(
    state: SessionState,
    *,
    limit: int | None = None,
    budget: float | None = None,
    count: Callable[[StoredItem], float] | None = None,
) -> Window:
    """The largest run of the newest whole units with at most ``limit`` items and at most
    ``budget`` tokens (each ignored when None). A unit that does not fit ends the window:
    the limit rounds down to whole units. Costs the items it looks at: the window and at
    most one unit more. Pure."""
    length, items = state.length, state.items
    starts = pair_safe_starts(
        length,
        link=lambda index: items[index].link,
        tokens=lambda index: items[index].tokens if count is None else count(items[index]),
        lowest=0 if limit is None else length - limit,
    )
    kept, tokens = newest_fitting(starts, budget=math.inf if budget is None else budget, keep=0)
    return Window(kept[-1] if kept else length, tokens)


def item_sha256(stored: StoredItem) -> str:
    """SHA-256 of an item's stored JSON: what a retraction names."""
    return sha256_hex(stored.data)
