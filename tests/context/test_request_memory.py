"""What a request is built and rendered from is memoized only while a state holds it: once
no state has an item (a compaction took it out, or its state was dropped), its rendered
text, messages and the histories built from it are collected with it, and requests built
afterwards equal requests built from nothing."""

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
    ContextAdded,
    LlmRequestRequested,
    RequestHeader,
    _item_memo,
    build_request,
    fold_context,
    summary_item,
)
from contextfold.events import Envelope, Event, EventMeta
from contextfold.testing import envelope
from contextfold.wire import render_request

HEADER = RequestHeader(transport="openai-chat", model="gpt-4o", max_tokens=512, content_limit=60)


def _envelope(event: Event, position: int) -> Envelope[Any]:
    meta = EventMeta(event_id=f"ev-{position}", time=f"2026-01-01T00:00:{position:02d}+00:00")
    return envelope(event, position, meta=meta)


def _session(turns: list[str], compact_at: int) -> list[AgentContextState]:
    """The state after each request of a session asking ``turns``, one request per turn;
    a summary replaces the history after turn ``compact_at``."""
    events: list[Envelope[Any]] = []
    states: list[AgentContextState] = []
    state = fold_context(())
    for turn, text in enumerate(turns):
        added: list[Event] = [ContextAdded(role="user", actor=Actor(type="user"), content=text)]
        added.append(LlmRequestRequested(header=HEADER if turn == 0 else None))
        if turn == compact_at + 1:
            added.insert(0, summary_item(f"summary of {compact_at + 1} turns", cutoff=len(events)))
        new = [_envelope(event, len(events) + i + 1) for i, event in enumerate(added)]
        events.extend(new)
        state = fold_context(new, state)
        states.append(state)
    return states


@settings(max_examples=40, deadline=None)
@given(
    turns=st.lists(st.text(max_size=80), min_size=2, max_size=12),
    compact=st.integers(min_value=0, max_value=10),
)
def test_items_no_state_holds_are_not_kept_by_the_memos(turns: list[str], compact: int) -> None:
    compact_at = compact % (len(turns) - 1)  # a later turn is summarized
    states = _session(turns, compact_at)
    bodies = [render_request(build_request(s), "openai-chat").body for s in states]
    early = [weakref.ref(item) for item in states[compact_at].history]
    newest = states[-1]
    assert not any(ref() in newest.history for ref in early)  # the summary replaced them
    del states
    gc.collect()
    assert [ref() for ref in early] == [None] * len(early)
    # The newest request is the same from its memos and from nothing.
    again = render_request(build_request(newest), "openai-chat").body
    assert again == bodies[-1]
    kept = _item_memo._MEMOS
    _item_memo._MEMOS = {}
    try:
        fresh = render_request(build_request(newest.model_copy(deep=True)), "openai-chat").body
    finally:
        _item_memo._MEMOS = kept
    assert fresh == again


def test_a_history_memo_holds_no_item_after_its_state_is_gone() -> None:
    states = _session([f"question {n}" for n in range(6)], compact_at=100)
    for state in states:  # each extends the one before: built from what is new
        build_request(state)
        build_request(state, through=state.request_offset)  # measures its span
    refs = [weakref.ref(item) for item in states[-1].history]
    del states, state
    gc.collect()
    assert [ref() for ref in refs] == [None] * len(refs)
