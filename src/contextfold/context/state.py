"""The reduced agent context: two lanes of items and the publication boundary.

State is frozen pydantic data (tuples for sequences), so a fold can checkpoint it and
every reader can share it. There is no ordering field: the system lane renders first,
then history, each in lane order (except that untrusted system items follow the trusted
prefix, see ``request``); item offsets are journal coordinates, not a sort key.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..wire import ItemRole, ToolCall
from .events import Actor, CompactionMeta, FileAttachment, Ref, RequestHeader

__all__ = ["AGENT_WRITER", "SYSTEM_PROMPT_KEY", "TOOL_WRITER", "AgentContextState", "ContextItem"]

SYSTEM_PROMPT_KEY = "agent/system-prompt"
"""The well-known system-lane key of the agent's base prompt (distributed birth waits for it)."""

AGENT_WRITER = "agent"
"""The journal meta actor of the runtime's own appends; only its items carry verified calls."""
TOOL_WRITER = "tool"
"""The journal meta actor the runtime appends tool results with: only its results verify."""


class ContextItem(BaseModel):
    """One projected item: a ``ContextAdded`` event at its source offset."""

    model_config = ConfigDict(frozen=True)

    offset: int = Field(ge=1)
    """Source offset: the stream position of the event that set this value (``@N``)."""
    role: ItemRole
    content: str = ""
    actor: Actor | None = None
    key: str | None = None
    updates: int | None = None
    """Offset of the published occurrence of ``key`` this item supersedes (``updates=@N``)."""
    refs: tuple[Ref, ...] = ()
    files: tuple[FileAttachment, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    llm_request_offset: int | None = None
    """The answered request's offset, only when verified: a real request of this stream
    before the item, on an item from a trusted (or no) actor. Unverified claims are dropped."""
    tool_call_id: str | None = None
    verified_result: bool = False
    """True only on the item the runtime wrote for a tool execution: the ``ToolCallResult``
    with the same ``tool_call_id`` is the event just before it (the same append). Only such
    an item may answer a call; any other ``tool_call_id`` is a claim, rendered as user text."""
    compaction: CompactionMeta | None = None


class AgentContextState(BaseModel):
    """The agent's model-facing memory, reduced from its journal.

    ``system`` is the compaction-immune prefix, ``history`` developer, user and assistant
    items. Items at or below ``published_through`` have been sent in a request and are
    never rewritten by later events (only compaction removes history).
    """

    model_config = ConfigDict(frozen=True)

    system: tuple[ContextItem, ...] = ()
    history: tuple[ContextItem, ...] = ()
    published_through: int = 0
    """Offset of the latest request: the projection through it has been published."""
    header: RequestHeader | None = None
    """The latest logged request header snapshot."""
    request_offset: int | None = None
    """Offset of the latest request."""
    request_time: str | None = None
    """Journal time of the latest request, rendered at the request's tail."""
    request_offsets: tuple[int, ...] = ()
    """Offsets of every request of the stream, ascending (verifies request offsets)."""
    compacted_through: int = 0
    """Cutoff of the latest applied compaction (0: none)."""
    tool_result: tuple[int, str] | None = None
    """Position and ``tool_call_id`` of a ``ToolCallResult`` no item has followed yet: the
    ``ContextAdded`` at the next position with that id is its genuine model-visible item."""

    def lane(self, role: ItemRole) -> tuple[ContextItem, ...]:
        """The lane an item of ``role`` belongs to."""
        return self.system if role == "system" else self.history

    @property
    def has_system_prompt(self) -> bool:
        """Whether the system lane holds :data:`SYSTEM_PROMPT_KEY`: until it does, a new
        agent's pending trigger waits (queued, not busy) instead of requesting."""
        return any(item.key == SYSTEM_PROMPT_KEY for item in self.system)

    @property
    def items(self) -> tuple[ContextItem, ...]:
        """Both lanes in lane order: system, then history."""
        return (*self.system, *self.history)
