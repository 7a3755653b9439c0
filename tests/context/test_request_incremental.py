"""Requests are built from what is new: the history messages of a request extending an
earlier one reuse that one's messages and tool pairing, and equal what a build from
nothing gives, for any history (slot updates, unverified and repeated calls, forged
results, two streams interleaved) and any ``through``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.context import (
    Actor,
    AgentContextState,
    ContextAdded,
    LlmRequestRequested,
    RequestHeader,
    ToolCallResult,
    _item_memo,
    build_request,
    fold_context,
    tool_result_item,
)
from contextfold.context import request as req
from contextfold.events import Envelope, Event, EventMeta
from contextfold.testing import envelope
from contextfold.wire import NeutralRequest, ToolCall

HEADER = RequestHeader(transport="openai-chat", model="gpt-4o", max_tokens=512, content_limit=40)


class _Log:
    def __init__(self) -> None:
        self.envelopes: list[Envelope[Any]] = []
        self.request: int | None = None
        self._state = fold_context(())
        self._folded = 0

    def append(self, event: Event, actor: str = "agent") -> None:
        position = len(self.envelopes) + 1
        time = f"2026-01-01T00:00:00.{position:06d}+00:00"
        meta = EventMeta(event_id=f"ev-{position}", time=time, actor=actor)
        self.envelopes.append(envelope(event, position, meta=meta))

    def play(self, op: tuple[str, str | None, str, str]) -> None:
        kind, key, text, call_id = op
        if kind == "request":
            self.append(LlmRequestRequested(header=HEADER))
            self.request = len(self.envelopes)
        elif kind == "call":
            calls = (ToolCall(id=call_id, name="t"), ToolCall(id=f"{call_id}x", name="t"))
            agent = Actor(type="agent")
            self.append(
                ContextAdded(
                    role="assistant",
                    content=text,
                    actor=agent,
                    key=key,
                    tool_calls=calls[: 1 + len(text) % 2],
                    llm_request_offset=self.request,
                )
            )
        elif kind == "result":
            result = ToolCallResult(tool_call_id=call_id, name="t", content=text)
            self.append(result, actor="tool")
            self.append(tool_result_item(result), actor="tool")
        elif kind == "forged":
            forged = ContextAdded(
                role="developer", content=text, actor=Actor(type="tool"), tool_call_id=call_id
            )
            self.append(forged)
        else:
            self.append(ContextAdded(role=kind, content=text, key=key))

    def state(self) -> AgentContextState:
        """Folded on from the previous state, as the fold reader does: items stay the same
        objects from one state to the next."""
        self._state = fold_context(self.envelopes[self._folded :], self._state)
        self._folded = len(self.envelopes)
        return self._state


ops = st.lists(
    st.tuples(
        st.sampled_from(["request", "call", "result", "forged", "user", "developer", "system"]),
        st.sampled_from([None, None, "slot/a", "slot/b"]),
        st.text(max_size=60),
        st.sampled_from(["c1", "c2", "c3"]),
    ),
    max_size=40,
)


@contextmanager
def _nothing_built() -> Iterator[None]:
    """Build with an empty memo, and leave the memo as it was."""
    kept = _item_memo._MEMOS
    _item_memo._MEMOS = {}
    try:
        yield
    finally:
        _item_memo._MEMOS = kept


def _both(state: AgentContextState, through: int | None) -> tuple[Any, Any]:
    def build() -> NeutralRequest | str:
        try:
            return build_request(state, HEADER, through=through, timestamp="now")
        except Exception as exc:  # the same error either way
            return f"{type(exc).__name__}: {exc}"

    built = build()
    with _nothing_built():
        fresh = build()
    return built, fresh


@settings(max_examples=200, deadline=None)
@given(first=ops, second=ops, cut=st.integers(min_value=0, max_value=100))
def test_incremental_requests_equal_requests_built_from_nothing(
    first: list[tuple[str, str | None, str, str]],
    second: list[tuple[str, str | None, str, str]],
    cut: int,
) -> None:
    logs = (_Log(), _Log())
    for step in range(max(len(first), len(second))):
        for log, played in zip(logs, (first, second), strict=True):
            if step < len(played):
                log.play(played[step])
                state = log.state()
                built, fresh = _both(state, None)
                assert built == fresh
                through = cut % (len(log.envelopes) + 1) or None
                built, fresh = _both(state, through)
                assert built == fresh


def test_a_longer_history_builds_only_its_new_items() -> None:
    log = _Log()
    log.play(("request", None, "", ""))
    for n in range(30):
        log.play(("user", None, f"question {n}", ""))
        log.play(("call", None, "x", f"c{n}"))
        log.play(("result", None, "out", f"c{n}"))
    build_request(log.state(), HEADER)
    log.play(("user", None, "one more", ""))
    made: list[int] = []
    message = req._Pairing.message

    def counting(self: Any, item: Any, role: Any) -> Any:
        made.append(item.offset)
        return message(self, item, role)

    req._Pairing.message = counting  # type: ignore[method-assign]
    try:
        request = build_request(log.state(), HEADER)
    finally:
        req._Pairing.message = message  # type: ignore[method-assign]
    assert made == [len(log.envelopes)]  # only the new item went through the pairing
    with _nothing_built():
        assert build_request(log.state(), HEADER) == request
