"""A tiny in-memory journal of envelopes for the context tests (no store needed)."""

from __future__ import annotations

from typing import Any

import pytest

from contextfold.context import (
    AgentContextState,
    ContextAdded,
    LlmRequestRequested,
    RequestHeader,
    ToolCallResult,
    fold_context,
    request,
    tool_result_item,
)
from contextfold.events import Envelope, Event, EventMeta
from contextfold.testing import envelope

HEADER = RequestHeader(transport="openai-chat", model="gpt-4o", max_tokens=512)


def time_of(position: int) -> str:
    return f"2026-01-01T00:00:00.{position:06d}+00:00"


class Log:
    """Envelopes at consecutive positions from 1, each with a distinct journal time."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope[Any]] = []

    def append(self, event: Event, *, actor: str = "agent") -> int:
        position = len(self.envelopes) + 1
        # Written as the agent's runtime would (journal meta actor "agent", "tool" for tool
        # results): trust in the payload is what these tests vary.
        meta = EventMeta(event_id=f"ev-{position}", time=time_of(position), actor=actor)
        self.envelopes.append(envelope(event, position, meta=meta))
        return position

    def add(self, role: Any = "developer", content: str = "", **fields: Any) -> int:
        return self.append(ContextAdded(role=role, content=content, **fields))

    def result(self, call_id: str, content: str = "", name: str = "t") -> int:
        """A tool result as the runtime appends it: the evidence, then its item; the item's
        position."""
        result = ToolCallResult(tool_call_id=call_id, name=name, content=content)
        self.append(result, actor="tool")
        return self.append(tool_result_item(result), actor="tool")

    def request(self, header: RequestHeader | None = HEADER) -> int:
        return self.append(LlmRequestRequested(header=header))

    def state(self, through: int | None = None) -> AgentContextState:
        envelopes = self.envelopes if through is None else self.envelopes[:through]
        return fold_context(envelopes)


def count_item_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The offsets of the items request building makes a message of, in order, from now on
    (each history item's message is made once per build that does not reuse it)."""
    made: list[int] = []
    message = request._Pairing.message

    def counting(self: Any, item: Any, role: Any) -> Any:
        made.append(item.offset)
        return message(self, item, role)

    monkeypatch.setattr(request._Pairing, "message", counting)
    return made
