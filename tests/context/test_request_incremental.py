"""Requests are built from what is new: ``build(..., previous=built)`` reuses what an earlier
build made (messages, tool pairing, the lane, the measured span) and its request equals
``build_request`` from nothing, for any history (slot updates, unverified and repeated
calls, forged results, compactions, two streams interleaved), any ``through`` and any
change of header; rendering with ``previous`` gives the fresh bytes."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold.render  # noqa: F401  (registers the built-in renderers)
from contextfold.context import (
    Actor,
    AgentContextState,
    Built,
    ContextAdded,
    LlmRequestRequested,
    PrefixMessage,
    RequestHeader,
    ToolCallResult,
    build,
    build_request,
    fold_context,
    summary_item,
    tool_result_item,
)
from contextfold.events import Envelope, Event, EventMeta
from contextfold.testing import envelope
from contextfold.wire import RenderedRequest, ToolCall, render_request
from tests.context.helpers import count_item_builds

HEADER = RequestHeader(transport="openai-chat", model="gpt-4o", max_tokens=512, content_limit=40)

# Headers that each render some item differently from HEADER: a stale message of another
# one would show in the request.
HEADERS = (
    HEADER,
    HEADER.model_copy(update={"content_limit": None}),
    HEADER.model_copy(update={"layout": 2}),
    HEADER.model_copy(update={"developer_role": False}),
    HEADER.model_copy(update={"trusted_actor_types": ("ci",)}),
    HEADER.model_copy(update={"system_prompt": "Be brief."}),
    HEADER.model_copy(update={"session_prefix": (PrefixMessage(role="user", content="prefix"),)}),
    HEADER.model_copy(update={"transport": "openai-responses"}),
    HEADER.model_copy(update={"transport": "anthropic", "clock": "date"}),
)


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
        elif kind == "external":  # trusted only by a header listing its type
            self.append(ContextAdded(role="developer", content=text, actor=Actor(type="ci")))
        elif kind == "compact":  # a summary of the history through the latest request
            if self.request is not None:
                self.append(summary_item(f"summary {text}", cutoff=self.request))
        else:
            self.append(ContextAdded(role=kind, content=text, key=key))

    def state(self) -> AgentContextState:
        """Folded on from the previous state, as the fold reader does: items stay the same
        objects from one state to the next."""
        self._state = fold_context(self.envelopes[self._folded :], self._state)
        self._folded = len(self.envelopes)
        return self._state


def _ops(*more: str) -> st.SearchStrategy[list[tuple[str, str | None, str, str]]]:
    kinds = ["request", "call", "result", "forged", "user", "developer", "system", *more]
    return st.lists(
        st.tuples(
            st.sampled_from(kinds),
            st.sampled_from([None, None, "slot/a", "slot/b"]),
            st.text(max_size=60),
            st.sampled_from(["c1", "c2", "c3"]),
        ),
        max_size=40,
    )


ops = _ops()


def _outcome(function: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return function(*args, **kwargs)
    except Exception as exc:  # the same error either way
        return f"{type(exc).__name__}: {exc}"


@settings(max_examples=200, deadline=None)
@given(
    first=_ops("external", "compact"),
    second=_ops("external", "compact"),
    cuts=st.lists(st.integers(min_value=0, max_value=100), min_size=1, max_size=4),
    headers=st.lists(st.sampled_from(HEADERS), min_size=1, max_size=4),
    crossed=st.booleans(),
)
def test_requests_built_and_rendered_with_previous_equal_those_from_nothing(
    first: list[tuple[str, str | None, str, str]],
    second: list[tuple[str, str | None, str, str]],
    cuts: list[int],
    headers: list[RequestHeader],
    crossed: bool,
) -> None:
    logs = (_Log(), _Log())
    built: list[Built | None] = [None, None]
    rendered: list[RenderedRequest | None] = [None, None]
    turn = 0
    for step in range(max(len(first), len(second))):
        for n, (log, played) in enumerate(zip(logs, (first, second), strict=True)):
            if step >= len(played):
                continue
            log.play(played[step])
            state = log.state()
            turn += 1
            header = headers[turn % len(headers)]
            through = cuts[turn % len(cuts)] % (len(log.envelopes) + 1) or None
            # The previous build and body of this stream, or of the other one.
            mine = 1 - n if crossed and turn % 3 == 0 else n
            previous, before = built[mine], rendered[mine]

            options = {"through": through, "timestamp": "2026-02-03"}
            expected = _outcome(build_request, state, header, **options)
            got = _outcome(build, state, header, previous=previous, **options)
            assert (got.request if isinstance(got, Built) else got) == expected
            if not isinstance(got, Built):
                continue
            built[n] = got
            transport = header.transport
            body = _outcome(render_request, expected, transport)
            again = _outcome(render_request, got.request, transport, previous=before)
            assert again == body  # the same bytes, or the same error
            if isinstance(again, RenderedRequest):
                assert again.body == body.body
                rendered[n] = again


def _conversation(turns: int) -> _Log:
    log = _Log()
    log.play(("request", None, "", ""))
    for n in range(turns):
        log.play(("user", None, f"question {n}", ""))
        log.play(("call", None, "x", f"c{n}"))
        log.play(("result", None, "out", f"c{n}"))
    return log


def test_a_longer_history_builds_only_its_new_items(monkeypatch: Any) -> None:
    log = _conversation(30)
    first = build(log.state(), HEADER)
    log.play(("user", None, "one more", ""))
    made = count_item_builds(monkeypatch)
    second = build(log.state(), HEADER, previous=first)
    assert made == [len(log.envelopes)]  # only the new item went through the pairing
    third = build(log.state(), HEADER, through=len(log.envelopes), previous=second)
    assert made == [len(log.envelopes)]  # nothing new: nothing built
    assert third.request == second.request
    monkeypatch.undo()
    assert second.request == build_request(log.state(), HEADER)


def test_a_previous_build_with_another_header_is_not_used(monkeypatch: Any) -> None:
    log = _conversation(5)
    state = log.state()
    first = build(state, HEADER)
    made = count_item_builds(monkeypatch)
    longer = HEADER.model_copy(update={"content_limit": 400})
    again = build(state, longer, previous=first)
    assert len(made) == len(state.history)  # every item built again, with the new limit
    equal = build(state, HEADER.model_copy(), previous=first)  # an equal header is used
    assert len(made) == len(state.history)
    monkeypatch.undo()
    assert again.request == build_request(state, longer)
    assert equal.request == first.request


def test_building_keeps_nothing_once_the_builds_are_dropped() -> None:
    """No table outside the values: once no state or build holds an item, it is collected."""
    log = _conversation(6)
    built = None
    body = None
    for turn in range(4):
        log.play(("user", None, f"more {turn}", ""))
        built = build(log.state(), HEADER, through=log.request, previous=built)
        body = render_request(built.request, "openai-chat", previous=body)
    state = log.state()
    refs = [weakref.ref(item) for item in state.history]
    del log, built, body, state
    gc.collect()
    assert [ref() for ref in refs] == [None] * len(refs)
