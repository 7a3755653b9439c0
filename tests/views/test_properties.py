"""Properties of views over random conversation states (of the worked example's fold) and
budgets: a step never loses a result, the summary is never dropped, only the oldest segments
go, and views (elide included) never change the fold's state."""

from __future__ import annotations

import math
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.examples.coding_assistant import (
    AssistantMessage,
    Conversation,
    ModelStep,
    StepEntry,
    ToolCall,
    ToolResult,
    UserPrompt,
)
from contextfold.testing import envelope


def shorten(data: Any) -> Any:
    if not isinstance(data, StepEntry):
        return data
    results = tuple(r.model_copy(update={"output": r.output[:5] + "…"}) for r in data.results)
    return data.model_copy(update={"results": results})


# Segment data of any kind of the example's fold (a union of models), summaries are text.
State = cf.SegmentedState[Any, str]

# -- random states -----------------------------------------------------------------------------

texts = st.text(alphabet="abcdefgh ", max_size=60)
event_specs = st.one_of(
    st.tuples(st.just("prompt"), texts),
    st.tuples(st.just("step"), st.integers(0, 4)),
    st.tuples(
        st.just("result"),
        st.integers(0, 15),
        st.integers(0, 4),
        st.text(alphabet="xyz", max_size=300),
    ),
    st.tuples(st.just("answer"), texts),
)


@st.composite
def states(draw: st.DrawFn) -> State:
    specs = draw(st.lists(event_specs, max_size=40))
    envelopes: list[cf.Envelope[Any]] = []
    steps = 0
    for position, spec in enumerate(specs, start=1):
        payload: cf.Event
        if spec[0] == "prompt":
            payload = UserPrompt(text=spec[1])
        elif spec[0] == "step":
            steps += 1
            calls = tuple(
                ToolCall(id=f"c{i}", name="f", arguments="{}") for i in range(cast(int, spec[1]))
            )
            payload = ModelStep(step_id=f"s{steps}", text="", tool_calls=calls)
        elif spec[0] == "result":
            _, step, call, output = cast(tuple[str, int, int, str], spec)
            payload = ToolResult(step_id=f"s{step}", call_id=f"c{call}", output=output)
        else:
            payload = AssistantMessage(text=spec[1])
        envelopes.append(envelope(payload, position))
    state = Conversation.apply_all(Conversation.initial_state(), envelopes)
    summary = draw(st.one_of(st.none(), texts))
    return cf.SegmentedState(state.segments, summary)


keep_froms = st.sampled_from(
    [None, cf.from_newest(Conversation, "user"), cf.newest(), cf.newest(3), cf.newest(0)]
)
budgets = st.one_of(
    st.floats(min_value=0.5, max_value=2000), st.integers(1, 2000), st.just(math.inf)
)


@st.composite
def views(draw: st.DrawFn) -> cf.ContextView[Any]:
    strategies: list[Any] = []
    if draw(st.booleans()):
        where = draw(st.sampled_from([None, lambda s: s.data.kind == "step"]))
        strategies.append(cf.elide(keep_newest=draw(st.integers(0, 5)), map=shorten, where=where))
    if draw(st.booleans()):
        strategies.append(cf.drop_oldest(keep_from=draw(keep_froms)))
    if draw(st.booleans()):
        strategies.append(cf.elide(keep_newest=0, map=shorten))
    return cf.ContextView(Conversation, strategies=strategies)


def snapshot(state: State) -> Any:
    return (state.summary, [(s.id, s.data.model_dump()) for s in state.segments])


PROPERTY = settings(max_examples=40, deadline=None)


@PROPERTY
@given(states(), views(), st.lists(budgets, min_size=1, max_size=4))
def test_views_never_split_a_step_from_its_results(
    state: State, view: cf.ContextView[Any], budget_list: list[float]
) -> None:
    by_id = {s.id: s for s in state.segments}
    assert len(by_id) == len(state.segments)  # ids are unique
    original_ids = [s.id for s in state.segments]
    for budget in budget_list:
        result = view(state, budget=budget)
        kept_ids = [s.id for s in result.state.segments]
        # Only whole, oldest segments go: what is kept is a run of the newest.
        assert kept_ids == original_ids[len(original_ids) - len(kept_ids) :]
        assert list(result.dropped) == original_ids[: len(original_ids) - len(kept_ids)]
        assert result.state.summary == state.summary  # never dropped
        for segment in result.state.segments:
            original = by_id[segment.id].data
            assert segment.data.kind == original.kind
            if isinstance(original, StepEntry):
                assert segment.data.tool_calls == original.tool_calls
                assert [r.call_id for r in segment.data.results] == [
                    r.call_id for r in original.results
                ]
        assert result.tokens >= 0
        assert result.over_budget == (result.tokens > budget)
        assert result.fits == (not result.over_budget and not result.dropped)


@PROPERTY
@given(states(), views(), st.lists(budgets, min_size=1, max_size=4))
def test_views_never_change_the_folds_state(
    state: State, view: cf.ContextView[Any], budget_list: list[float]
) -> None:
    before = snapshot(state)
    data_objects = [s.data for s in state.segments]
    segments = state.segments
    for budget in budget_list:
        view(state, budget=budget)
    view(state, budget=1)
    assert snapshot(state) == before
    assert state.segments is segments
    assert all(s.data is d for s, d in zip(state.segments, data_objects, strict=True))


@PROPERTY
@given(states(), budgets, st.integers(0, 5))
def test_elide_is_stable_across_calls(state: State, budget: float, keep: int) -> None:
    calls: list[str] = []

    def counting_shorten(data: Any) -> Any:
        calls.append("x")
        return shorten(data)

    view = cf.ContextView(
        Conversation, strategies=[cf.elide(keep_newest=keep, map=counting_shorten)]
    )
    first = view(state, budget=budget)
    second = view(state, budget=budget)
    assert first.state == second.state and first.tokens == second.tokens
    assert len(calls) <= max(0, len(state.segments) - keep)
