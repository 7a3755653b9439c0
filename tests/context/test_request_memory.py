"""What building and rendering keep is held by their values only: a build passed on from
request to request holds the items its request was built from, so once a compaction took
items out, the builds and bodies after it no longer hold them; and requests built that way
equal requests built from nothing."""

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
    RequestHeader,
    build,
    build_request,
    fold_context,
    summary_item,
)
from contextfold.events import Envelope, Event, EventMeta
from contextfold.testing import envelope
from contextfold.wire import RenderedRequest, render_request

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
    through=st.booleans(),
)
def test_the_builds_after_a_compaction_hold_none_of_the_items_it_took_out(
    turns: list[str], compact: int, through: bool
) -> None:
    compact_at = compact % (len(turns) - 1)  # a later turn is summarized
    states = _session(turns, compact_at)
    built: Built | None = None
    rendered: RenderedRequest | None = None
    for number, state in enumerate(states):
        # A build with through measures the history's span, which is passed on too.
        cut = state.request_offset if through or number == compact_at else None
        built = build(state, through=cut, previous=built)
        rendered = render_request(built.request, "openai-chat", previous=rendered)
        assert built.request == build_request(state)
        assert rendered.body == render_request(build_request(state), "openai-chat").body
    early = [weakref.ref(item) for item in states[compact_at].history]
    newest = states[-1]
    assert not any(ref() in newest.history for ref in early)  # the summary replaced them
    del states, state
    gc.collect()
    assert [ref() for ref in early] == [None] * len(early)
    assert built is not None and built.request == build_request(newest.model_copy(deep=True))


def test_nothing_is_kept_once_the_states_and_builds_are_dropped() -> None:
    states = _session([f"question {n}" for n in range(6)], compact_at=100)
    built: Built | None = None
    rendered: RenderedRequest | None = None
    for state in states:  # each extends the one before: built from what is new
        built = build(state, previous=built)
        built = build(state, through=state.request_offset, previous=built)
        rendered = render_request(built.request, "openai-chat", previous=rendered)
        render_request(build_request(state), "anthropic")
    refs = [weakref.ref(item) for item in states[-1].history]
    del states, state, built, rendered
    gc.collect()
    assert [ref() for ref in refs] == [None] * len(refs)
